"""The limiter: the one authority on when a budget may spend.

A policy means what the server means (see `core/policy.py`): a sliding window
N/W (at most N in any window of W, as the server stamps arrivals), a fixed
window (at most N per window, windows aligned to the clock or to the reset the
server announces) or a leaky bucket (a counter of at most N that drains at a
steady rate). Each policy is kept by a meter; several policies are taken
all-or-nothing: a send waits for the latest of their free times. A request may
cost more than 1 (its weight): every meter counts costs. Nothing polls:
callers ask `next_free(now, cost)` and sleep exactly until then.

Headroom: a send reaches the server some time after we stamp it, and that
time varies. Each meter therefore frees a slot only once the server must have
seen it leave: a sliding window's slot at `send + W + headroom` (or the
per-request bound once the request is answered, `Stamp.extra`); a fixed
window's next window `headroom` after its boundary (and a send that may
arrive after the boundary counts in both windows); a bucket keeps what drains
in `headroom` free (sends in any interval reach the server within that
interval plus the headroom).

The server's count is the truth, ours a forecast: `sync()` takes what an
answer says the server has counted (used, remaining, reset) and never lets
our forecast be lower.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ratedeck.core.policy import Policy
from ratedeck.core.vocab import Pacing, PolicyKind


class Stamp:
    """One grant: its send time, and the headroom its slot needs once known.

    `extra` stays None until the request is answered; until then the
    limiter's current headroom applies. `out`: its request is on its way (set by the key
    worker that sends it, cleared when the attempt ends): only such a slot is held when
    overdue (`_Sliding`). Shared by every meter it was spent in.
    """

    __slots__ = ("t", "extra", "ticket", "out")

    def __init__(self, t: float):
        self.t = t
        self.extra: float | None = None
        self.ticket: Any = None  # the store's grant it was sent on (a shared budget), if any
        self.out = False


class _Ghost(Stamp):
    """Units the server counted that we did not send (`_Sliding.absorb`): kept at the left of
    a window's entries, out of send order."""

    __slots__ = ()


#: Freed entries a sliding window keeps for `WindowLimiter.sync` (at most its limit): more than
#: a key's sends in a round trip at thousands a second.
FREED_KEPT = 1024


class _Sliding:
    """At most `limit` cost units in any window of `window` seconds.

    A slot whose request is still out when its fallback time comes (`send + W + headroom`)
    stays held until the request ends, if by then it has been out four typical round trips
    (`HeadroomFigures.overdue_s`): it may not have reached the server
    yet, and the server would count it from its arrival. A request whose connection waited
    for a second SYN (a server's full accept queue) arrives a second late, in the window
    of the sends made a window after it (live, 50 keys x 100/1s through a proxy whose accept
    queue overflowed: 294 answers of one run took 1.1-1.3 s; such runs drew up to 10 429s,
    one per key; docs/measurements.md)."""

    __slots__ = ("policy", "limit", "window", "entries", "total", "freed", "hold")

    fixed = False  # read per send by even pacing (a class constant, not isinstance)

    def __init__(self, policy: Policy, hold: HeadroomFigures | _Called | None = None):
        self.hold = hold  # `overdue_s`, read only for a slot still out at its fallback time
        self.policy = policy
        self.limit = policy.limit
        self.window = policy.window_s
        self.entries: deque[tuple[Stamp, int]] = deque()  # in send order
        self.total = 0  # cost of the entries
        # The last entries whose slots freed, (send time, cost), in send order: a server's count
        # taken when a request arrived may still hold them when its answer comes back
        # (`WindowLimiter.sync`).
        self.freed: deque[tuple[float, int]] = deque(maxlen=min(max(1, policy.limit), FREED_KEPT))

    def free_at(self, now: float, cost: int, h: float) -> float:
        entries, window = self.entries, self.window
        # Entries whose slot has freed no longer count (for good: headroom only grows their wait).
        while entries:
            stamp, spent = entries[0]
            extra = stamp.extra
            if extra is None:
                if stamp.t + window + h > now or self._overdue(stamp, now):
                    break
            elif stamp.t + window + extra > now:
                break
            entries.popleft()
            self.freed.append((stamp.t, spent))
            self.total -= spent
        excess = self.total + cost - self.limit
        if excess <= 0:
            return now
        if cost > self.limit:
            return math.inf  # can never fit
        # The oldest entries must leave until `cost` fits: the latest of their free times.
        t = now
        for stamp, spent in entries:
            extra = stamp.extra
            free = stamp.t + window + (h if extra is None else extra)
            if free > t:
                t = free
            elif extra is None and free <= now and self._overdue(stamp, now):
                continue  # still out and overdue (above): it keeps its slot, the next ones leave
            excess -= spent
            if excess <= 0:
                return t
        return math.inf  # held slots leave too few: the next answer tells

    def _overdue(self, stamp: Stamp, now: float) -> bool:
        """Whether an unanswered slot, past its fallback time, has been out too long to free."""
        return stamp.out and self.hold is not None and now - stamp.t > self.hold.overdue_s()

    def record(self, stamp: Stamp, cost: int, h: float) -> None:
        self.entries.append((stamp, cost))
        self.total += cost

    def seed(self, other: _Sliding | None) -> None:
        """Start from the most recent sends another meter knows, so adopting a policy never bursts."""
        if other is None:
            return
        for stamp, spent in list(other.entries)[-self.limit :]:
            self.entries.append((stamp, spent))
            self.total += spent

    def absorb(self, units: int, until: float) -> None:
        """Units the server counted that we did not send (another client): they count until `until`."""
        if units <= 0:
            return
        ghost = _Ghost(until - self.window)
        ghost.extra = 0.0
        self.entries.appendleft((ghost, units))  # frees no later than our own oldest: conservative enough
        self.total += units

    def used(self, now: float) -> int:
        return self.spent_after(now - self.window)

    def spent_after(self, start: float) -> int:
        """The cost of the entries sent after `start`: all of them (`total`) less the few sent
        before it. Ghosts sit at the left (`absorb`), our sends after them in send order, so
        the look stops at the first of ours after `start`, not at the window's end (a key at
        100/1s holds about 100 entries, and this runs on every answer with a count)."""
        old = 0
        for stamp, spent in self.entries:
            if stamp.t <= start:
                old += spent
            elif type(stamp) is not _Ghost:
                break
        return self.total - old

    def refund(self, stamp: Stamp, units: int, now: float) -> None:
        entries = self.entries
        for i in range(len(entries) - 1, -1, -1):
            if entries[i][0] is stamp:
                back = min(units, entries[i][1])
                entries[i] = (stamp, entries[i][1] - back)
                self.total -= back
                return


class _Fixed:
    """At most `limit` cost units per window; windows end at `end`, `end + W`, ...

    Windows are aligned to the Unix clock (a 1 m window turns at each whole
    minute, as Binance's do) until the server announces its own reset. A
    window counts as turned `h` after its end, and a send that may reach the
    server after the end (`t + h >= end`) is charged to both windows.
    """

    __slots__ = ("policy", "limit", "window", "end", "used_now", "used_next")

    fixed = True

    def __init__(self, policy: Policy, wall_offset: float, now: float):
        self.policy = policy
        self.limit = policy.limit
        self.window = policy.window_s
        wall = now + wall_offset
        self.end = (math.floor(wall / self.window) + 1) * self.window - wall_offset
        self.used_now = 0
        self.used_next = 0

    def _turn(self, now: float, h: float) -> None:
        while now >= self.end + h:
            self.used_now, self.used_next = self.used_next, 0
            self.end += self.window

    def free_at(self, now: float, cost: int, h: float) -> float:
        self._turn(now, h)
        if self.used_now + cost <= self.limit:
            return now
        if cost > self.limit:
            return math.inf
        if self.used_next + cost <= self.limit:
            return self.end + h
        return self.end + self.window + h

    def record(self, stamp: Stamp, cost: int, h: float) -> None:
        self.used_now += cost
        if stamp.t + h >= self.end:
            self.used_next += cost

    def sync(self, used: int | None, reset_at: float | None, limit: int | None, now: float) -> None:
        """The server's view of the current window: its count, its end, its size."""
        if limit is not None and limit > 0:
            self.limit = limit
        if reset_at is not None and reset_at > now:
            if reset_at > self.end + 0.5 * self.window:
                # The server's window ends later than ours: ours turned too early.
                self.used_now = max(self.used_now, self.used_next)
                self.used_next = 0
            self.end = reset_at
        if used is not None and used > self.used_now:
            self.used_now = used

    def used(self, now: float) -> int:
        return self.used_now if now < self.end else self.used_next

    def refund(self, stamp: Stamp, units: int, now: float) -> None:
        if stamp.t < self.end and now < self.end:  # spent in the window still current
            self.used_now = max(0, self.used_now - units)

    def catch_up_gap(self, now: float, cost: int, h: float) -> float:
        """The gap that spreads what is left of this window over the time left in it.

        A run that starts mid-window, or a token another tool barely used, has
        more quota than the nominal pace would spend before the reset.
        """
        left = self.limit - self.used_now
        if left <= 0 or now >= self.end:
            return math.inf
        return (self.end + h - now) * cost / left


class _Bucket:
    """A leaky bucket: at most `limit` units, draining `rate` per second (GCRA)."""

    __slots__ = ("policy", "limit", "rate", "level", "at")

    def __init__(self, policy: Policy):
        self.policy = policy
        self.limit = policy.limit
        self.rate = policy.rate
        self.level = 0.0  # as of time `at`
        self.at = -math.inf

    def _level(self, t: float) -> float:
        if t <= self.at:
            return self.level
        return max(0.0, self.level - self.rate * (t - self.at))

    def free_at(self, now: float, cost: int, h: float) -> float:
        # Sends in any interval [u, y] reach the server within [u, y + h], so the
        # server's bucket holds at most ours plus what drains in h: keep `rate * h`
        # of it free. (Arrivals are later than sends, which only ever helps.)
        room = self.limit - self.rate * h
        if cost > room:
            return math.inf  # never fits while the headroom is this wide
        level = self._level(now)
        if level + cost <= room:
            return now
        return now + (level + cost - room) / self.rate

    def record(self, stamp: Stamp, cost: int, h: float) -> None:
        self.level = self._level(stamp.t) + cost
        self.at = max(self.at, stamp.t)

    def sync(self, used: int | None, now: float) -> None:
        if used is not None and used > self._level(now):
            self.level, self.at = float(used), now

    def used(self, now: float) -> int:
        return math.ceil(self._level(now))

    def refund(self, stamp: Stamp, units: int, now: float) -> None:
        # The server gives the units back to its bucket when it settles: so do we.
        self.level, self.at = max(0.0, self._level(now) - units), max(self.at, now)

    def follow(self, limit: int, rate: float | None, counted: int, since: int, now: float) -> None:
        """The server's bucket as an answer states it: its size, its refill, and its count
        `counted` at some moment between our send and now, before `since` more of ours.

        The count proves ours wrong either way: above `counted + since` ours is too high
        (the server settled, refilled or charged less), below `counted` too low (it charged
        more, or someone else spends from the key). In between ours stands: an answer that
        took long says little about now (counting `since` twice would strand the budget).
        """
        self.limit = limit
        if rate is not None:
            self.rate = rate
        level = self._level(now)
        if counted + since < level:
            self.level, self.at = float(counted + since), now
        elif counted > level:
            self.level, self.at = float(counted), now


_Meter = _Sliding | _Fixed | _Bucket


class HeadroomFigures(Protocol):
    """The two headroom figures a limiter reads at every decision, in seconds: for a slot
    whose request is not answered yet (`headroom_now_s`), and for the even pace's gap
    (`pace_now_s`). `HeadroomController.figures` keeps both as plain attributes, read
    without a call."""

    headroom_now_s: float
    pace_now_s: float
    #: The even gap's share of its usual where the pace may shorten (not nonce-ordered): below
    #: 1 while the headroom stands on measurement (`headroom.MEASURED_PACE`).
    pace_scale: float

    def overdue_s(self) -> float:
        """How long a request may be out before its slot is held until it ends (`_Sliding`);
        inf: never held."""
        ...


class _Called:
    """`HeadroomFigures` from two callables (a test's, a bench's): a slot is never held."""

    __slots__ = ("_h", "_p")

    pace_scale = 1.0

    @staticmethod
    def overdue_s() -> float:
        return math.inf

    def __init__(self, h: Callable[[], float], p: Callable[[], float]):
        self._h, self._p = h, p

    @property
    def headroom_now_s(self) -> float:
        return self._h()

    @property
    def pace_now_s(self) -> float:
        return self._p()


class WindowLimiter:
    """Grants send slots for one budget (a key's, the host's, a path's) under its policies.

    Attributes:
        pacing: "even" spreads sends at least (W + headroom) / N apart per
            window policy, so a budget never bursts (the server sees steady
            traffic and nonces arrive in order); "burst" lets a full window
            go at once. A bucket is never paced: its size is the burst the
            server allows.
        headroom_s: callable returning the current headroom in seconds; read
            at every decision, so a live change takes effect at once.
        min_spacing: with even pacing, the gap between two sends as a fraction
            of the even gap. Timers fire late (uvloop by up to a millisecond),
            and a gap measured from a late send loses that much every time
            (a late millisecond is a tenth of the gap at 100/s per key); a gap a little shorter than even lets
            the meters, which are exact, set the beat instead. 1.0 keeps every
            gap whole, for nonce-ordered targets.
        pace_slack: with even pacing, how much of its gap a send may go early
            (GCRA's tolerance; 0 to 1, 0 by default). The pace then keeps an
            anchor: when the last send was due at the whole gap, or when it
            went if later; a send that goes early moves it on by a gap only,
            so over a stretch sends still average one a gap. It matters once
            each answered slot frees at its own time (`Stamp.extra`): the
            slots then free unevenly, one just after another now and then,
            and a strict pace holds the second back. That wait is never made
            up: the slot is reused that much later in every window after
            (about 7 ms a slot at 20/1s with 5-45 ms of jitter each way,
            0.006 of the rate). 0 for nonce-ordered targets. With a slack, the
            gap also takes the headroom's `pace_scale` (`HeadroomFigures`).
        wall_offset: Unix time minus loop time, so fixed windows turn at the
            clock's whole minutes and hours as servers' do.
        headroom: where the two headroom figures are read per decision without
            a call (`HeadroomFigures`, a `HeadroomController`'s `figures`); by default from
            `headroom_s` and `pace_s`.
    """

    __slots__ = (
        "policies",
        "pacing",
        "headroom_s",
        "pace_s",
        "min_spacing",
        "wall_offset",
        "_meters",
        "_paced",
        "_even",
        "_one",
        "_hr",
        "_last",
        "_last_cost",
        "_early",
        "_scaled",
        "_recent",
        "spent",
        "returned",
        "sends",
    )

    def __init__(
        self,
        policies: tuple[Policy, ...],
        headroom_s: Callable[[], float],
        pacing: str = "even",
        min_spacing: float = 1.0,
        pace_slack: float = 0.0,
        pace_s: Callable[[], float] | None = None,
        wall_offset: float = 0.0,
        now: float = 0.0,
        headroom: HeadroomFigures | None = None,
    ):
        if not policies:
            raise ValueError("a limiter needs at least one policy")
        self.pacing = Pacing(pacing)
        self.headroom_s = headroom_s  # for slots whose request is not answered yet
        self.pace_s = pace_s or headroom_s  # the headroom the even gap assumes
        self._hr = headroom if headroom is not None else _Called(headroom_s, self.pace_s)
        self.min_spacing = min_spacing
        if not 0.0 <= pace_slack < 1.0:
            raise ValueError(f"pace_slack must be in [0, 1), got {pace_slack}")
        self._early = 1.0 - pace_slack  # a send may go this share of its gap after the anchor
        self._scaled = pace_slack > 0.0  # the gap follows the headroom's `pace_scale` (not nonces)
        self.wall_offset = wall_offset
        self.policies: tuple[Policy, ...] = ()
        self._meters: tuple[_Meter, ...] = ()
        self._paced: tuple[_Sliding | _Fixed, ...] = ()  # the window meters even pacing spaces sends for
        self._even: tuple[_Sliding | _Fixed, ...] = ()  # the same, with even pacing only
        for policy in policies:
            self._add(policy, now)
        self._last = -math.inf  # the pace's anchor: the last send, or when it was due if later
        self._last_cost = 1  # and its cost: the next send is due that much later
        self._recent: deque[tuple[float, int]] = deque(maxlen=1024)  # (send time, cost), for spent_since
        self.spent = 0  # cost units reserved by every send so far
        self.sends = 0  # and how many sends
        self.returned = 0  # and given back when the server charged less (`refund`)

    @property
    def pace_slack(self) -> float:
        """How much of its gap a send may go early (`pace_slack` above)."""
        return 1.0 - self._early

    def _add(self, policy: Policy, now: float) -> None:
        meter: _Meter
        if policy.kind is PolicyKind.FIXED:
            meter = _Fixed(policy, self.wall_offset, now)
        elif policy.kind is PolicyKind.BUCKET:
            meter = _Bucket(policy)
        else:
            meter = _Sliding(policy, self._hr)
            meter.seed(
                max((m for m in self._meters if isinstance(m, _Sliding)), key=lambda m: m.total, default=None)
            )
        self.policies = (*self.policies, policy)
        self._meters = (*self._meters, meter)
        if not isinstance(meter, _Bucket):
            self._set_paced((*self._paced, meter))

    def align(self, wall_offset: float, now: float) -> None:
        """Set the clock's offset (Unix time minus loop time) once the loop runs: fixed windows realign."""
        self.wall_offset = wall_offset
        self._meters = tuple(
            _Fixed(m.policy, wall_offset, now) if isinstance(m, _Fixed) and not m.used_now else m
            for m in self._meters
        )
        self._set_paced(tuple(m for m in self._meters if not isinstance(m, _Bucket)))

    def _set_paced(self, paced: tuple[_Sliding | _Fixed, ...]) -> None:
        """The window meters, and those even pacing spaces sends for (none when it bursts)."""
        self._paced = paced
        self._even = paced if self.pacing is Pacing.EVEN else ()
        even = self._even
        # The usual case, one sliding window paced: its gap is one sum (`_pace_gap`).
        self._one = even[0] if len(even) == 1 and isinstance(even[0], _Sliding) else None

    def next_free(self, now: float, cost: int = 1) -> float:
        """The earliest time >= now at which a send of `cost` keeps every policy."""
        hr = self._hr
        h = hr.headroom_now_s
        meters = self._meters
        if len(meters) == 1:  # most limiters: no loop (free_at is never before now)
            t = meters[0].free_at(now, cost, h)
        else:
            t = now
            for meter in meters:
                free = meter.free_at(now, cost, h)
                if free > t:
                    t = free
        if self._even:
            due = self._last + self._pace_gap(now, h) * self._early
            if due > t:
                t = due
        return t

    def _pace_gap(self, now: float, h: float) -> float:
        """The even gap after the last send (`_gap`): for one paced sliding window, its sum
        alone (most limiters, at every decision)."""
        one = self._one
        if one is not None:
            hr = self._hr
            # `spacing()`, written out: this sum is asked at every decision
            spacing = self.min_spacing * hr.pace_scale if self._scaled else self.min_spacing
            return (one.window + hr.pace_now_s) * spacing * self._last_cost / one.limit
        return self._gap(now, h)

    def _gap(self, now: float, h: float) -> float:
        """The even gap after the last send: the largest its cost earned in any paced meter.

        Each send is due a gap after the last one, the gap its cost earned
        (GCRA's pace): a heavy request delays the next one, it never waits for
        light ones to stop coming. A fixed window with quota to spare spreads it
        over the time left instead of the nominal pace.
        """
        p = self._hr.pace_now_s
        spent = self._last_cost
        spacing = self.spacing()
        gap = 0.0
        for meter in self._even:
            g = (meter.window + p) * spacing * spent / meter.limit
            if meter.fixed:
                assert isinstance(meter, _Fixed)
                g = min(g, meter.catch_up_gap(now, spent, h) * spacing)
            if g > gap:
                gap = g
        return gap

    def spacing(self) -> float:
        """The even gap's share now: `min_spacing`, times the headroom's `pace_scale` where a
        send may go early (`pace_slack`)."""
        return self.min_spacing * self._hr.pace_scale if self._scaled else self.min_spacing

    def pace_due(self) -> float:
        """When the even pace lets the next send go: a bound `next_free` never beats, and
        cheaper to ask (one sliding window paced; -inf otherwise). The same sum as
        `next_free`'s, so the two agree to the bit."""
        if self._one is None:
            return -math.inf
        return self._last + self._pace_gap(0.0, 0.0) * self._early

    def release_pace(self) -> None:
        """The next send is not held by the even pace (the windows still hold it): for sends a
        wait held back that may catch up at once (`KeyLimits._catch_up`)."""
        self._last = -math.inf

    def record(self, at: float, cost: int = 1, stamp: Stamp | None = None) -> Stamp:
        """Note a send at `at` (call only when `next_free(at, cost) <= at`); returns its stamp.

        Pass the `stamp` of the same send when it spends from several limiters,
        so one answer sets the headroom of all its slots.
        """
        if stamp is None:
            stamp = Stamp(at)
        h = self._hr.headroom_now_s
        if self._early != 1.0 and self._even:
            # The pace's anchor: when this send was due at the whole gap (the gap `next_free`
            # saw, before this send is counted), or when it went if later. A send that went
            # early (the slack) moves it only a gap on: over a stretch, sends still average one
            # a gap.
            due = self._last + self._pace_gap(at, h)
            self._last = due if due > at else at
        else:
            self._last = at
        for meter in self._meters:
            meter.record(stamp, cost, h)
        self._last_cost = cost
        self._recent.append((at, cost))
        self.spent += cost
        self.sends += 1
        return stamp

    def sends_since(self, t: float) -> list[float]:
        """The times of the sends after `t` (the last 1,024 at most), oldest first."""
        return [at for at, _ in self._recent if at > t]

    def spent_since(self, t: float) -> int:
        """Cost spent after time `t` (a send the server's answer could not have counted yet)."""
        total = 0
        for at, cost in reversed(self._recent):
            if at <= t:
                break
            total += cost
        return total

    def sync(
        self,
        now: float,
        *,
        used: int | None = None,
        remaining: int | None = None,
        limit: int | None = None,
        reset_at: float | None = None,
        window_s: float | None = None,
        sent_at: float | None = None,
    ) -> int:
        """Take what the server says it has counted (from an answer's headers).

        `used` (or `limit - remaining`) is the server's count when it answered, for the
        request sent at `sent_at`; a fixed window or a bucket adds what we spent after it,
        which the server could not have counted yet (a sliding window compares instead,
        below). `reset_at` (loop time) is when its
        window ends; `window_s` picks the policy it speaks of (else the
        tightest window). Only ever raises our count, never lowers it. Returns what the
        server counted in a sliding window beyond what we sent (someone else's use), else 0.
        """
        if used is None and remaining is not None and limit is not None:
            used = max(0, limit - remaining)
        meter = self._meter_for(window_s)
        if isinstance(meter, (_Fixed, _Bucket)):
            since = self.spent_since(sent_at) if sent_at is not None else 0
            counted = used + since if used is not None else None
            if isinstance(meter, _Fixed):
                meter.sync(counted, reset_at, limit, now)
            else:
                meter.sync(counted, now)
        elif used is not None and used > meter.total:
            # The server counted its window when the answered request arrived: compare
            # with what we sent that could be in it (generously, for arrival times),
            # never with our window now. Only more than that is someone else's use.
            start = (sent_at if sent_at is not None else now) - meter.window - self._hr.headroom_now_s
            ours = meter.spent_after(start)
            # and those whose slots freed while its answer was on its way: gone from ours, still
            # in the server's count (live, 26 sends in 40 s over 5 keys were taken for someone
            # else's, and the key said "someone else used 5% of a window" with nobody there)
            for t, spent in reversed(meter.freed):
                if t <= start:
                    break
                ours += spent
            extra = used - ours
            if extra > 0:
                until = reset_at if reset_at is not None and reset_at > now else now + meter.window
                meter.absorb(extra, until)
                return extra
        return 0

    def _meter_for(self, window_s: float | None) -> _Meter:
        meters = self._meters
        if len(meters) == 1:  # most limiters: the one policy is the one spoken of
            return meters[0]
        if window_s is not None:
            for meter in self._meters:
                if isinstance(meter, (_Sliding, _Fixed)) and abs(meter.window - window_s) < 1e-6:
                    return meter
        return min(self._meters, key=lambda m: m.policy.rate)

    def add_policy(self, policy: Policy, now: float = 0.0) -> bool:
        """Also enforce `policy` from now on (a limit the server advertised, or one learned).

        A new sliding window starts with the most recent sends we know of, so
        adopting a policy never allows a burst. Returns False when an existing
        policy of the same kind is already at least as strict.
        """
        for p in self.policies:
            if p.kind is policy.kind and p.window_s >= policy.window_s and p.limit <= policy.limit:
                return False
        self._add(policy, now)
        return True

    def retune(self, policy: Policy, limit: int) -> bool:
        """Enforce `policy` (one of ours) at `limit` from now on: a key's estimate moved
        (engine/limits/estimate.py). Its window keeps what was sent; False when no meter keeps it."""
        for meter in self._meters:
            if meter.policy is policy and isinstance(meter, _Sliding):
                meter.limit = max(1, limit)
                return True
        return False

    def used(self, now: float) -> tuple[int, int]:
        """(units spent in the current window, its size) for the tightest policy, for display."""
        meter = min(self._meters, key=lambda m: m.policy.rate)
        return meter.used(now), meter.limit

    def refund(self, stamp: Any, units: int, now: float) -> None:
        """Give back `units` of the send stamped `stamp`: the server charged that much less
        (a reservation settled to the real use, an answer the API charges nothing for)."""
        if units <= 0:
            return
        self.returned += units
        for meter in self._meters:
            meter.refund(stamp, units, now)

    def current_policies(self) -> tuple[Policy, ...]:
        """The policies as enforced now (retuned, synced or followed limits; the windows as given)."""
        out = []
        for m in self._meters:
            p = m.policy
            if isinstance(m, _Bucket):
                out.append(Policy(max(1, m.limit), p.window_s, PolicyKind.BUCKET, m.rate * p.window_s))
            elif m.limit != p.limit:
                out.append(Policy(max(1, m.limit), p.window_s, p.kind))
            else:
                out.append(p)
        return tuple(out)

    def policy_for(self, window_s: float | None) -> Policy:
        """The policy a server's count for `window_s` speaks of (else the tightest), as enforced now."""
        meter = self._meter_for(window_s)
        return self.current_policies()[self._meters.index(meter)]

    def _tightest_bucket(self) -> _Bucket | None:
        buckets = [m for m in self._meters if isinstance(m, _Bucket)]
        return min(buckets, key=lambda b: b.rate) if buckets else None

    def bucket(self) -> Policy | None:
        """The tightest bucket policy, as the limiter enforces it now (for display)."""
        m = self._tightest_bucket()
        if m is None:
            return None
        window = m.policy.window_s
        return Policy(m.limit, window, PolicyKind.BUCKET, m.rate * window)

    def follow(self, now: float, limit: int, counted: int, since: int, window_s: float | None) -> bool:
        """An LLM API's bucket as its headers state it (engine/path/request_path.py): `limit` units, refilled
        fully in `window_s` (None: as before), `counted` by the server before `since` more of
        ours (`_Bucket.follow`), lower or higher than ours. Applies to the tightest bucket
        policy; False when there is none."""
        meter = self._tightest_bucket()
        if meter is None:
            return False
        rate = limit / window_s if window_s is not None and window_s > 0 else None
        if rate is None and meter.limit != limit:
            rate = meter.rate * limit / meter.limit  # a new size, refilled over the same window
        meter.follow(limit, rate, counted, since, now)
        return True

    def window_turns(self) -> tuple[tuple[Policy, float | None], ...]:
        """Each policy with the end of its current fixed window (loop time); None for the other kinds."""
        return tuple((m.policy, m.end if isinstance(m, _Fixed) else None) for m in self._meters)

    def standing(self, now: float, pad_s: float = 0.0) -> tuple[tuple[float, float | None], ...]:
        """Where each policy stands at `now` (for the time what remains of a job needs,
        observe/progress.py): the units it lets through at once, and in how many seconds what
        it counts comes back (a fixed window's turn; a sliding window's oldest counted send
        leaving it; None for a bucket, which refills at its rate, or a window counting
        nothing). `pad_s`: a headroom each window keeps past its end. Read only: nothing moves."""
        out: list[tuple[float, float | None]] = []
        for m in self._meters:
            if isinstance(m, _Bucket):
                out.append((float(max(0, m.limit - m.used(now))), None))
            elif isinstance(m, _Fixed):
                end = m.end + pad_s
                turns = math.floor((now - end) / m.window) + 1 if now >= end else 0
                used = m.used_now if turns == 0 else m.used_next if turns == 1 else 0
                out.append((float(max(0, m.limit - used)), end + turns * m.window - now))
            else:
                start = now - m.window - pad_s
                counted = [(stamp.t, spent) for stamp, spent in m.entries if stamp.t > start]
                used = sum(spent for _, spent in counted)
                back = counted[0][0] - start if counted else None
                out.append((float(max(0, m.limit - used)), back))
        return tuple(out)

    def live_rate(self, h: float) -> float:
        """Cost units per second it lets through now: a window spaces sends by (W + h) / N,
        a bucket refills at its rate (as retuned or followed)."""
        return min(m.rate if isinstance(m, _Bucket) else m.limit / (m.window + h) for m in self._meters)

    def settled_cost(self) -> float | None:
        """What one send has cost on average once settled (None before the first)."""
        return (self.spent - self.returned) / self.sends if self.sends else None

    @property
    def capacity_tps(self) -> float:
        """Long-run cost units per second the policies allow together (as retuned or followed)."""
        return self.live_rate(0.0)
