"""The send times one key holds from a shared store (`cluster.ClusterMember` fetches them)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ratedeck.engine.ports import Grant


class LeasedSlots:
    """The send times one key holds from the store for one plan (the budgets a request spends
    from and what it costs in each): `next_at(now)` the earliest usable, `take` one.

    `plan` is None for a key whose every request spends the same (its limiters, 1 each);
    `single` asks one slot at a time (a plan whose cost varies per request, like tokens).
    """

    __slots__ = (
        "times",
        "fetching",
        "retry_at",
        "valid_until",
        "granted",
        "used",
        "dropped",
        "plan",
        "single",
        "sent",
    )

    def __init__(self, plan: list[tuple[Any, int]] | None = None, single: bool = False) -> None:
        self.plan = plan
        self.single = single
        self.times: deque[tuple[float, float, Any]] = deque()  # (from, until, ticket), loop clock
        self.fetching = False
        self.valid_until = math.inf  # none is used after this: the store's epoch was not confirmed since
        self.retry_at = 0.0  # no fetch before this (the store said the budget is full until then)
        self.granted = self.used = self.dropped = 0
        self.sent: list[tuple[Any, float]] = []  # (ticket, loop time) of sends the store has not been told

    def add(self, grant: Grant) -> None:
        tickets = grant.tickets or (None,) * len(grant.times)
        for t, ticket in zip(grant.times, tickets, strict=True):
            self.times.append((t, t + grant.usable_s, ticket))
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

    def take(self, now: float) -> Any:
        """Use the earliest lease, sending at `now`; returns its ticket (what a give-back to the
        store needs). The send is kept for the store (`ClusterMember` tells it in batches): it then
        counts the send from `now`, not from the latest its lease allowed."""
        self.used += 1
        ticket = self.times.popleft()[2]
        if ticket is not None:
            self.sent.append((ticket, now))
        return ticket

    def clear(self) -> None:
        self.dropped += len(self.times)
        self.times.clear()

    def __len__(self) -> int:
        return len(self.times)
