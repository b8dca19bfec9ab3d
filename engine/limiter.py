"""The per-key window limiter: the one authority on when a key may send.

A policy N/W means what the server means: at most N sends in any window of W.
The limiter keeps, per policy, the times of the last N grants in a ring; the
next slot frees at `oldest + W + headroom`. Several policies are taken
all-or-nothing: a send waits for the latest of their free times. Nothing
polls: callers ask `next_free(now)` and sleep exactly until then.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .policy import Policy


class Stamp:
    """One grant: its send time, and the headroom its slot needs once known.

    `extra` stays None until the request is answered; until then the
    limiter's current headroom applies. Shared by every policy's ring.
    """

    __slots__ = ("t", "extra")

    def __init__(self, t: float):
        self.t = t
        self.extra: float | None = None


class WindowLimiter:
    """Grants send slots for one API key under one or more window policies.

    Attributes:
        policies: the policies that must all hold.
        pacing: "even" spreads sends at least (W + headroom) / N apart, so a
            key never bursts (the server sees steady traffic and nonces arrive
            in order); "burst" lets a full window go at once.
        headroom_s: callable returning the current headroom in seconds; read
            at every decision, so a live change takes effect at once.
        min_spacing: with even pacing, the gap between two sends as a fraction
            of the even gap (W + headroom) / N. Timers fire late (uvloop by up to
            a millisecond), and a gap measured from a late send loses that much
            every time (about 9% at 100/s per key); a gap a little shorter than
            even lets the window rings, which are exact, set the beat instead.
            1.0 keeps every gap whole, for nonce-ordered targets where sends
            closer than the network jitter may arrive out of order.
    """

    __slots__ = ("policies", "pacing", "headroom_s", "pace_s", "min_spacing", "_rings", "_last")

    def __init__(self, policies: tuple[Policy, ...], headroom_s: Callable[[], float], pacing: str = "even",
                 min_spacing: float = 1.0, pace_s: Callable[[], float] | None = None):
        if not policies:
            raise ValueError("a limiter needs at least one policy")
        self.policies = policies
        self.pacing = pacing
        self.headroom_s = headroom_s  # for slots whose request is not answered yet
        self.pace_s = pace_s or headroom_s  # the headroom the even gap assumes
        self.min_spacing = min_spacing
        self._rings = tuple(deque(maxlen=p.limit) for p in policies)
        self._last = float("-inf")  # the last send

    def next_free(self, now: float) -> float:
        """The earliest time >= now at which a send keeps every policy."""
        h = self.headroom_s()
        t = now
        for policy, ring in zip(self.policies, self._rings):
            if len(ring) == policy.limit:
                head = ring[0]
                free = head.t + policy.window_s + (h if head.extra is None else head.extra)
                if free > t:
                    t = free
        if self.pacing == "even":
            p = self.pace_s()
            for policy in self.policies:
                due = self._last + (policy.window_s + p) * self.min_spacing / policy.limit
                if due > t:
                    t = due
        return t

    def record(self, at: float) -> Stamp:
        """Note a send at `at` (call only when `next_free(at) <= at`); returns its stamp."""
        stamp = Stamp(at)
        for ring in self._rings:
            ring.append(stamp)
        self._last = at
        return stamp

    def add_policy(self, policy: Policy) -> bool:
        """Also enforce `policy` from now on (a limit the server advertised).

        Its ring starts with the most recent sends we know of, so adopting a
        policy never allows a burst. Returns False when an existing policy is
        already at least as strict (same or longer window, same or lower count).
        """
        if any(p.window_s >= policy.window_s and p.limit <= policy.limit for p in self.policies):
            return False
        longest = max(self._rings, key=len)
        ring = deque(list(longest)[-policy.limit:], maxlen=policy.limit)
        self.policies = self.policies + (policy,)
        self._rings = self._rings + (ring,)
        return True

    def used(self, now: float) -> tuple[int, int]:
        """(sends in the current window, limit) for the tightest policy, for display."""
        policy, ring = min(zip(self.policies, self._rings), key=lambda pr: pr[0].rate)
        start = now - policy.window_s
        return sum(1 for s in ring if s.t > start), policy.limit

    @property
    def capacity_tps(self) -> float:
        return min(p.rate for p in self.policies)
