"""The server's limiter: a circular buffer of accept stamps per window policy."""

from __future__ import annotations

import math
from bisect import bisect_left

from ratedeck.core.policy import Policy


class SlotRing:
    """At most `limit` stamps in any window of `window_ms`, the study's server's way.

    The ring holds the last `limit` accept stamps, oldest at `index`. A new
    request fits only if the oldest stamp is strictly more than `window_ms` old,
    so stamps exactly one window apart do not both count as free.

    Attributes:
        policy: the window policy this ring enforces.
        limit: how many stamps the ring holds (the policy's count).
        window_ms: the policy's window in milliseconds.
        stamps: accept times in ms; -inf marks a slot never used.
        index: position of the oldest stamp, the next one to be overwritten.
    """

    __slots__ = ("policy", "limit", "window_ms", "stamps", "index")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.limit = policy.limit
        self.window_ms = policy.window_s * 1000.0
        self.stamps = [-math.inf] * self.limit
        self.index = 0

    def has_room(self, now_ms: float) -> bool:
        """True if a request at `now_ms` fits (strictly more than a window since the oldest)."""
        return now_ms - self.stamps[self.index] > self.window_ms

    def take(self, now_ms: float) -> None:
        """Spend the oldest slot on a request at `now_ms`."""
        index = self.index
        self.stamps[index] = now_ms
        index += 1
        self.index = 0 if index == self.limit else index

    def oldest(self) -> float:
        """The oldest stamp held (the one the next `take` overwrites); -inf while a slot is unused."""
        return self.stamps[self.index]

    def wait_ms(self, now_ms: float) -> float:
        """Milliseconds until the oldest slot frees (0 if it is free already)."""
        return max(0.0, self.stamps[self.index] + self.window_ms - now_ms)

    def remaining(self, now_ms: float) -> int:
        """How many requests would fit at `now_ms` (free slots right now)."""
        # Stamps are in time order starting at `index`; count those already out of the window.
        stamps, start, limit = self.stamps, self.index, self.limit
        return bisect_left(range(limit), now_ms - self.window_ms, key=lambda i: stamps[(start + i) % limit])
