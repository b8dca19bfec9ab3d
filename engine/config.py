"""Run configuration: dataclasses, TOML loading, presets and validation.

Precedence, lowest first: built-in defaults, `--preset`, the `--config` file,
command-line flags. Every problem is raised as a `ConfigError` that names the
source, the key and the value, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratedeck.core.errors import RatedeckError
from ratedeck.core.numbers import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_MS,
    MAX_RATE,
    SettingError,
    check_simulator_numbers,
    fraction,
    parse_duration,
    parse_milliseconds,
    parse_rate,
    show,
    whole,
)
from ratedeck.core.policy import Policy, PolicyError, format_policy, parse_policy
from ratedeck.core.secrets import redact, safe_url
from ratedeck.core.seed_server import SEED_KEYS
from ratedeck.core.throttle import parse_throttle

from .api_rules import (
    BudgetSpec,
    OutcomeRule,
    PathRule,
    budgets_to_toml,
    parse_budgets,
    parse_outcome_rules,
    parse_paths,
    paths_to_toml,
    rules_to_toml,
)


class ConfigError(RatedeckError, ValueError):
    """A setting that cannot be used; `str()` is the whole user-facing message."""

    def __init__(self, source: str, key: str, problem: str):
        self.source, self.key, self.problem = source, key, problem
        super().__init__(_one_line(f"{source}: {key}: {problem}"))


def _one_line(text: str) -> str:
    """`text` with every unprintable character escaped, so a message is always one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


@dataclass(frozen=True)
class TargetConfig:
    """Where requests go and how a key, nonce and request id travel.

    The defaults are neutral, for a target the user names with no preset: the
    key as `Authorization: Bearer <key>`, no nonce, no request id, only the
    parameters asked for, a 10 s timeout. The seed preset sets the seed
    server's conventions.
    """

    url: str | None = None  # None: start the embedded simulator
    method: str = "GET"
    key_param: str | None = None  # query/form parameter carrying the key
    key_header: str | None = "Authorization"  # or a header; wins over key_param when set
    key_format: str = (
        ""  # how the key is written in its header; "": "Bearer {key}" in Authorization, else as is
    )
    nonce_param: str | None = None  # a strictly increasing nonce parameter, for targets that check one
    id_param: str | None = None  # a request id parameter
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    user_agent: str = ""  # "": ratedeck/<version>
    signing: str | None = None  # "binance", "kraken" or "module:function" (see engine/signing.py)
    idempotency: bool = False  # an Idempotency-Key per logical request on POST, kept across retries
    rules: tuple[OutcomeRule, ...] = ()  # what answers mean beyond their status (see engine/api_rules.py)
    timeout_s: float = 10.0
    delay_field: str | None = None  # JSON path in error bodies holding a retry delay ("error.retryDelay")
    host_limit_match: str = "host"  # a 429 whose body says this closes the host-wide gate
    follow_redirects: bool = False  # follow 3xx to the same origin only; never sends the key elsewhere
    # A cheap, unlimited endpoint (like /health) timed for the network's spread; no key is sent.
    probe_url: str | None = None
    probe_rate: float = 10.0  # probes per second, on their own connection


@dataclass(frozen=True)
class KeySpec:
    """One API key: its id ("k1"), secret, and the policies that bind it."""

    label: str
    secret: str = field(repr=False)
    policies: tuple[Policy, ...]
    api_secret: str | None = field(default=None, repr=False)  # the signing secret that goes with the key


@dataclass(frozen=True)
class EngineConfig:
    """How the engine paces, retries and queues."""

    in_flight_per_key: int = 8
    headroom: str | float = "adaptive"  # "adaptive" or fixed milliseconds
    headroom_initial_ms: float = 100.0
    headroom_min_ms: float = 1.0  # timers and server stamps have about 1 ms grain
    headroom_max_ms: float = 500.0
    rejection_budget: int = 0  # 429s the user can afford while learning headroom
    pacing: str = "even"  # "even": spread sends across the window; "burst": window only
    max_attempts: int = 5
    backoff_base_ms: float = 50.0
    backoff_cap_ms: float = 2000.0
    queue_max: int = 50
    backpressure: bool = True
    ttl_s: float = 1.0
    drain_timeout_s: float = 2.0
    graveyard_path: str | None = "ratedeck-graveyard.jsonl"  # "" or None writes none
    learn_policy: bool = True  # adopt tighter limits the server advertises (RateLimit-Policy)


@dataclass(frozen=True)
class WorkloadConfig:
    """Where requests come from."""

    rate: float | None = None  # requests/s; None: the keys' total capacity
    arrival: str = "constant"  # or "poisson"
    file: str | None = None  # JSONL of requests (one object per line) instead of generating
    total: int | None = None  # stop generating after this many


@dataclass(frozen=True)
class MessagesConfig:
    """Messages that need several calls each, behind an entry throttle (see engine/multicall.py)."""

    calls: int = 1  # calls a message needs; it completes only when all succeed
    pattern: str = "parallel"  # or "sequential": each call after the previous one succeeded
    throttle: str | float = "off"  # "off", "auto" (live capacity / calls) or messages per second
    excess: str = "queue"  # what the throttle does with the rest: "queue", "shed" or "sample"
    sample_fraction: float = 1.0  # with excess = "sample": the fraction of arrivals processed
    shed_path: str | None = "ratedeck-shed.jsonl"  # one JSON line per shed message
    backlog_max: int = 1000  # messages queued at the entry before the source waits


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs. `keys` hold secrets: never print them."""

    target: TargetConfig = field(default_factory=TargetConfig)
    keys: tuple[KeySpec, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    server: dict[str, Any] = field(default_factory=dict)  # embedded simulator settings
    duration_s: float | None = None
    report: str | None = None
    plot: bool = False
    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    fail_on: tuple[str, ...] = ()  # [run] thresholds over the report ("rejected_429>0"): the runner's
    results: str | None = None  # [run] one JSON line per finished request
    results_body: bool = False  # [run] with the response body in each results line
    store: str = "memory"  # [run] memory, sqlite:PATH or redis://host:port/db (ratedeck.store)
    resume: bool = False  # --resume: take back the jobs a killed run held in the store
    preset: str | None = None
    key_sources: tuple[str, ...] = field(default=(), repr=False)  # as written: literal, env:VAR or @FILE
    host_policies: tuple[Policy, ...] = ()  # limits shared by all keys (one budget for the host)
    key_weighted: bool = False  # [keys] unit = "weight": a key's own limits count request weight
    budgets: tuple[BudgetSpec, ...] = ()  # [[budgets]]: named limits beyond each key's own
    paths: tuple[PathRule, ...] = ()  # [paths]: weight, budgets and signing per request path
    pools: dict[str, int] = field(default_factory=dict)  # connection pool name -> capacity
    messages: MessagesConfig | None = None  # [messages]: multi-call messages instead of requests

    @property
    def capacity_tps(self) -> float:
        """Requests per second all keys allow together (tightest policy per key, and the host's)."""
        total = sum(min(p.rate for p in k.policies) for k in self.keys if k.policies)
        if self.host_policies:
            total = min(total, min(p.rate for p in self.host_policies))
        return total

    @property
    def arrival_rate(self) -> float:
        """Requests per second to generate: the workload's rate, or the keys' capacity, at most `MAX_RATE`."""
        rate = self.workload.rate if self.workload.rate is not None else self.capacity_tps
        return min(rate, MAX_RATE)

    def __repr__(self) -> str:
        """The fields, with every form of every key masked (a key may hide in a URL or params)."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"RunConfig({shown})", [k.secret for k in self.keys])


# ---------------------------------------------------------------- presets

_SEED_PRESET: dict[str, dict[str, Any]] = {
    # Behaves like the seed's client setup, against the seed-compatible simulator.
    "seed": {
        "target": {
            "method": "GET",
            "key_param": "api_key",
            "key_header": "",
            "nonce_param": "nonce",
            "id_param": "req_id",
            "timeout_s": 1.0,
        },
        "keys": {"secrets": list(SEED_KEYS), "limits": ["20/1s"]},
        "engine": {"ttl_s": 1.0, "rejection_budget": 0, "queue_max": 50},
        # Just under what the keys carry (about 94/s against the seed server's jitter),
        # so the demo's queues stay healthy; `]` pushes it over.
        "workload": {"rate": 90.0},
        "server": {"mode": "seed"},
    },
}


#: The folder of real-API presets: one TOML file each, a `description` line and config tables.
PRESET_DIR = Path(__file__).parent / "presets"


def _load_presets() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every preset by name, and a line saying what each is (the files ship with the package)."""
    presets = dict(_SEED_PRESET)
    descriptions = {
        "seed": "the seed study's server: 5 keys x 20/1s, nonce, request id, 1 s TTL (the embedded demo)"
    }
    for path in sorted(PRESET_DIR.glob("*.toml")):
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        descriptions[path.stem] = str(data.pop("description", ""))
        presets[path.stem] = data
    return presets, descriptions


PRESETS, PRESET_DESCRIPTIONS = _load_presets()


# ---------------------------------------------------------------- loading


def load_config(
    path: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Build a `RunConfig` from a preset, a TOML file and flag overrides.

    With no target named (by a flag or the file) and no preset, the "seed"
    preset is the base, so the first run, and a first small config file, work
    against the embedded simulator. The seed preset's demo keys are never sent
    to a target the user named unless the user chose that preset: a target
    with no keys is a `ConfigError` ("no API keys given").
    """
    data: dict[str, Any] = {}
    file_data = read_toml(path) if path is not None else {}
    if preset is None:
        preset = file_data.pop("preset", None)
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(str(path), "preset", f'must be a preset name like "seed", got {show(preset)}')
    else:
        file_data.pop("preset", None)
    named_target = isinstance(overrides, dict) and bool((overrides.get("target") or {}).get("url"))
    file_target = file_data.get("target")
    file_names_target = isinstance(file_target, dict) and bool(file_target.get("url"))
    # With no target named (by a flag or the file), the seed preset drives the
    # embedded simulator, under whatever the file sets; a target the user names
    # with no preset gets the neutral defaults instead (no nonce, no request id,
    # the key as a Bearer token), never the seed server's ways.
    implicit = preset is None and not named_target and not file_names_target
    if implicit:
        preset = "seed"
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ConfigError(
                "--preset", "preset", f"unknown preset {show(preset)}; known: {', '.join(PRESETS)}"
            )
        _merge(data, PRESETS[preset])
    source = "command line"
    if path is not None:
        source = str(path)
        _merge(data, file_data)
    if overrides:
        if not isinstance(overrides, dict):
            raise ConfigError("command line", "overrides", f"must be a table, got {show(overrides)}")
        _merge(data, overrides)
    if named_target and not (data.get("keys") or {}).get("secrets"):
        raise ConfigError(
            "command line",
            "--keys",
            f"no API keys given for {safe_url(data['target']['url'])}; pass --keys "
            "(the seed demo keys are only for the embedded simulator or --preset seed)",
        )
    cfg = build_config(data, source)
    return replace(cfg, preset=preset)


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file, turning every failure into a `ConfigError`."""
    try:
        p = Path(path)
        shown = str(p)
    except (TypeError, ValueError):
        raise ConfigError(show(path), "file", "is not a file name") from None
    try:
        if p.is_dir():
            raise ConfigError(shown, "file", "is a directory, not a TOML file")
        if p.exists() and not p.is_file():
            raise ConfigError(shown, "file", "is not a regular file")
        if p.exists() and p.stat().st_size > _MAX_FILE_BYTES:
            raise ConfigError(
                shown, "file", f"is larger than {_MAX_FILE_BYTES // 1_000_000} MB; not a config"
            )
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(shown, "file", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(shown, "file", "is a directory, not a TOML file") from None
    except PermissionError:
        raise ConfigError(shown, "file", "permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, "file", f"not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(shown, "file", "not valid UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(shown, "file", f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the name
        raise ConfigError(shown, "file", f"cannot read: {exc}") from None


_MAX_FILE_BYTES = 10_000_000


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Deep-merge `new` into `into`, copying so the sources (presets) never change."""
    for k, v in new.items():
        if isinstance(v, dict):
            if not isinstance(into.get(k), dict):
                into[k] = {}
            _merge(into[k], v)
        elif isinstance(v, list):
            into[k] = list(v)
        else:
            into[k] = v


_SECTIONS = {
    "preset",
    "target",
    "keys",
    "engine",
    "workload",
    "server",
    "run",
    "console",
    "messages",
    "pools",
    "budgets",
    "paths",
}

# ---------------------------------------------------------------- field rules
#
# One parser per setting that is not a plain string or bool: each takes the raw
# TOML (or flag) value and returns the value to use, or raises ValueError with
# the problem; the caller names the source and the key.

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_MAX_IN_FLIGHT = 10_000
_MAX_QUEUE = 1_000_000
_MAX_ATTEMPTS = 1_000
_MAX_CALLS = 1_000
_MAX_POOL = 100_000
_MAX_HEADROOM_MS = 60_000.0
_MAX_TIMEOUT_S = 3600.0


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {show(value)}")
    return value


def _nonempty(value: Any) -> str:
    text = _text(value)
    if not text.strip():
        raise ValueError("must not be empty")
    if _CONTROL.search(text):
        raise ValueError(f"must not contain control characters, got {show(text)}")
    return text


def _path(value: Any) -> str:
    text = _text(value)
    if not text.strip():
        raise ValueError("must be a file name, got an empty string")
    if "\x00" in text:
        raise ValueError(f"is not a usable file name: {show(text)}")
    return text


def _path_or_off(value: Any) -> str:
    """A file name, or "" for none."""
    return "" if value == "" else _path(value)


def _header_name(value: Any) -> str:
    text = _text(value)
    if not _TOKEN.fullmatch(text):
        raise ValueError(f"is not an HTTP header name, got {show(text)}")
    return text


def _choice(*options: str):
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            listed = ", ".join(f"'{o}'" for o in options[:-1]) + f" or '{options[-1]}'"
            raise ValueError(f"must be {listed}, got {show(value)}")
        return value

    return parse


def _method(value: Any) -> str:
    if not isinstance(value, str) or value.strip().upper() not in ("GET", "POST"):
        raise ValueError(f"must be GET or POST, got {show(value)}")
    return value.strip().upper()


def _url(value: Any) -> str:
    text = _text(value).strip()
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, got {show(safe_url(text) or text[:8])}")
    if _CONTROL.search(text) or " " in text:
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a usable URL ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"names no host, got {show(safe_url(text))}")
    return text


def _params(value: Any) -> dict[str, str]:
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


def _key_format(value: Any) -> str:
    text = _text(value)
    if text == "":
        return text  # the default: Bearer in Authorization, else the key as is
    if text.count("{key}") != 1 or _CONTROL.search(text):
        raise ValueError(f'must hold {{key}} once, like "Bearer {{key}}", got {show(value)}')
    return text


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f'must be a table like {{ Accept = "application/json" }}, got {show(value)}')
    out = {}
    for k, v in value.items():
        name = _header_name(k)
        if not isinstance(v, str) or _CONTROL.search(v):
            raise ValueError(f"{name}: must be text on one line, got {show(v)}")
        out[name] = v
    return out


def header_line(text: str) -> tuple[str, str]:
    """`--header "Name: value"` as (name, value); raises ValueError naming the problem."""
    name, colon, value = str(text).partition(":")
    if not colon:
        raise ValueError(f'must be "Name: value", got {show(text)}')
    name, value = _header_name(name.strip()), value.strip()
    if _CONTROL.search(value):
        raise ValueError(f"{name}: the value must be on one line")
    return name, value


_SIGNING = ("binance", "kraken")


def _signing(value: Any) -> str:
    text = _text(value)
    if text in _SIGNING or re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", text):
        return text
    raise ValueError(f'must be "binance", "kraken" or a hook "module:function", got {show(value)}')


def _headroom(value: Any) -> str | float:
    if isinstance(value, str) and value.strip().lower() == "adaptive":
        return "adaptive"
    try:
        return parse_milliseconds(value, high=_MAX_HEADROOM_MS)
    except ValueError as exc:
        if isinstance(value, str) and not any(ch.isdigit() for ch in value):
            raise ValueError(f'must be "adaptive" or milliseconds, got {show(value)}') from None
        raise ValueError(str(exc)) from None


def _throttle(value: Any) -> str | float:
    mode, rate = parse_throttle(value)
    return rate if mode == "fixed" and not isinstance(value, str) else value


def _ms(high: float):
    return lambda v: parse_milliseconds(v, high=high)


def _seconds(high: float = MAX_DURATION_S, *, allow_zero: bool = False):
    return lambda v: parse_duration(v, low=0.0, low_open=not allow_zero, high=high)


def _count(low: int, high: int):
    return lambda v: whole(v, low=low, high=high)


_RULES: dict[str, Any] = {
    "target.url": _url,
    "target.method": _method,
    "target.key_param": _nonempty,
    "target.key_header": _header_name,
    "target.nonce_param": _nonempty,
    "target.id_param": _nonempty,
    "target.params": _params,
    "target.timeout_s": _seconds(_MAX_TIMEOUT_S),
    "target.delay_field": _nonempty,
    "target.host_limit_match": _nonempty,
    "target.probe_url": _url,
    "target.key_format": lambda v: _key_format(v),
    "target.headers": lambda v: _headers(v),
    "target.user_agent": _text,
    "target.signing": lambda v: _signing(v),
    "target.rules": parse_outcome_rules,
    "target.probe_rate": lambda v: parse_rate(v, allow_zero=False, high=_MAX_PROBE_RATE),
    "engine.in_flight_per_key": _count(1, _MAX_IN_FLIGHT),
    "engine.headroom": _headroom,
    "engine.headroom_initial_ms": _ms(_MAX_HEADROOM_MS),
    "engine.headroom_min_ms": _ms(_MAX_HEADROOM_MS),
    "engine.headroom_max_ms": _ms(_MAX_HEADROOM_MS),
    "engine.rejection_budget": _count(0, MAX_COUNT),
    "engine.pacing": _choice("even", "burst"),
    "engine.max_attempts": _count(1, _MAX_ATTEMPTS),
    "engine.backoff_base_ms": _ms(MAX_MS),
    "engine.backoff_cap_ms": _ms(MAX_MS),
    "engine.queue_max": _count(1, _MAX_QUEUE),
    "engine.ttl_s": _seconds(),
    "engine.drain_timeout_s": _seconds(_MAX_TIMEOUT_S, allow_zero=True),
    "engine.graveyard_path": _path_or_off,
    "workload.rate": lambda v: parse_rate(v, allow_zero=True),
    "workload.arrival": _choice("constant", "poisson"),
    "workload.file": _path,
    "workload.total": _count(0, MAX_COUNT),
    "messages.calls": _count(1, _MAX_CALLS),
    "messages.pattern": _choice("parallel", "sequential"),
    "messages.throttle": _throttle,
    "messages.excess": _choice("queue", "shed", "sample"),
    "messages.sample_fraction": fraction,
    "messages.shed_path": _path,
    "messages.backlog_max": _count(1, _MAX_QUEUE),
}


def parse_setting(key: str, value: Any) -> Any:
    """One setting ("engine.ttl_s", "run.duration_s", ...) checked as the config file checks it.

    For flags that set one config value: the same parser, range and message.
    Raises ValueError with the problem; the caller names the flag.
    """
    section, _, name = key.partition(".")
    rule = _RULES.get(key) or {"run": _RUN_RULES, "console": _CONSOLE_RULES}.get(section, {}).get(name)
    if rule is None:
        raise KeyError(key)
    return rule(value)


def build_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a plain dict (as read from TOML) into a `RunConfig`.

    Any value of any type in any field gives a `RunConfig` or one `ConfigError`.
    """
    if not isinstance(data, dict):
        raise ConfigError(source, "config", f"must be a table, got {show(data)}")
    for name in data:
        if name not in _SECTIONS:
            raise ConfigError(
                source, str(name), f"unknown section; expected one of {', '.join(sorted(_SECTIONS))}"
            )
        if name in ("preset", "budgets"):  # [[budgets]] is a list of tables
            continue
        if not isinstance(data[name], dict):
            raise ConfigError(source, name, "must be a table, like [" + name + "]")
    v = _Validator(source)
    target = v.dataclass_from(TargetConfig, data.get("target", {}), "target")
    if not target.key_header and not target.key_param:
        raise ConfigError(source, "target", "set key_param or key_header so the key reaches the server")
    _check_probe(target, source)
    if target.url and target.key_header and target.key_header.lower() == "authorization":
        creds = urlsplit(target.url)
        if creds.username or creds.password:
            raise ConfigError(
                source,
                "target.url",
                "carries user:password and the key goes in the Authorization header; "
                "use one (--key-header/--key-param to send the key elsewhere)",
            )
    engine = v.dataclass_from(EngineConfig, data.get("engine", {}), "engine")
    _check_engine(engine, source)
    workload = v.dataclass_from(WorkloadConfig, data.get("workload", {}), "workload")
    if workload.file is not None and not _is_file(workload.file):
        raise ConfigError(source, "workload.file", f"no such file: {workload.file}")
    keys_table = data.get("keys", {})
    keys = _keys(keys_table, source)
    key_sources = keys_table.get("secrets", [])
    key_sources = (key_sources,) if isinstance(key_sources, str) else tuple(key_sources)
    run = v.table(data.get("run", {}), "run", _RUN_RULES)
    console = v.table(data.get("console", {}), "console", _CONSOLE_RULES)
    server = data.get("server", {})
    try:
        check_simulator_numbers(server)
    except SettingError as exc:
        raise ConfigError(source, f"server.{exc.name}", exc.problem) from None
    host_policies: tuple[Policy, ...] = ()
    if "host_limits" in keys_table and keys_table["host_limits"] != []:
        host_policies = _policies(keys_table["host_limits"], source, "keys.host_limits")
    pools = _pools(data.get("pools", {}), source)
    try:
        budgets = parse_budgets(data.get("budgets", []))
    except ValueError as exc:
        raise ConfigError(source, "budgets", str(exc)) from None
    try:
        paths = parse_paths(data.get("paths", {}), {b.name for b in budgets})
    except ValueError as exc:
        raise ConfigError(source, "paths", str(exc)) from None
    _check_signing(target, keys, source)
    messages = None
    if "messages" in data:
        messages = v.dataclass_from(MessagesConfig, data["messages"], "messages")
    return RunConfig(
        target=target,
        keys=keys,
        engine=engine,
        workload=workload,
        server=dict(server),
        duration_s=run.get("duration_s"),
        report=run.get("report"),
        plot=run.get("plot", False),
        theme=console.get("theme"),
        keymap=console.get("keymap", {}),
        seed=run.get("seed"),
        fail_on=run.get("fail_on", ()),
        results=run.get("results"),
        results_body=run.get("results_body", False),
        store=run.get("store", "memory"),
        resume=run.get("resume", False),
        key_sources=key_sources,
        messages=messages,
        host_policies=host_policies,
        key_weighted=keys_table.get("unit") == "weight",
        budgets=budgets,
        paths=paths,
        pools=pools,
    )


def _check_signing(target: TargetConfig, keys: tuple[KeySpec, ...], source: str) -> None:
    """A signing recipe needs a secret with every key ("KEY SECRET" lines)."""
    if target.signing is None:
        return
    missing = [k.label for k in keys if not k.api_secret]
    if missing:
        raise ConfigError(
            source,
            "keys.secrets",
            f'signing {target.signing!r} needs a secret with every key (write "KEY SECRET"); '
            f"{', '.join(missing[:5])} {'has' if len(missing) == 1 else 'have'} none",
        )


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {show(value)}")
    return value


def _keymap(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(x, str) for x in value.values()):
        raise ValueError('must be a table of action = "key" strings')
    return {str(k): x for k, x in value.items()}


def _optional(parse):
    """An empty string switches an optional setting off."""
    return lambda value: None if value == "" else parse(value)


_RUN_RULES = {
    "duration_s": _optional(_seconds()),
    "report": _optional(_path),
    "plot": _bool,
    "seed": lambda v: whole(v, low=None, high=None),
    "fail_on": lambda v: _strings(v, 'threshold expressions like "rejected_429>0"'),
    "results": _optional(_path),
    "results_body": _bool,
    "store": _path,
    "resume": _bool,
}


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"must be a list of {what}, got {show(value)}")
    return tuple(value)


_CONSOLE_RULES = {"theme": _optional(_nonempty), "keymap": _keymap}


_MAX_PROBE_RATE = 100.0


def _check_probe(t: TargetConfig, source: str) -> None:
    """A probe never goes to the rate-limited path: it would spend the budget it measures for."""
    if t.probe_url is None or t.url is None:
        return
    probe, target = urlsplit(t.probe_url), urlsplit(t.url)
    same = (probe.scheme, probe.hostname, probe.port, probe.path.rstrip("/")) == (
        target.scheme,
        target.hostname,
        target.port,
        target.path.rstrip("/"),
    )
    if same:
        raise ConfigError(
            source,
            "target.probe_url",
            "is the rate-limited target itself; give a cheap endpoint that costs nothing, like /health",
        )


def _check_engine(e: EngineConfig, source: str) -> None:
    if not e.headroom_min_ms <= e.headroom_initial_ms <= e.headroom_max_ms:
        raise ConfigError(
            source,
            "engine.headroom_initial_ms",
            "need headroom_min_ms <= headroom_initial_ms <= headroom_max_ms, got "
            f"{e.headroom_min_ms:g}, {e.headroom_initial_ms:g} and {e.headroom_max_ms:g}",
        )
    if e.backoff_cap_ms < e.backoff_base_ms:
        raise ConfigError(
            source,
            "engine.backoff_cap_ms",
            f"need backoff_base_ms <= backoff_cap_ms, got {e.backoff_base_ms:g} and {e.backoff_cap_ms:g}",
        )


class _Validator:
    """Turns a TOML table into a dataclass, checking names, types and ranges."""

    def __init__(self, source: str):
        self.source = source

    def dataclass_from(self, cls, table: dict[str, Any], section: str):
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in table.items():
            if name not in known:
                raise ConfigError(
                    self.source, f"{section}.{name}", f"unknown setting; known: {', '.join(known)}"
                )
            values[name] = self._coerce(known[name], value, f"{section}.{name}")
        return cls(**values)

    def table(self, table: dict[str, Any], section: str, rules: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in table.items():
            if name not in rules:
                expected = ", ".join(rules)
                raise ConfigError(self.source, f"{section}.{name}", f"unknown setting; expected {expected}")
            try:
                out[name] = rules[name](value)
            except ValueError as exc:
                raise ConfigError(self.source, f"{section}.{name}", str(exc)) from None
        return out

    def _coerce(self, f, value, where: str):
        kind = str(f.type)
        if value == "" and "None" in kind:
            return None  # an empty string switches an optional setting off
        rule = _RULES.get(where)
        try:
            if rule is not None:
                return rule(value)
            if isinstance(f.default, bool) or kind == "bool":
                return _bool(value)
            return _text(value)
        except ValueError as exc:
            raise ConfigError(self.source, where, str(exc)) from None


def _keys(table: dict[str, Any], source: str) -> tuple[KeySpec, ...]:
    for k in table:
        if k not in ("secrets", "limits", "limits_by_key", "host_limits", "unit"):
            raise ConfigError(
                source,
                f"keys.{k}",
                "unknown setting; expected secrets, limits, limits_by_key, host_limits or unit",
            )
    if table.get("unit", "requests") not in ("requests", "weight"):
        raise ConfigError(
            source, "keys.unit", f'must be "requests" or "weight", got {show(table.get("unit"))}'
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
        if _CONTROL.search(secret):
            raise ConfigError(source, "keys.secrets", f"key k{i + 1} contains a control character")
    pairs = [_key_and_secret(item) for item in secrets]
    secrets = [key for key, _ in pairs]
    if len(set(secrets)) != len(secrets):
        raise ConfigError(source, "keys.secrets", "the same key is listed twice")
    default = _policies(table.get("limits", ["20/1s"]), source, "keys.limits")
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
            _policies(by_key[label], source, f"keys.limits_by_key.{label}") if label in by_key else default,
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


def _pools(table: dict[str, Any], source: str) -> dict[str, int]:
    """[pools] name = capacity: connection pools a request can name."""
    pools = {}
    for name, capacity in table.items():
        try:
            pools[str(name)] = whole(capacity, low=1, high=_MAX_POOL)
        except ValueError as exc:
            raise ConfigError(source, f"pools.{name}", f"a number of connections: {exc}") from None
    return pools


def _policies(value: Any, source: str, where: str) -> tuple[Policy, ...]:
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
        keys = [s.strip() for s in value.split(",") if s.strip()]
        if not keys:
            raise ConfigError(source, where, f"environment variable {var} holds no keys")
        return keys
    if item.startswith("@"):
        path = Path(item[1:])
        try:
            if not path.is_file():
                problem = "is a directory" if path.is_dir() else "no such file"
                if path.exists() and not path.is_dir():
                    problem = "not a regular file"
                raise ConfigError(source, where, f"cannot read key file {path}: {problem}")
            if path.stat().st_size > _MAX_KEY_FILE_BYTES:
                raise ConfigError(source, where, f"key file {path} is too large to be a list of keys")
            lines = path.read_text(encoding="utf-8").splitlines()
        except ConfigError:
            raise
        except UnicodeDecodeError:
            raise ConfigError(source, where, f"key file {path} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(source, where, f"cannot read key file {path}: {exc.strerror or exc}") from None
        except ValueError:  # a NUL in the name
            raise ConfigError(source, where, f"cannot read key file {show(item[1:])}") from None
        keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not keys:
            raise ConfigError(source, where, f"key file {path} has no keys")
        return keys
    if not item:
        raise ConfigError(source, where, "an empty key")
    return [item]


# ---------------------------------------------------------------- saving


def _section(obj: Any) -> dict[str, Any]:
    """A dataclass as a TOML table that loads back to the same values.

    TOML has no null: an optional setting that is off is left out when off is
    its default, and written as "" (which switches it off) when it is not, so
    a saved `nonce_param = None` never comes back as "nonce".
    """
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            if f.default is not None:
                out[f.name] = ""
            continue
        out[f.name] = dict(value) if isinstance(value, dict) else value
    return out


def to_toml_dict(cfg: RunConfig, *, include_secrets: bool = False) -> dict[str, Any]:
    """The effective config as a TOML-ready dict that `load_config` reads back to the same settings.

    Keys given as `env:VAR` or `@FILE` are saved as written; literal keys are
    saved as `env:RATEDECK_KEYS` unless `include_secrets`, so a saved profile
    never leaks a key. A run on a preset's keys saves `preset = NAME` instead.
    Limits are written exactly (`1/1.0005s`), never rounded.
    """
    default = cfg.keys[0].policies if cfg.keys else ()
    preset_keys = PRESETS.get(cfg.preset or "", {}).get("keys", {}).get("secrets")
    if include_secrets:
        secrets = [k.secret for k in cfg.keys]
    elif preset_keys is not None and list(cfg.key_sources) == list(preset_keys):
        secrets = None  # the preset supplies them
    elif cfg.key_sources and all(s.strip().startswith(("env:", "@")) for s in cfg.key_sources):
        secrets = list(cfg.key_sources)
    else:
        secrets = ["env:RATEDECK_KEYS"]
    keys: dict[str, Any] = {"limits": [format_policy(p) for p in default]}
    if cfg.key_weighted:
        keys["unit"] = "weight"
    if secrets is not None:
        keys["secrets"] = secrets
    by_key = {k.label: [format_policy(p) for p in k.policies] for k in cfg.keys if k.policies != default}
    if by_key:
        keys["limits_by_key"] = by_key
    if cfg.host_policies:
        keys["host_limits"] = [format_policy(p) for p in cfg.host_policies]
    out: dict[str, Any] = {"preset": cfg.preset} if cfg.preset else {}
    target = _section(cfg.target)
    if cfg.target.rules:
        target["rules"] = rules_to_toml(cfg.target.rules)
    else:
        target.pop("rules", None)
    out |= {
        "target": target,
        "keys": keys,
        "engine": _section(cfg.engine),
        "workload": _section(cfg.workload),
    }
    if cfg.server:
        out["server"] = dict(cfg.server)
    if cfg.pools:
        out["pools"] = dict(cfg.pools)
    if cfg.budgets:
        out["budgets"] = budgets_to_toml(cfg.budgets)
    if cfg.paths:
        out["paths"] = paths_to_toml(cfg.paths)
    run = {
        k: v
        for k, v in (
            ("duration_s", cfg.duration_s),
            ("report", cfg.report),
            ("plot", cfg.plot),
            ("seed", cfg.seed),
            ("fail_on", list(cfg.fail_on) or None),
            ("results", cfg.results),
            ("results_body", cfg.results_body or None),
            ("store", cfg.store if cfg.store != "memory" else None),
        )
        if v is not None
    }
    if run:
        out["run"] = run
    console = {k: v for k, v in (("theme", cfg.theme), ("keymap", cfg.keymap or None)) if v is not None}
    if console:
        out["console"] = console
    if cfg.messages is not None:
        out["messages"] = _section(cfg.messages)
    return out
