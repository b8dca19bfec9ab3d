"""Window policies: "at most N in any window of W"."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|sec|m|min|h)\s*$")


class PolicyError(ValueError):
    """A policy string that does not parse; the message says why."""


@dataclass(frozen=True, slots=True)
class Policy:
    """At most `limit` requests in any window of `window_s` seconds."""

    limit: int
    window_s: float

    def __str__(self) -> str:
        return format_policy(self)

    @property
    def rate(self) -> float:
        """Long-run requests per second this policy allows."""
        return self.limit / self.window_s


def parse_policy(text: str) -> Policy:
    """Parse "20/1s", "600/1m", "5/500ms", "100/s" into a `Policy`."""
    match = _PATTERN.match(str(text))
    if not match:
        raise PolicyError(f"{text!r} is not a limit; write N/W with a unit, like 20/1s, 600/1m or 5/500ms")
    limit = int(match.group(1))
    amount = float(match.group(2)) if match.group(2) else 1.0
    window = amount * _UNITS[match.group(3)]
    if limit < 1:
        raise PolicyError(f"{text!r}: the count must be at least 1")
    if window <= 0:
        raise PolicyError(f"{text!r}: the window must be longer than zero")
    return Policy(limit, window)


def format_policy(policy: Policy) -> str:
    """The inverse of `parse_policy`: Policy(20, 1.0) -> "20/1s"."""
    w = policy.window_s
    if w >= 3600 and w % 3600 == 0:
        return f"{policy.limit}/{int(w // 3600)}h"
    if w >= 60 and w % 60 == 0:
        return f"{policy.limit}/{int(w // 60)}m"
    if w >= 1 and float(w).is_integer():
        return f"{policy.limit}/{int(w)}s"
    return f"{policy.limit}/{round(w * 1000)}ms"
