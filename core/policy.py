"""Limit policies: what a server means by "N per W".

Three kinds, written as text in configs and flags:
- `20/1s`: a sliding window, at most 20 in any window of 1 s;
- `5000/1h fixed`: a fixed window, at most 5000 per hour, the hour aligned to
  the clock (or to the reset time the server announces);
- `15@0.33/s`: a leaky bucket (GCRA, Kraken's call counter, nginx's
  limit_req): a counter of at most 15 that drains 0.33 per second; each call
  adds its cost.
Costs: a request may cost more than 1 (its weight); every kind counts costs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

from .numbers import MAX_COUNT, MAX_DURATION_S
from .vocab import PolicyKind

_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_PATTERN = re.compile(
    r"\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*(ms|s|sec|m|min|h)\s*(?:(sliding|fixed)\s*)?", re.ASCII
)
_BUCKET = re.compile(r"\s*(\d+)\s*@\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*(ms|s|sec|m|min|h)\s*", re.ASCII)

#: The shortest window a limit may have: timers and server stamps have about 1 ms grain.
MIN_WINDOW_S = 0.001
#: The largest count a limit may have.
MAX_LIMIT = MAX_COUNT
#: The longest window a limit may have.
MAX_WINDOW_S = MAX_DURATION_S


class PolicyError(ValueError):
    """A policy string that does not parse; the message says why."""


@dataclass(frozen=True, slots=True)
class Policy:
    """At most `limit` (cost units) per `window_s` seconds, counted as `kind` says.

    A bucket holds at most `limit` and drains `drain` units per `window_s`
    ("15@0.33/s": limit 15, drain 0.33, window 1 s).
    """

    limit: int
    window_s: float
    kind: PolicyKind = PolicyKind.SLIDING
    drain: float = 0.0

    def __str__(self) -> str:
        return format_policy(self)

    @property
    def rate(self) -> float:
        """Long-run cost units per second this policy allows."""
        if self.kind is PolicyKind.BUCKET:
            return self.drain / self.window_s
        return self.limit / self.window_s

    @property
    def is_window(self) -> bool:
        """A sliding or fixed window (not a bucket)."""
        return self.kind is not PolicyKind.BUCKET


def _show(text: object) -> str:
    shown = repr(text) if isinstance(text, str) else repr(str(text))
    return shown if len(shown) <= 40 else shown[:39] + "…"


def parse_policy(text: str) -> Policy:
    """Parse "20/1s", "600/1m", "5/500ms", "100/s", "1/1.0005s" into a `Policy`.

    The count is a whole number from 1 to `MAX_LIMIT`, the window from 1 ms to
    `MAX_WINDOW_S`; anything else raises `PolicyError` saying why.
    """
    if not isinstance(text, str):
        raise PolicyError(f"{_show(text)} is not a limit; write N/W with a unit, like 20/1s")
    bucket = _BUCKET.fullmatch(text)
    match = bucket or _PATTERN.fullmatch(text)
    if not match:
        raise PolicyError(
            f"{_show(text)} is not a limit; write N/W with a unit, like 20/1s, 600/1m or 5/500ms"
            " (a fixed window: 5000/1h fixed; a leaky bucket: 15@0.33/s)"
        )
    if len(match.group(1)) > 12:
        raise PolicyError(f"{_show(text)}: the count must be at most {MAX_LIMIT:,}")
    limit = int(match.group(1))
    if limit < 1:
        raise PolicyError(f"{_show(text)}: the count must be at least 1")
    if limit > MAX_LIMIT:
        raise PolicyError(f"{_show(text)}: the count must be at most {MAX_LIMIT:,}")
    if bucket is not None:
        drain = float(bucket.group(2))
        window = _UNITS[bucket.group(3)]
        if not drain > 0 or not math.isfinite(drain) or len(bucket.group(2)) > 20:
            raise PolicyError(f"{_show(text)}: the bucket must drain more than 0 per {bucket.group(3)}")
        if drain / window < limit / MAX_WINDOW_S:
            raise PolicyError(f"{_show(text)}: the bucket drains too slowly to be a limit")
        return Policy(limit, window, PolicyKind.BUCKET, drain)
    amount = float(match.group(2)) if match.group(2) else 1.0
    window = amount * _UNITS[match.group(3)]
    if not window > 0:
        raise PolicyError(f"{_show(text)}: the window must be longer than zero")
    if window < MIN_WINDOW_S:
        raise PolicyError(f"{_show(text)}: the window must be at least 1ms")
    if not math.isfinite(window) or window > MAX_WINDOW_S:
        raise PolicyError(f"{_show(text)}: the window must be at most {MAX_WINDOW_S / 3600:g}h")
    return Policy(limit, window, PolicyKind(match.group(4) or PolicyKind.SLIDING))


def _plain(x: float) -> str:
    """A float's shortest exact digits, without an exponent ("1.0005", "0.00001")."""
    text = format(Decimal(repr(x)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_policy(policy: Policy) -> str:
    """The inverse of `parse_policy`, exactly: Policy(20, 1.0) -> "20/1s", Policy(1, 1.0005) -> "1/1.0005s"."""
    if policy.kind is PolicyKind.BUCKET:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h", 0.001: "ms"}.get(policy.window_s)
        if unit is None:  # built in code with another window: say it per second
            return f"{policy.limit}@{_plain(policy.drain / policy.window_s)}/s"
        return f"{policy.limit}@{_plain(policy.drain)}/{unit}"
    text = _format_window(policy)
    return text if policy.kind is PolicyKind.SLIDING else f"{text} {policy.kind}"


def _format_window(policy: Policy) -> str:
    """N/W with the shortest unit that says W exactly."""
    w = float(policy.window_s)
    if not (math.isfinite(w) and w > 0):
        return f"{policy.limit}/{w}s"
    candidates = []
    if w >= 3600 and w % 3600 == 0:
        candidates.append(f"{_plain(w / 3600)}h")
    if w >= 60 and w % 60 == 0:
        candidates.append(f"{_plain(w / 60)}m")
    if w >= 1:
        candidates.append(f"{_plain(w)}s")
    candidates.append(f"{_plain(round(w * 1000, 9))}ms")
    candidates.append(f"{_plain(w)}s")
    for window in candidates:
        match = _PATTERN.fullmatch(f"1/{window}")
        if match and float(match.group(2) or 1.0) * _UNITS[match.group(3)] == w:
            return f"{policy.limit}/{window}"
    return f"{policy.limit}/{_plain(w)}s"  # exact by construction: the digits times 1.0
