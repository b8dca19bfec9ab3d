"""Reading the server from a response: how long to wait, what its policy is, what it has counted.

Sources, first found wins for the delay: Retry-After (seconds or an HTTP
date), the IETF RateLimit field (`"name";r=0;t=5`: no quota left, resets in
5 s; also the draft-07 `limit=10, remaining=0, reset=5` form),
RateLimit-Remaining / RateLimit-Reset (drafts up to 06) and
X-RateLimit-Remaining / X-RateLimit-Reset (seconds, or an epoch time when it
is that large) when the remaining count is 0, and a user hook for APIs that
put the delay in the body. RateLimit-Policy is read as the server's own
statement of its policies, in every draft's form: `"a";q=20;w=1` (draft 09+),
`a;q=20;w=1` (draft 08) and `20;w=1` (drafts 03-07).

The server's own count (`read_quotas`) comes from X-RateLimit-Limit /
Remaining / Used / Reset / Resource (GitHub and most APIs), RateLimit-Limit /
Remaining / Reset (IETF drafts up to 06), `RateLimit: "name";r=..;t=..` with
`RateLimit-Policy` (drafts 07+), and Binance's X-MBX-USED-WEIGHT-<n><unit>
and X-MBX-ORDER-COUNT-<n><unit>, and LLM APIs' per-unit buckets: OpenAI's
x-ratelimit-{limit,remaining,reset}-{requests,tokens} (resets as durations,
`6m0s`, `1.4s`, `12ms`) and Anthropic's anthropic-ratelimit-{requests,
input-tokens,output-tokens}-{limit,remaining,reset} (resets as RFC 3339 times).
Those are `Quota.follow`: the server's bucket, to be followed both ways.

Every parser here takes any text and returns a value or None (an empty tuple
for policies); none raises. A delay is never negative or NaN, and never
longer than `MAX_DELAY_S` (one hour): a server asking for more (`Retry-After:
1e308`, a date next year) gets the cap, so one bad header cannot silence a key
for the rest of a run.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from ratedeck.core.numbers import parse_duration
from ratedeck.core.policy import MAX_LIMIT, MAX_WINDOW_S, MIN_WINDOW_S, Policy

# A hook gets (status, headers, body text) and returns seconds to wait, or None.
DelayHook = Callable[[int, Mapping[str, str], str], "float | None"]

#: The longest delay any server-sent value may impose (seconds); longer ones are cut to it.
MAX_DELAY_S = 3600.0
_EPOCH_THRESHOLD = 1e9  # X-RateLimit-Reset above this is a Unix time, not a delta
_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*", re.ASCII)


def _number(text: Any) -> float | None:
    """A finite float from numeric text ("7", "2.5", "1e3"); None for anything else."""
    if not isinstance(text, str) or len(text) > 400:
        return None
    digits = text.replace(".", "", 1)
    if digits.isascii() and digits.isdigit():  # "99", "1.000", "0.2": most counts and times
        return float(text)
    match = _NUMBER.fullmatch(text)
    if not match:
        return None
    value = float(match.group(1))
    return value if not math.isnan(value) else None


#: `_number` for the texts servers repeat answer after answer (a window's reset, as a
#: length or an epoch time): one look-up instead of a parse.
_number_of = lru_cache(maxsize=1024)(_number)


def _delay(seconds: float | None) -> float | None:
    """A usable delay: None for NaN or negative, at most `MAX_DELAY_S`."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return None
    return min(float(seconds), MAX_DELAY_S)


def parse_retry_after(value: str | None, now_wall: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None if absent or bad."""
    if not value or not isinstance(value, str):
        return None
    seconds = _number(value)
    if seconds is not None:
        return _delay(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
        if when is None:
            return None
        now_wall = time.time() if now_wall is None else now_wall
        return _delay(max(0.0, when.timestamp() - now_wall))
    except (TypeError, ValueError, IndexError, OverflowError, OSError, AttributeError):
        return None


def _split(text: str, sep: str) -> list[str]:
    """Split on `sep` outside double-quoted strings (a structured field's quoting)."""
    if '"' not in text:
        return text.split(sep)  # nothing quoted: the common case, without a walk
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def _members(header: str) -> list[tuple[str, str | None, dict[str, float]]]:
    """A structured-field list or dictionary as (name, value, numeric parameters) per member.

    `"a";q=20;w=1` -> ('"a"', None, {q: 20, w: 1}); `20;w=1` -> ('20', None, {w: 1});
    `reset=5` -> ('reset', '5', {}). Parameters whose value is not a number are dropped.
    """
    out = []
    for member in _split(header, ","):
        pieces = _split(member, ";")
        head = pieces[0].strip()
        name, value = head, None
        if "=" in head and not head.startswith('"'):
            name, _, value = head.partition("=")
            name, value = name.strip().lower(), value.strip()
        params: dict[str, float] = {}
        for piece in pieces[1:]:
            key, eq, raw = piece.partition("=")
            number = _number(raw) if eq else None
            if number is not None and math.isfinite(number):
                params[key.strip().lower()] = number
        out.append((name, value, params))
    return out


def ratelimit_delay(header: str | None) -> float | None:
    """From `RateLimit: "p";r=0;t=5` (or `limit=10, remaining=0, reset=5`): seconds until quota returns when none is left."""
    if not header or not isinstance(header, str):
        return None
    waits = []
    members = _members(header)
    for _name, _value, params in members:
        if "r" in params and params["r"] <= 0 and "t" in params:
            waits.append(params["t"])
    fields = {name: _number(value) for name, value, _ in members if value is not None}
    remaining, reset = fields.get("remaining"), fields.get("reset")
    if remaining is not None and reset is not None and remaining <= 0:
        waits.append(reset)
    waits = [w for w in waits if w >= 0]
    return _delay(max(waits)) if waits else None


@lru_cache(maxsize=64)
def advertised_policies(header: str | None) -> tuple[Policy, ...]:
    """From `RateLimit-Policy: "a";q=20;w=1` (or `20;w=1`): the policies the server says it enforces.

    Items without a usable quota and window (not whole, below 1, a window under
    1 ms or over the longest a limit may have) are skipped.
    """
    if not header or not isinstance(header, str):
        return ()
    policies = []
    for name, _value, params in _members(header):
        quota = params.get("q")
        if quota is None:
            quota = _number(name)  # drafts 03-07: the item itself is the quota
        window = params.get("w")
        if quota is None or window is None or not math.isfinite(quota):
            continue
        if not quota.is_integer() or not 1 <= quota <= MAX_LIMIT:
            continue
        if not MIN_WINDOW_S <= window <= MAX_WINDOW_S:
            continue
        policy = Policy(int(quota), float(window))
        if policy not in policies:
            policies.append(policy)
    return tuple(policies)


def x_ratelimit_delay(
    remaining: str | None, reset: str | None, now_wall: float | None = None
) -> float | None:
    """X-RateLimit-Reset when X-RateLimit-Remaining is 0: a delta, or an epoch time."""
    left, value = _number(remaining), _number(reset)
    if left is None or value is None or left > 0 or value < 0:
        return None
    if value > _EPOCH_THRESHOLD:
        now_wall = time.time() if now_wall is None else now_wall
        value = max(0.0, value - now_wall)
    return _delay(value)


def response_delay(
    status: int, headers: Mapping[str, str], body: str, hook: DelayHook | None = None
) -> float | None:
    """How long the server asks us to wait, from whichever source it used (`retry-after-ms`,
    Azure OpenAI's and OpenAI's, first: Retry-After rounds its milliseconds up to seconds)."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        value = _delay(ms / 1000.0)
        if value is not None:
            return value
    value = parse_retry_after(headers.get("Retry-After"))
    if value is not None:
        return value
    if status in (429, 503):
        for value in (
            ratelimit_delay(headers.get("RateLimit")),
            x_ratelimit_delay(headers.get("RateLimit-Remaining"), headers.get("RateLimit-Reset")),
            x_ratelimit_delay(headers.get("X-RateLimit-Remaining"), headers.get("X-RateLimit-Reset")),
        ):
            if value is not None:
                return value
    if hook is not None and status >= 400:
        return hook(status, headers, body)
    return None


_TRY_AGAIN = re.compile(
    r"(?:try again|retry) (?:in|after) ((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)\b", re.I | re.ASCII
)


def _try_again_in(text: str) -> float | None:
    """The wait a message names, as OpenAI's 429 does: "Please try again in 1.4s" (or 6m0s, 20ms)."""
    match = _TRY_AGAIN.search(text)
    return go_duration_bound(match.group(1)) if match else None


def json_field_hook(path: str) -> DelayHook:
    """A hook reading seconds from a JSON body field, e.g. "error.details.retryDelay".

    Values may be numbers or strings like "15s" / "1.5s" / "250ms" (Google APIs' style), or
    a message that names the wait ("Please try again in 1.4s", OpenAI's 429).
    Anything else (not JSON, no such field, NaN, negative) gives None; long delays
    are cut to `MAX_DELAY_S`.
    """
    parts = [p for p in path.split(".") if p]

    def hook(status: int, headers: Mapping[str, str], body: str) -> float | None:
        try:
            node: Any = json.loads(body)
        except (ValueError, TypeError, RecursionError):
            return None
        for part in parts:
            if isinstance(node, list):
                node = node[0] if node else None
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, bool):
            return None
        if isinstance(node, int):
            return _delay(float(min(node, 1 << 62))) if node >= 0 else None
        if isinstance(node, float):
            return _delay(node)
        if isinstance(node, str) and len(node) <= 2000:
            try:
                return _delay(parse_duration(node, low=0.0, low_open=False, high=math.inf))
            except ValueError:
                return _delay(_try_again_in(node))
        return None

    return hook


_INTERVAL_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MBX = re.compile(r"x-mbx-(used-weight|order-count)-(\d{1,6})([smhd])", re.ASCII)


class Quota(NamedTuple):
    """What one answer says the server has counted against one of its limits.

    Counts are in the limit's own units (requests, or weight for Binance's
    USED-WEIGHT). `reset_in_s` is seconds from the answer until the window
    turns; `window_s` the window's length when the server says it; `name`
    the limit's name when it has one (GitHub's resource "core"/"search", an
    IETF policy name, "weight" or "orders" for Binance).

    A named tuple, made for every answer that carries counts: a quarter of a frozen
    dataclass's cost to build (0.25 µs against 1.0).
    """

    limit: int | None = None
    remaining: int | None = None
    used: int | None = None
    reset_in_s: float | None = None
    window_s: float | None = None
    name: str | None = None
    weight: bool = False
    # An LLM API's bucket (`name` is its unit: requests, tokens, input-tokens, output-tokens):
    # `reset_in_s` is when it is full again, read as a bound never earlier than the server's
    # (its text's last digit rounded up), so the refill rate derived from it is never too fast.
    follow: bool = False
    # `reset_in_s` came from a wall-clock time (Anthropic's): it lost the time the answer took
    # to reach us, which the reader adds back as the attempt's round trip.
    reset_from_time: bool = False


_GO_DURATION = re.compile(r"(\d+(?:\.(\d+))?)(ms|h|m|s)", re.ASCII)
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def go_duration_bound(text: object) -> float | None:
    """OpenAI's reset duration (`6m0s`, `1.4s`, `12ms`, `1h2m3s`) in seconds, plus the
    resolution of its last figure (a server that rounds down is still not outrun); None if
    it is not one."""
    if not isinstance(text, str) or not text or len(text) > 40:
        return None
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(f"{n}{u}" for n, _d, u in parts) != text:
        return None
    total = sum(float(n) * _GO_UNITS[u] for n, _d, u in parts)
    _n, decimals, unit = parts[-1]
    total += _GO_UNITS[unit] * 10.0 ** -len(decimals)
    return total if math.isfinite(total) else None


def rfc3339_bound(text: object, now_wall: float) -> float | None:
    """Seconds from `now_wall` to an RFC 3339 time (Anthropic's resets), plus its resolution."""
    if not isinstance(text, str) or not 10 <= len(text) <= 40:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    frac = re.search(r"[Tt ]\d\d:\d\d:\d\d(?:\.(\d+))?", text)
    resolution = 10.0 ** -len(frac.group(1) or "") if frac else 1.0
    return max(0.0, when.timestamp() + resolution - now_wall)


def _llm_quotas(headers: Mapping[str, str], now_wall: float) -> list[Quota]:
    get = headers.get
    quotas = []
    for unit in ("requests", "tokens"):  # OpenAI
        remaining = _count(get(f"x-ratelimit-remaining-{unit}"))
        if remaining is not None:
            reset = go_duration_bound(get(f"x-ratelimit-reset-{unit}"))
            limit = _count(get(f"x-ratelimit-limit-{unit}"))
            quotas.append(Quota(limit, remaining, None, reset, None, unit, follow=True))
    for unit in ("requests", "input-tokens", "output-tokens"):  # Anthropic
        prefix = f"anthropic-ratelimit-{unit}-"
        remaining = _count(get(prefix + "remaining"))
        if remaining is not None:
            reset = rfc3339_bound(get(prefix + "reset"), now_wall)
            limit = _count(get(prefix + "limit"))
            quotas.append(Quota(limit, remaining, None, reset, None, unit, follow=True, reset_from_time=True))
    return quotas


def _count(text: object) -> int | None:
    return _count_of(text) if isinstance(text, str) else None


@lru_cache(maxsize=1024)
def _count_of(text: str) -> int | None:
    """A count as a server writes it; cached: a key's counts repeat (0 to its limit)."""
    value = _number(text)
    if value is None or value < 0 or value > 1e12:
        return None
    return int(value)


def _reset_in(text: object, now_wall: float) -> float | None:
    value = _number_of(text) if isinstance(text, str) else None
    if value is None or value < 0:
        return None
    if value > _EPOCH_THRESHOLD:
        value = value - now_wall
    return _delay(max(0.0, value))


@lru_cache(maxsize=64)
def _policy_windows(header: str) -> dict[str, tuple[float | None, float | None]]:
    """RateLimit-Policy as {name: (quota, window)}; a server repeats it exactly, so it is parsed once."""
    return {n.strip('"').lower(): (p.get("q"), p.get("w")) for n, _v, p in _members(header)}


def read_quotas(
    headers: Mapping[str, str], now_wall: float | None = None, names: frozenset[str] | None = None
) -> tuple[Quota, ...]:
    """Every count the server reports in `headers`; an empty tuple when it reports none. Never raises.

    `names`: the answer's hint names (`hint_names`), when the caller has them: only the
    fields it holds are looked up."""
    try:
        return _read_quotas(headers, time.time() if now_wall is None else now_wall, names)
    except Exception:  # a header no parser understands reports nothing
        return ()


#: The count fields `_read_quotas` reads, by family (X-RateLimit-*, then the IETF drafts' up
#: to 06): Limit, Remaining, Used, Reset, Resource as looked up, then the hint names
#: (`hint_names`) that say the answer holds Remaining, Used, Resource.
_COUNTS = tuple(
    (
        *(prefix + field for field in ("Limit", "Remaining", "Used", "Reset", "Resource")),
        *(prefix.lower() + field for field in ("remaining", "used", "resource")),
    )
    for prefix in ("X-RateLimit-", "RateLimit-")
)


def _quota(
    limit_t: object, remaining_t: object, used_t: object, reset_t: object, resource: object, now_wall: float
) -> Quota | None:
    """One X-RateLimit-* (or RateLimit-*) family's quota as its texts say it; None without a
    remaining or used count."""
    limit, remaining, used = _count(limit_t), _count(remaining_t), _count(used_t)
    if remaining is None and used is None:
        return None
    reset = _reset_in(reset_t, now_wall)
    name = resource.strip().lower()[:40] if isinstance(resource, str) and resource.strip() else None
    return Quota(limit, remaining, used, reset, None, name)


@lru_cache(maxsize=1024)
def _plain_quota(
    limit_t: str | None, remaining_t: str | None, used_t: str | None, reset_t: str | None
) -> Quota | None:
    """`_quota` without a resource and with a reset that is a length: the same texts give the
    same quota. (A reset that is a Unix time is read against the clock: `_timed_reset`.)"""
    return _quota(limit_t, remaining_t, used_t, reset_t, None, 0.0)


def _family_quota(
    limit_t: object, remaining_t: object, used_t: object, reset_t: object, resource: object, now_wall: float
) -> Quota | None:
    """`_quota`, read once per set of texts where it can be (a server repeats them: a count
    from 0 to its limit, one reset): not for a named budget, a reset that is a Unix time (read
    against the clock), nor texts a cache cannot hold (a mapping's odd values)."""
    if resource is None and not _timed_reset(reset_t):
        try:
            return _plain_quota(limit_t, remaining_t, used_t, reset_t)
        except TypeError:
            pass
    return _quota(limit_t, remaining_t, used_t, reset_t, resource, now_wall)


def _timed_reset(text: object) -> bool:
    """Whether a reset's text is a Unix time (read against the clock, so never cached)."""
    value = _number_of(text) if isinstance(text, str) else None
    return value is not None and value > _EPOCH_THRESHOLD


def _read_quotas(
    headers: Mapping[str, str], now_wall: float, names: frozenset[str] | None = None
) -> tuple[Quota, ...]:
    get = headers.get
    quotas: list[Quota] = _llm_quotas(headers, now_wall) if names is None or _LLM in names else []
    said = False  # X-RateLimit-* (or RateLimit-*) said it
    for limit_h, remaining_h, used_h, reset_h, resource_h, has_remaining, has_used, has_resource in _COUNTS:
        if names is not None and has_remaining not in names and has_used not in names:
            continue
        limit_t, remaining_t, used_t, reset_t = get(limit_h), get(remaining_h), get(used_h), get(reset_h)
        resource = get(resource_h) if names is None or has_resource in names else None
        found = _family_quota(limit_t, remaining_t, used_t, reset_t, resource, now_wall)
        if found is None:
            continue
        quotas.append(found)
        said = True
        break
    field = get("RateLimit") if not said and (names is None or "ratelimit" in names) else None
    if isinstance(field, str) and field:
        windows = _policy_windows(get("RateLimit-Policy") or "")
        for name, value, params in _members(field):
            if value is None and "r" in params:
                policy = name.strip('"').lower()
                quota, window = windows.get(policy, (None, None))
                limit = int(quota) if quota is not None and quota.is_integer() and quota >= 1 else None
                reset = _delay(params["t"]) if "t" in params else None
                quotas.append(Quota(limit, int(max(0.0, params["r"])), None, reset, window, policy or None))
    if names is not None and _MBX_NAME not in names:
        return tuple(quotas)
    for header, value in headers.items():
        if not isinstance(header, str) or header[:6].lower() != "x-mbx-":
            continue
        match = _MBX.fullmatch(header.lower())
        used = _count(value) if match else None
        if match is None or used is None:
            continue
        window = int(match.group(2)) * _INTERVAL_UNITS[match.group(3)]
        weight = match.group(1) == "used-weight"
        quotas.append(Quota(None, None, used, None, window, "weight" if weight else "orders", weight))
    return tuple(quotas)


#: A server-time hint above this (seconds) is not believed: no answer takes an hour.
MAX_SERVER_TIME_S = 3600.0


def _span_s(value: float | None, scale: float) -> float | None:
    """A non-negative, finite span in seconds from a number in `scale` units; None otherwise."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    seconds = value * scale
    return seconds if seconds <= MAX_SERVER_TIME_S else None


def _ms_text(text: str | None) -> float | None:
    """`X-Response-Time` style: "12.3", "12.3ms" or "0.5s" (a bare number is milliseconds)."""
    if not isinstance(text, str) or len(text) > 100:
        return None
    stripped = text.strip().lower()
    if stripped.endswith("ms"):
        return _span_s(_number(stripped[:-2]), 0.001)
    if stripped.endswith("us") or stripped.endswith("µs"):
        return _span_s(_number(stripped[:-2]), 1e-6)
    if stripped.endswith("s"):
        return _span_s(_number(stripped[:-1]), 1.0)
    return _span_s(_number(stripped), 0.001)


#: A Server-Timing field of one metric whose one parameter is a plain `dur` (a token's
#: characters for the name, RFC 9110): read in one match, as the full reader would read it.
_ONE_DUR = re.compile(r"[ \t]*[-!#$%&'*+.^_`|~0-9A-Za-z]+[ \t]*;[ \t]*dur=(\d+(?:\.\d*)?)[ \t]*", re.ASCII)


def server_timing_s(header: str | None) -> float | None:
    """The largest `dur` of any metric in a Server-Timing field, in seconds.

    The largest, not the sum: metrics may nest (`total;dur=80, db;dur=50`),
    and a sum would then claim more server time than there was, which would
    make the network look steadier than it is. The largest never claims more
    than the longest span the server measured. Metrics without a usable dur
    (missing, negative, not a number) are skipped; None when none is left.
    """
    if not header or not isinstance(header, str) or len(header) > 4000:
        return None
    one = _ONE_DUR.fullmatch(header)
    if one is not None:  # one metric, its dur the only parameter (`app;dur=12.5`): most servers'
        return _span_s(float(one.group(1)), 0.001)
    best: float | None = None
    for member in _split(header, ","):
        dur = _span_s(_number(_timing_dur(member)), 0.001)
        if dur is not None and (best is None or dur > best):
            best = dur
    return best


#: `server_timing_s` for the texts a server repeats (`app;dur=25.4`: a few hundred in all).
_server_timing_of = lru_cache(maxsize=1024)(server_timing_s)


def _timing_dur(member: str) -> str | None:
    """The `dur` of one Server-Timing metric as written: its first `dur` (a repeated one is
    ignored, as browsers do), unquoted when it is a quoted-string (`dur="53.2"`, which the
    W3C grammar allows: a parameter's value is a token or a quoted-string)."""
    for piece in _split(member, ";")[1:]:
        key, eq, raw = piece.partition("=")
        if key.strip().lower() != "dur":
            continue
        value = raw.strip() if eq else ""
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        return value
    return None


def _field_lines(headers: Mapping[str, str], name: str) -> str | None:
    """Every line of a list-valued field, joined as one (RFC 9110 5.3): a server may send
    `Server-Timing` once per metric, and the first line alone may be the smallest."""
    getall = getattr(headers, "getall", None)  # aiohttp's and pyreqwest's header maps
    if getall is None:
        return headers.get(name)
    try:
        lines = getall(name)
    except KeyError:  # multidict's, for a name it does not hold
        return None
    if not lines:
        return None
    return lines[0] if len(lines) == 1 else ", ".join(lines)


#: The server-time hints: (the name as a hint name, how its value is read).
_TIMING: tuple[tuple[str, Callable[[Mapping[str, str]], float | None]], ...] = (
    ("server-timing", lambda h: _server_timing_of(_field_lines(h, "Server-Timing"))),
    ("x-response-time", lambda h: _ms_text(h.get("X-Response-Time"))),
    ("x-runtime", lambda h: _span_s(_number(h.get("X-Runtime")), 1.0)),
    (
        "x-envoy-upstream-service-time",
        lambda h: _span_s(_number(h.get("X-Envoy-Upstream-Service-Time")), 0.001),
    ),
    ("openai-processing-ms", lambda h: _span_s(_number(h.get("openai-processing-ms")), 0.001)),
)


def server_time_s(headers: Mapping[str, str], names: frozenset[str] | None = None) -> float | None:
    """How long the server says it spent on a request (seconds), from any hint it sent.

    Read: Server-Timing (largest dur, ms), X-Response-Time (ms, or with a unit),
    X-Runtime (seconds, Rails), X-Envoy-Upstream-Service-Time (ms) and OpenAI's
    openai-processing-ms ("time taken processing your API request"). The largest
    usable value wins (each is a span of server time; none may be counted twice).
    Unusable ones (negative, NaN, not a number, over an hour) are ignored; None
    when nothing usable was sent. Whether it fits the round trip is for the
    caller to judge (see engine/limits/headroom.py). `names`: as for `read_quotas`.
    """
    try:
        readers = _TIMING_ALL if names is None else _timing_readers(names)
        if len(readers) == 1:  # most servers send one of them
            return readers[0](headers)
        found = [read(headers) for read in readers]
    except Exception:  # a header mapping that misbehaves gives no hint
        return None
    usable = [v for v in found if v is not None]
    return max(usable) if usable else None


_TIMING_ALL = tuple(read for _name, read in _TIMING)


@lru_cache(maxsize=256)
def _timing_readers(names: frozenset[str]) -> tuple[Callable[[Mapping[str, str]], float | None], ...]:
    """The server-time readers an answer with these hint names needs."""
    return tuple(read for name, read in _TIMING if name in names)


def _whole(text: object) -> int | None:
    """A whole number >= 0 (below 1e12) as written, else None (`remaining_count`'s rule)."""
    return _whole_of(text) if isinstance(text, str) else None


@lru_cache(maxsize=1024)
def _whole_of(text: str) -> int | None:
    value = _number(text)  # cached: a key's remaining counts repeat (0 to its limit)
    if value is not None and value >= 0 and value.is_integer() and value < 1e12:
        return int(value)
    return None


def remaining_count(headers: Mapping[str, str], names: frozenset[str] | None = None) -> int | None:
    """The requests the server says are left in its window, if it says so.

    X-RateLimit-Remaining, RateLimit-Remaining, or the `r` parameter of the
    IETF RateLimit field (the smallest, if several); a whole number >= 0, else None.
    `names`: as for `read_quotas`.
    """
    try:
        for name, low in (
            ("X-RateLimit-Remaining", "x-ratelimit-remaining"),
            ("RateLimit-Remaining", "ratelimit-remaining"),
        ):
            if names is not None and low not in names:
                continue
            count = _whole(headers.get(name))
            if count is not None:
                return count
        if names is not None and "ratelimit" not in names:
            return None
        field = headers.get("RateLimit")
    except Exception:
        return None
    if not field or not isinstance(field, str) or len(field) > 4000:
        return None
    counts = [p["r"] for _n, _v, p in _members(field) if "r" in p and p["r"] >= 0 and p["r"].is_integer()]
    return int(min(counts)) if counts and min(counts) < 1e12 else None


#: A header name `answer_hints` or `read_quotas` reads: one of these names, or one starting
#: with x-ratelimit-, ratelimit, x-mbx- or anthropic-ratelimit- (any case).
_HINTED = re.compile(
    r"(?:x-ratelimit-|ratelimit|x-mbx-|anthropic-ratelimit-"
    r"|(?:server-timing|x-response-time|x-runtime|x-envoy-upstream-service-time|openai-processing-ms)$)",
    re.IGNORECASE,
)
#: Marks in `hint_names` for families read by prefix (a space is in no header name): an LLM
#: API's per-unit buckets (OpenAI's x-ratelimit-remaining-<unit>, Anthropic's), Binance's X-MBX-*.
_LLM, _MBX_NAME = " llm", " mbx"
_NO_HINTS: frozenset[str] = frozenset()


@lru_cache(maxsize=256)
def _names_of(joined: str) -> frozenset[str]:
    names = {n.lower() for n in joined.split("\n") if _HINTED.match(n)}
    if any(n.startswith(("x-ratelimit-remaining-", "anthropic-ratelimit-")) for n in names):
        names.add(_LLM)
    if any(n.startswith("x-mbx-") for n in names):
        names.add(_MBX_NAME)
    return frozenset(names) if names else _NO_HINTS


def hint_names(headers: Mapping[str, str]) -> frozenset[str] | None:
    """The names in `headers` that `answer_hints` or `read_quotas` read, lower-cased (empty:
    none, as in most answers); None when the names cannot be read (then every reader looks).

    A server sends the same names on every answer, so the set is worked out once per set
    of names (`_names_of`): 10 hint headers on an answer cost 16 µs to read before this,
    each reader looking up every name it knows, and 28 µs of the process's CPU per request
    on `live-heavy+hints` (docs/measurements.md)."""
    try:
        return _names_of("\n".join(headers))
    except Exception:  # a mapping that misbehaves: let the readers decide (they never raise)
        return None


def has_hints(headers: Mapping[str, str]) -> bool:
    """Whether `headers` hold anything `answer_hints` or `read_quotas` read: most answers hold
    none, and reading both costs tens of microseconds."""
    names = hint_names(headers)
    return names is None or bool(names)


def answer_hints(
    headers: Mapping[str, str], names: frozenset[str] | None = None
) -> tuple[float | None, int | None]:
    """(server time in seconds, remaining count) from an answer's headers; never raises."""
    return server_time_s(headers, names), remaining_count(headers, names)
