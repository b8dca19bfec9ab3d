"""One parser per kind of setting value, and the special tables' parsers ([keys], [pools]).

Each value parser takes the raw TOML (or flag) value and returns the value to
use, or raises ValueError with the problem; the caller names the source and
the key. The table parsers raise `ConfigError` naming the key themselves.
Reading key files and environment variables (`resolve_secrets`) happens here,
never in the engine.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratedeck.core.numbers import MAX_DURATION_S, number, parse_duration, parse_milliseconds, show, whole
from ratedeck.core.policy import Policy, PolicyError, parse_policy
from ratedeck.core.secrets import safe_url
from ratedeck.core.throttle import parse_throttle
from ratedeck.core.vocab import HeadroomMode
from ratedeck.engine.settings import ConfigError, KeySpec

Parser = Callable[[Any], Any]

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
MAX_IN_FLIGHT = 10_000
MAX_QUEUE = 1_000_000
MAX_ATTEMPTS = 1_000
MAX_CALLS = 1_000
MAX_POOL = 100_000
MAX_HEADROOM_MS = 60_000.0
MAX_TIMEOUT_S = 3600.0
MAX_PROBE_RATE = 100.0
MAX_COUNT = 1_000_000_000


#: A name shown in the console, the report, the log and Prometheus labels (an endpoint, a client).
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def label_name(value: Any, source: str, where: str) -> str:
    """`value` as a short name for labels; `ConfigError` at `where` when it is not one."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise ConfigError(
            source,
            where,
            f"must be a short name of letters, digits, '.', '_' or '-' (up to 32), got {show(value)}",
        )
    return value


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {show(value)}")
    return value


def nonempty(value: Any) -> str:
    out = text(value)
    if not out.strip():
        raise ValueError("must not be empty")
    if CONTROL.search(out):
        raise ValueError(f"must not contain control characters, got {show(out)}")
    return out


def path(value: Any) -> str:
    out = text(value)
    if not out.strip():
        raise ValueError("must be a file name, got an empty string")
    if "\x00" in out:
        raise ValueError(f"is not a usable file name: {show(out)}")
    return out


def path_or_off(value: Any) -> str:
    """A file name, or "" for none."""
    return "" if value == "" else path(value)


def results_id(value: Any) -> str:
    """The workload field a results line links by: `_id`, or a field that is not an underscore one."""
    out = nonempty(value)
    if out.startswith("_") and out != "_id":
        raise ValueError(f'must be "_id" or a line\'s own field (not starting with _), got {show(out)}')
    return out


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {show(value)}")
    return value


#: Headers that frame the request on the wire: the HTTP client writes them itself. A second
#: Host or a Content-Length that disagrees with the body makes the request invalid (RFC 9112:
#: a server must answer 400, a proxy may split it into two requests), so a user's is refused.
FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade", "trailer"}
)


def header_name(value: Any) -> str:
    out = text(value)
    if not _TOKEN.fullmatch(out):
        raise ValueError(f"is not an HTTP header name, got {show(out)}")
    if out.lower() in FRAMING_HEADERS:
        raise ValueError(f"{out} frames the request and is set by the HTTP client itself; remove it")
    return out


def choice(enum: type[StrEnum]) -> Parser:
    """One of `enum`'s values, as the enum member."""
    options = [str(o) for o in enum]

    def parse(value: Any) -> StrEnum:
        if not isinstance(value, str) or value not in options:
            listed = ", ".join(f"'{o}'" for o in options[:-1]) + f" or '{options[-1]}'"
            raise ValueError(f"must be {listed}, got {show(value)}")
        return enum(value)

    return parse


def method(value: Any) -> str:
    if not isinstance(value, str) or value.strip().upper() not in ("GET", "POST"):
        raise ValueError(f"must be GET or POST, got {show(value)}")
    return value.strip().upper()


def url(value: Any) -> str:
    out = text(value).strip()
    if not out.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, got {show(safe_url(out) or out[:8])}")
    if CONTROL.search(out) or " " in out:
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(out)
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a usable URL ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"names no host, got {show(safe_url(out))}")
    return out


def params(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f'must be a table like {{ lang = "en" }}, got {show(value)}')
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ValueError(f"{k}: must be a string or a number, got {show(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{k}: must be a finite number, got {show(v)}")
        out[str(k)] = str(v)
    return out


def key_format(value: Any) -> str:
    out = text(value)
    if out == "":
        return out  # the default: Bearer in Authorization, else the key as is
    if out.count("{key}") != 1 or CONTROL.search(out):
        raise ValueError(f'must hold {{key}} once, like "Bearer {{key}}", got {show(value)}')
    return out


def headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f'must be a table like {{ Accept = "application/json" }}, got {show(value)}')
    out = {}
    for k, v in value.items():
        name = header_name(k)
        if not isinstance(v, str) or CONTROL.search(v):
            raise ValueError(f"{name}: must be text on one line, got {show(v)}")
        out[name] = v
    return out


def header_line(line: str) -> tuple[str, str]:
    """`--header "Name: value"` as (name, value); raises ValueError naming the problem."""
    name, colon, value = str(line).partition(":")
    if not colon:
        raise ValueError(f'must be "Name: value", got {show(line)}')
    name, value = header_name(name.strip()), value.strip()
    if CONTROL.search(value):
        raise ValueError(f"{name}: the value must be on one line")
    return name, value


_SIGNING = ("binance", "kraken")


def signing(value: Any) -> str:
    out = text(value)
    if out in _SIGNING or re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", out):
        return out
    raise ValueError(f'must be "binance", "kraken" or a hook "module:function", got {show(value)}')


def headroom(value: Any) -> HeadroomMode | float:
    if isinstance(value, str) and value.strip().lower() == "adaptive":
        return HeadroomMode.ADAPTIVE
    try:
        return parse_milliseconds(value, high=MAX_HEADROOM_MS)
    except ValueError as exc:
        if isinstance(value, str) and not any(ch.isdigit() for ch in value):
            raise ValueError(f'must be "adaptive" or milliseconds, got {show(value)}') from None
        raise ValueError(str(exc)) from None


def throttle(value: Any) -> str | float:
    mode, rate = parse_throttle(value)
    return rate if mode == "fixed" and not isinstance(value, str) else value


def ms(high: float) -> Parser:
    return lambda v: parse_milliseconds(v, high=high)


def seconds(high: float = MAX_DURATION_S, *, allow_zero: bool = False) -> Parser:
    return lambda v: parse_duration(v, low=0.0, low_open=not allow_zero, high=high)


#: The largest cost cap a run takes, in US dollars.
MAX_DOLLARS = 1_000_000_000.0


def dollars(value: Any) -> float:
    """An amount of US dollars above 0: 25, 2.5, "2.50" or "$2.50"."""
    text = value.strip().removeprefix("$") if isinstance(value, str) else value
    return number(text, low=0.0, low_open=True, high=MAX_DOLLARS, unit="US dollars")


def count(low: int | None, high: int | None) -> Parser:
    return lambda v: whole(v, low=low, high=high)


MAX_PROCS = 256


def in_flight(value: Any) -> int | str:
    """Requests in flight per key: a whole number from 1 (pinned), or "auto" (rate x round trip)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return whole(value, low=1, high=MAX_IN_FLIGHT)
    except ValueError as exc:
        raise ValueError(f"{exc} (or 'auto': the key's rate times its round trip)") from None


def procs(value: Any) -> int | str:
    """Engine processes: a whole number from 1, or "auto" (one per core, counted when the run starts)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None:
        raise ValueError(f"expected a whole number of processes or 'auto', got {show(value)}")
    if n < 1:
        raise ValueError(f"must be at least 1, got {n}")
    if n > MAX_PROCS:
        raise ValueError(f"at most {MAX_PROCS} processes, got {n}")
    return n


def strings(what: str) -> Parser:
    def parse(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
            raise ValueError(f"must be a list of {what}, got {show(value)}")
        return tuple(value)

    return parse


def statuses(value: Any) -> tuple[int, ...]:
    """A list of HTTP statuses (100..599)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) and 100 <= x <= 599 for x in value
    ):
        raise ValueError(f"must be a list of HTTP statuses from 100 to 599, like [529], got {show(value)}")
    return tuple(value)


def cost_estimate(value: Any) -> str:
    """ "chars/4", or a hook "module:function" that can be imported now."""
    from ratedeck.engine.limits.costs import CHARS_4, load_hook

    out = nonempty(value)
    if out != CHARS_4:
        load_hook(out)
    return out


def keymap(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(x, str) for x in value.values()):
        raise ValueError('must be a table of action = "key" strings')
    return {str(k): x for k, x in value.items()}


# ---------------------------------------------------------------- [keys] and [pools]

KEYS_TABLE = ("secrets", "limits", "limits_by_key", "host_limits", "unit", "scope")


def keys(table: dict[str, Any], source: str, default_limits: tuple[str, ...]) -> tuple[KeySpec, ...]:
    """The [keys] table as keys, each secret resolved (literal, env:VAR or @FILE)."""
    for k in table:
        if k not in KEYS_TABLE:
            raise ConfigError(
                source,
                f"keys.{k}",
                "unknown setting; expected secrets, limits, limits_by_key, host_limits, unit or scope",
            )
    if table.get("unit", "requests") not in ("requests", "weight"):
        raise ConfigError(
            source, "keys.unit", f'must be "requests" or "weight", got {show(table.get("unit"))}'
        )
    if table.get("scope", "key") not in ("key", "key+model"):
        raise ConfigError(
            source, "keys.scope", f'must be "key" or "key+model", got {show(table.get("scope"))}'
        )
    raw = table.get("secrets", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise ConfigError(source, "keys.secrets", "must be a list of strings (literal, env:VAR or @FILE)")
    secrets: list[str] = []
    for i, item in enumerate(raw):
        secrets.extend(resolve_secrets(item, source, f"keys.secrets[{i}]"))
    if not secrets:
        raise ConfigError(source, "keys.secrets", "no API keys given; set keys.secrets or --keys")
    for i, secret in enumerate(secrets):
        if CONTROL.search(secret):
            raise ConfigError(source, "keys.secrets", f"key k{i + 1} contains a control character")
    pairs = [_key_and_secret(item) for item in secrets]
    secrets = [key for key, _ in pairs]
    if len(set(secrets)) != len(secrets):
        raise ConfigError(source, "keys.secrets", "the same key is listed twice")
    # No limit given (by a flag, the file or a preset): none is invented. The engine starts each
    # key cautiously and adopts what the server advertises (engine/limits/estimate.py).
    given = table.get("limits", list(default_limits))
    default = policies(given, source, "keys.limits") if given != [] else ()
    by_key = table.get("limits_by_key", {})
    if not isinstance(by_key, dict):
        raise ConfigError(source, "keys.limits_by_key", 'must be a table like k2 = ["10/1s"]')
    labels = [f"k{i + 1}" for i in range(len(secrets))]
    for label in by_key:
        if label not in labels:
            raise ConfigError(
                source, f"keys.limits_by_key.{label}", f"no such key; keys are k1..k{len(secrets)}"
            )
    return tuple(
        KeySpec(
            label,
            secret,
            policies(by_key[label], source, f"keys.limits_by_key.{label}") if label in by_key else default,
            api_secret,
        )
        for label, (secret, api_secret) in zip(labels, pairs, strict=True)
    )


def _key_and_secret(item: str) -> tuple[str, str | None]:
    """A key entry: "KEY", or "KEY SECRET" for APIs that sign requests with a secret."""
    parts = item.split()
    if len(parts) == 2:
        return parts[0], parts[1]
    return item, None


def pools(table: dict[str, Any], source: str) -> dict[str, int]:
    """[pools] name = capacity: connection pools a request can name."""
    out = {}
    for name, capacity in table.items():
        try:
            out[str(name)] = whole(capacity, low=1, high=MAX_POOL)
        except ValueError as exc:
            raise ConfigError(source, f"pools.{name}", f"a number of connections: {exc}") from None
    return out


def policies(value: Any, source: str, where: str) -> tuple[Policy, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(source, where, 'must be a list of limits like ["20/1s", "600/1m"]')
    try:
        return tuple(parse_policy(v) for v in value)
    except PolicyError as exc:
        raise ConfigError(source, where, str(exc)) from None


_MAX_KEY_FILE_BYTES = 10_000_000


def resolve_secrets(item: str, source: str, where: str) -> list[str]:
    """A literal key, `env:VAR` (comma-separated keys in it) or `@FILE` (one per line)."""
    item = item.strip()
    if item.startswith("env:"):
        var = item[4:]
        if not var or "=" in var or "\x00" in var:
            raise ConfigError(source, where, f"env: needs an environment variable name, got {show(item)}")
        value = os.environ.get(var)
        if not value or not value.strip():
            raise ConfigError(source, where, f"environment variable {var} is not set or empty")
        found = [s.strip() for s in value.split(",") if s.strip()]
        if not found:
            raise ConfigError(source, where, f"environment variable {var} holds no keys")
        return found
    if item.startswith("@"):
        file = Path(item[1:])
        try:
            if not file.is_file():
                problem = "is a directory" if file.is_dir() else "no such file"
                if file.exists() and not file.is_dir():
                    problem = "not a regular file"
                raise ConfigError(source, where, f"cannot read key file {file}: {problem}")
            if file.stat().st_size > _MAX_KEY_FILE_BYTES:
                raise ConfigError(source, where, f"key file {file} is too large to be a list of keys")
            lines = file.read_text(encoding="utf-8").splitlines()
        except ConfigError:
            raise
        except UnicodeDecodeError:
            raise ConfigError(source, where, f"key file {file} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(source, where, f"cannot read key file {file}: {exc.strerror or exc}") from None
        except ValueError:  # a NUL in the name
            raise ConfigError(source, where, f"cannot read key file {show(item[1:])}") from None
        found = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not found:
            raise ConfigError(source, where, f"key file {file} has no keys")
        return found
    if not item:
        raise ConfigError(source, where, "an empty key")
    return [item]
