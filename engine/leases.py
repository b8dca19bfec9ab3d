"""The send times one key holds from a shared store (`cluster.ClusterMember` fetches them)."""

from __future__ import annotations

import math
from collections import deque

from .ports import Grant


class LeasedSlots:
    """The send times one key holds from the store: `next_at(now)` the earliest usable, `take` one."""

    __slots__ = ("times", "fetching", "retry_at", "valid_until", "granted", "used", "dropped")

    def __init__(self) -> None:
        self.times: deque[tuple[float, float]] = deque()  # (from, until), loop clock
        self.fetching = False
        self.valid_until = math.inf  # none is used after this: the store's epoch was not confirmed since
        self.retry_at = 0.0  # no fetch before this (the store said the budget is full until then)
        self.granted = self.used = self.dropped = 0

    def add(self, grant: Grant) -> None:
        for t in grant.times:
            self.times.append((t, t + grant.usable_s))
        self.granted += len(grant.times)

    def next_at(self, now: float) -> float:
        """The earliest lease still usable at `now` or later (inf: none held); stale ones are dropped."""
        times = self.times
        if now > self.valid_until:
            self.clear()
            return math.inf
        while times and times[0][1] < now:
            times.popleft()
            self.dropped += 1
        return times[0][0] if times else math.inf

    def take(self) -> None:
        self.times.popleft()
        self.used += 1

    def clear(self) -> None:
        self.dropped += len(self.times)
        self.times.clear()

    def __len__(self) -> int:
        return len(self.times)
