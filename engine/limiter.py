"""The per-key window limiter: the one authority on when a key may send.

A policy N/W means what the server means: at most N sends in any window of W.
The limiter keeps, per policy, the times of the last N grants in a ring; the
next slot frees at `oldest + W + headroom`. Several policies are taken
all-or-nothing: a send waits for the latest of their free times. Nothing
polls: callers ask `next_free(now)` and sleep exactly until then.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ratedeck.core.policy import Policy


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

    __slots__ = (
        "policies",
        "pacing",
        "headroom_s",
        "pace_s",
        "min_spacing",
        "_rings",
        "_last",
        "_waiters",
        "_timer",
    )

    def __init__(
        self,
        policies: tuple[Policy, ...],
        headroom_s: Callable[[], float],
        pacing: str = "even",
        min_spacing: float = 1.0,
        pace_s: Callable[[], float] | None = None,
    ):
        if not policies:
            raise ValueError("a limiter needs at least one policy")
        self.policies = policies
        self.pacing = pacing
        self.headroom_s = headroom_s  # for slots whose request is not answered yet
        self.pace_s = pace_s or headroom_s  # the headroom the even gap assumes
        self.min_spacing = min_spacing
        self._rings: tuple[deque[Stamp], ...] = tuple(deque(maxlen=p.limit) for p in policies)
        self._last = float("-inf")  # the last send
        self._waiters: deque[tuple[asyncio.Future[Stamp | None], float | None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def next_free(self, now: float) -> float:
        """The earliest time >= now at which a send keeps every policy."""
        h = self.headroom_s()
        t = now
        for policy, ring in zip(self.policies, self._rings, strict=False):
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

    async def acquire(self, deadline: float | None = None) -> Stamp | None:
        """Wait for a slot (first come, first served) and take it.

        Returns None, without taking a slot, when the slot would come after
        `deadline` (loop time, e.g. a request's TTL): at once if that is
        already certain, else when the deadline has passed. One timer serves
        every waiter; the key workers use `next_free`/`record` directly.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self._waiters and self.next_free(now) <= now:
            return self.record(now)
        if deadline is not None and self.next_free(now) > deadline:
            return None
        fut: asyncio.Future[Stamp | None] = loop.create_future()
        self._waiters.append((fut, deadline))
        self._arm(loop)
        try:
            return await fut
        except asyncio.CancelledError:
            self._waiters = deque(w for w in self._waiters if w[0] is not fut)
            if fut.done() and not fut.cancelled() and fut.result() is not None:
                raise  # granted just as it was cancelled: the slot stays spent, like a send
            raise

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._waiters:
            self._timer = None
            return
        when = self.next_free(loop.time())
        deadlines = [d for _, d in self._waiters if d is not None]
        if deadlines:
            when = min(when, min(deadlines))  # wake to let an expired waiter go
        self._timer = loop.call_at(when, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        kept: deque[tuple[asyncio.Future[Stamp | None], float | None]] = deque()
        for fut, deadline in self._waiters:
            if fut.done():
                continue
            if not kept and self.next_free(now) <= now:
                fut.set_result(self.record(now))  # its turn, and a slot is free
            elif deadline is not None and deadline <= now:
                fut.set_result(None)  # gave up: its slot would come too late
            else:
                kept.append((fut, deadline))
        self._waiters = kept
        self._arm(loop)

    def add_policy(self, policy: Policy) -> bool:
        """Also enforce `policy` from now on (a limit the server advertised).

        Its ring starts with the most recent sends we know of, so adopting a
        policy never allows a burst. Returns False when an existing policy is
        already at least as strict (same or longer window, same or lower count).
        """
        if any(p.window_s >= policy.window_s and p.limit <= policy.limit for p in self.policies):
            return False
        longest = max(self._rings, key=len)
        ring = deque(list(longest)[-policy.limit :], maxlen=policy.limit)
        self.policies = self.policies + (policy,)
        self._rings = self._rings + (ring,)
        return True

    def used(self, now: float) -> tuple[int, int]:
        """(sends in the current window, limit) for the tightest policy, for display."""
        policy, ring = min(zip(self.policies, self._rings, strict=False), key=lambda pr: pr[0].rate)
        start = now - policy.window_s
        return sum(1 for s in ring if s.t > start), policy.limit

    @property
    def capacity_tps(self) -> float:
        return min(p.rate for p in self.policies)
