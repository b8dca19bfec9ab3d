"""Numbers from users: the one validator behind the CLI, the config file and `serve`.

Every number a person types or writes goes through here: it must be finite
(no NaN, no infinity), of the right kind (a bool is not a number, 2.5 is not
a count) and within a sane range, so nothing downstream ever meets a value
that silences a key for a century or makes the generator spin.

Durations take a unit ("250ms", "30s", "5m", "1h"; a bare number is seconds),
rates a count over a window ("100", "100/s", "20/1s", "600/1m"). Each parser
raises `ValueError` with a short reason ("must be above 0 seconds, got
'nan'"); callers add where the value came from (`ConfigError(source, key, ...)`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

#: Requests (or messages) per second: the most an arrival rate may ask for.
MAX_RATE = 1_000_000.0
#: The longest duration anything in a run may have (a run, a TTL, a window).
MAX_DURATION_S = 30 * 86_400.0
#: The longest anything counted in milliseconds may be (headroom, backoff).
MAX_MS = 3_600_000.0
#: The largest count a setting may hold (queue sizes, totals).
MAX_COUNT = 1_000_000_000

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER_RE = re.compile(rf"\s*({_NUMBER})\s*", re.ASCII)
_DURATION_RE = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]*)\s*", re.ASCII)
_RATE_RE = re.compile(
    rf"\s*({_NUMBER})\s*(?:/\s*({_NUMBER})?\s*([a-zA-Z]+)\s*)?",
    re.ASCII,
)
_UNITS = {
    "ms": 0.001,
    "msec": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}


def show(value: Any, width: int = 40) -> str:
    """`repr(value)` cut to `width` characters, for messages that quote what the user gave."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not turn a message into a crash
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 1] + "…"


def readable(x: float) -> str:
    """A measured number for people: at most two decimals (2.73, 120, 12,000), three significant
    figures below 1 (0.139)."""
    if x != 0 and abs(x) < 1:
        return f"{x:.3g}"
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) >= 10_000 else f"{x:g}"


def _to_float(value: Any, what: str) -> float:
    """A finite float from an int, a float or numeric text; never from a bool."""
    if isinstance(value, bool):
        raise ValueError(f"must be {what}, got {str(value).lower()}")
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"must be {what}, got a number too large to use") from None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        match = _NUMBER_RE.fullmatch(value)
        if not match:
            raise ValueError(f"must be {what}, got {show(value)}")
        number = float(match.group(1))
    else:
        raise ValueError(f"must be {what}, got {show(value)}")
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {show(value)}")
    return number


def _check_range(
    number: float,
    original: Any,
    *,
    low: float | None,
    high: float | None,
    low_open: bool,
    unit: str = "",
) -> None:
    suffix = f" {unit}" if unit else ""
    if low is not None and (number <= low if low_open else number < low):
        word = "above" if low_open else "at least"
        raise ValueError(f"must be {word} {_fmt(low)}{suffix}, got {show(original)}")
    if high is not None and number > high:
        raise ValueError(f"must be at most {_fmt(high)}{suffix}, got {show(original)}")


def number(
    value: Any,
    *,
    low: float | None = 0.0,
    high: float | None = None,
    low_open: bool = False,
    unit: str = "",
) -> float:
    """A finite number (int, float or numeric text) in [low, high] (or (low, high] with `low_open`)."""
    what = f"a number of {unit}" if unit else "a number"
    result = _to_float(value, what)
    _check_range(result, value, low=low, high=high, low_open=low_open, unit=unit)
    return result


def whole(value: Any, *, low: int | None = 0, high: int | None = MAX_COUNT) -> int:
    """A whole number in [low, high]; 3.0 is 3, 2.5 and true are refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        result = value
    else:
        as_float = _to_float(value, "a whole number")
        if not as_float.is_integer():
            raise ValueError(f"must be a whole number, got {show(value)}")
        result = int(as_float)
    _check_range(result, value, low=low, high=high, low_open=False)
    return result


def fraction(value: Any, *, allow_zero: bool = False) -> float:
    """A number in (0, 1] (or [0, 1] with `allow_zero`)."""
    result = _to_float(value, "a number between 0 and 1")
    if result > 1 or result < 0 or (result == 0 and not allow_zero):
        word = "at least 0" if allow_zero else "above 0"
        raise ValueError(f"must be {word} and at most 1, got {show(value)}")
    return result


def _duration_amount(value: Any, in_ms: bool, what: str) -> float:
    """A duration in seconds (or milliseconds with `in_ms`); a bare number is already in that unit."""
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if not match:
            raise ValueError(
                f"{show(value)} is not {what}; write a number with ms, s, m or h, like 30s or 250ms"
            )
        unit = match.group(2).lower()
        if unit and unit not in _UNITS:
            raise ValueError(
                f"{show(value)} is not {what}: unknown unit {match.group(2)!r}; use ms, s, m or h"
            )
        amount = float(match.group(1))
        if not unit:
            result = amount
        elif in_ms:  # whole-number factors, so "5ms" is exactly 5.0
            result = amount * round(_UNITS[unit] * 1000)
        else:
            result = amount * _UNITS[unit]
        if not math.isfinite(result):
            raise ValueError(f"{show(value)} is not {what} anything can wait for")
        return result
    return _to_float(value, what)


def parse_duration(
    value: Any,
    *,
    low: float = 0.0,
    low_open: bool = True,
    high: float = MAX_DURATION_S,
) -> float:
    """Seconds from 30, 1.5, "1.5", "30s", "5m", "1h" or "250ms" (a bare number is seconds).

    By default above 0 and at most `MAX_DURATION_S`; NaN, infinity, bools and
    unknown units ("5 parsecs") raise `ValueError`.
    """
    seconds = _duration_amount(value, False, "a duration")
    _check_range(seconds, value, low=low, high=high, low_open=low_open, unit="seconds")
    return seconds


def parse_milliseconds(value: Any, *, low: float = 0.0, high: float = MAX_MS) -> float:
    """Milliseconds from 250, "250", "250ms", "0.25s" (a bare number is milliseconds)."""
    ms = _duration_amount(value, True, "a duration")
    _check_range(ms, value, low=low, high=high, low_open=False, unit="ms")
    return ms


def parse_rate(value: Any, *, allow_zero: bool = True, high: float = MAX_RATE) -> float:
    """Per second from 100, "100", "100/s", "20/1s", "600/1m" or "5/500ms".

    At most `high` (default `MAX_RATE`), so an arrival process can never spin.
    """
    if isinstance(value, str):
        match = _RATE_RE.fullmatch(value)
        if not match:
            raise ValueError(
                f"{show(value)} is not a rate; write requests per second (100) or N/W like 20/1s or 600/1m"
            )
        count = float(match.group(1))
        rate = count
        if match.group(3) is not None:
            unit = match.group(3).lower()
            if unit not in _UNITS:
                raise ValueError(
                    f"{show(value)} is not a rate: unknown unit {match.group(3)!r}; use ms, s, m or h"
                )
            window = (float(match.group(2)) if match.group(2) else 1.0) * _UNITS[unit]
            if not window > 0:
                raise ValueError(f"{show(value)} is not a rate: the window must be longer than zero")
            rate = count / window
        if not math.isfinite(rate):
            raise ValueError(f"{show(value)} is not a rate anything can keep up with")
    else:
        rate = _to_float(value, "a rate in requests per second")
    if rate < 0 or (rate == 0 and not allow_zero):
        word = "0 or more" if allow_zero else "above 0"
        raise ValueError(f"must be {word} per second, got {show(value)}")
    if rate > high:
        raise ValueError(f"must be at most {_fmt(high)} per second, got {show(value)}")
    return rate


# ---------------------------------------------------------------- simulator settings

#: Bounds of the simulator's numbers, shared by `ratedeck serve` and a config's [server] table.
MAX_SIM_KEYS = 100_000
MAX_LATENCY_MS = 60_000
MAX_ESCALATION_S = 86_400.0


def latency_range(value: Any) -> tuple[int, int]:
    """[low, high] whole milliseconds with 0 <= low <= high <= MAX_LATENCY_MS."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"must be [low, high] whole milliseconds, got {show(value)}")
    low = whole(value[0], low=0, high=MAX_LATENCY_MS)
    high = whole(value[1], low=0, high=MAX_LATENCY_MS)
    if low > high:
        raise ValueError(f"need low <= high, got {show(value)}")
    return (low, high)


class SettingError(ValueError):
    """A named setting with a bad value: `name` and `problem`; `str()` is "name: problem"."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"{name}: {problem}")


def check_simulator_numbers(table: Any) -> None:
    """Check the numbers of a simulator settings table; raises `SettingError` for the first bad one.

    Only the numbers: names, modes and limits are the simulator's own business.
    """
    if not isinstance(table, dict):
        return

    def check(name: str, parse: Callable[[Any], Any]) -> Any:
        if name not in table:
            return None
        try:
            return parse(table[name])
        except ValueError as exc:
            raise SettingError(name, str(exc)) from None

    keys = table.get("keys")
    if isinstance(keys, int):  # a count of generated keys; a bool is refused here too
        check("keys", lambda v: whole(v, low=1, high=MAX_SIM_KEYS))
    check("latency_in_ms", latency_range)
    check("latency_out_ms", latency_range)
    check("block_after", lambda v: whole(v, low=0))
    check("error_rate", lambda v: fraction(v, allow_zero=True))
    check("seed", lambda v: whole(v, low=None, high=None))
    base = check(
        "escalation_base_s", lambda v: number(v, low=0, low_open=True, high=MAX_ESCALATION_S, unit="seconds")
    )
    cap = check(
        "escalation_cap_s", lambda v: number(v, low=0, low_open=True, high=MAX_ESCALATION_S, unit="seconds")
    )
    if base is not None and cap is not None and cap < base:
        raise SettingError("escalation_cap_s", f"must be at least escalation_base_s ({base:g}), got {cap:g}")


def usd(amount: float | None) -> str:
    """US dollars as people read them: "$12.40", "$0.47", "$0.0036" (cents hide a small
    amount); None is "unknown" (a model with no price), never $0."""
    if amount is None:
        return "unknown"
    if amount == 0 or abs(amount) >= 0.1:
        return f"${amount:,.2f}"
    # two significant figures below a dime, never fewer than two decimals: $0.09, $0.012, $0.0036
    places = min(8, 1 - math.floor(math.log10(abs(amount))))
    text = f"{amount:.{places}f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def usd_range(low: float | None, high: float | None) -> str:
    """A cost range, "$0.09–$0.47"; "unknown" when either end is."""
    if low is None or high is None:
        return "unknown"
    return f"{usd(low)}–{usd(high)}"
