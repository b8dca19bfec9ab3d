"""Sustained efficiency: a run scored the way an independent server scores it (issue 44).

Per key, from the server's own stamps of the arrivals it accepted: with N the
limit and W the window, the gaps `t[i+N] - t[i]` for every i with i+N in range,
and the figure is W / their mean. A window filled to the limit all the time
gives 1.0. The burst a fresh window allows at the start (or after a pause) is
not rewarded: the N arrivals of a burst pair with the N after them, and those
can come no sooner than a window later, so their gaps are a window or more.
Accepted / capacity does reward it (about 5% over 20 s at 20/1s).

A key with several policies is scored by one of them; the live bench takes the
policy the scenario names (the server's per-key policy, not the one the client
is told). `binding_policy` picks the one that binds in the long run (the
lowest rate) when a caller has several.

The run's figure is the mean over the keys that have a figure (each key
counts once, whatever its traffic); keys with fewer than N+1 accepted arrivals
have none and are left out of the mean, so `run_sustained` also says how many
keys were scored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ratedeck.core.policy import Policy


def sustained_efficiency(arrivals: Sequence[float], limit: int, window_s: float) -> float | None:
    """W / the mean of `t[i+N] - t[i]` over the sorted accepted arrivals of one key.

    `arrivals` are the server's accept stamps in seconds (any order); `limit` is N,
    `window_s` is W. None when there are fewer than N+1 arrivals (no pair). A mean
    gap of 0 (N+1 arrivals at one instant, which no server that holds its limit
    accepts) gives `math.inf`.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not window_s > 0:
        raise ValueError(f"window_s must be above 0, got {window_s}")
    n = len(arrivals)
    if n < limit + 1:
        return None
    t = sorted(arrivals)
    pairs = n - limit
    # sum(t[i+N] - t[i] for i < pairs) telescopes: the last `pairs` stamps minus the first `pairs`.
    total = math.fsum(t[limit:]) - math.fsum(t[:pairs])
    if total <= 0:
        return math.inf
    return window_s * pairs / total


@dataclass(frozen=True)
class RunSustained:
    """A run's sustained efficiency.

    Attributes:
        mean: the mean of the keys' figures (None when no key has one).
        by_key: each key's figure in the order given, None where it has fewer than N+1 arrivals.
        scored: how many keys have a figure.
    """

    mean: float | None
    by_key: tuple[float | None, ...]

    @property
    def scored(self) -> int:
        return sum(1 for v in self.by_key if v is not None)


def run_sustained(arrivals_by_key: Iterable[Sequence[float]], limit: int, window_s: float) -> RunSustained:
    """Every key's sustained efficiency and their mean (keys without a figure left out)."""
    by_key = tuple(sustained_efficiency(a, limit, window_s) for a in arrivals_by_key)
    scored = [v for v in by_key if v is not None]
    return RunSustained(sum(scored) / len(scored) if scored else None, by_key)


def binding_policy(policies: Sequence[Policy]) -> Policy:
    """Of several window policies on one key, the one that binds in the long run: the lowest
    rate (ties: the longer window, the one a pause pays for longest). Buckets are not scored."""
    windows = [p for p in policies if p.is_window]
    if not windows:
        raise ValueError("no window policy to choose from")
    return min(windows, key=lambda p: (p.rate, -p.window_s))
