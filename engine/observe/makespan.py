"""The makespan ratio: how long a job took over the least time the server's rules allow.

A job is N units of work, each done once. The least time to finish it is
set by the limits alone, counting their bursts:

- a sliding window of L per W lets L through at once, then L more each W:
  by time t, `L * (floor(t / W) + 1)`;
- a fixed window does the same from its first turn: L at once, L more at
  the turn (`first_turn` seconds after the start; a full window when
  unknown), and at every window after it;
- a leaky bucket of C draining r per second lets C through at once, then
  r per second: `C + r * t`.

Several policies of one budget all hold (the least of them); several keys
work side by side (their sums); each shared budget (a host's limit, a named
budget) holds on its own. The least time is the earliest t at which every
budget lets the job's units through, plus one round trip for the last
answer to come back. `least_time` is pure: numbers in, seconds out.

`MakespanMeter` is the engine's finish watcher for a job run: it counts what
each succeeded request spent, and when the last one finished.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratedeck.core.policy import Policy
from ratedeck.core.vocab import Ending, PolicyKind
from ratedeck.engine.snapshot import Makespan

if TYPE_CHECKING:
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import MeterHost, RunClock
    from ratedeck.engine.request import Request

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Limits:
    """One budget's policies (all hold), and each fixed window's first turn in seconds after the
    start (`first_turns[i]` for `policies[i]`; None or missing: a whole window)."""

    policies: tuple[Policy, ...]
    first_turns: tuple[float | None, ...] = ()

    def turn(self, i: int) -> float | None:
        return self.first_turns[i] if i < len(self.first_turns) else None


def policy_allows(policy: Policy, t: float, first_turn: float | None = None) -> float:
    """Units `policy` lets through in [0, t] from a fresh start (all sent as early as allowed)."""
    if t < 0:
        return 0.0
    if policy.kind is PolicyKind.BUCKET:
        return policy.limit + policy.rate * t
    w = policy.window_s
    if policy.kind is PolicyKind.FIXED:
        turn = w if first_turn is None or first_turn <= 0 else first_turn
        if t + _EPS < turn:
            return float(policy.limit)
        return policy.limit * (2 + math.floor((t - turn) / w + _EPS))
    return policy.limit * (1 + math.floor(t / w + _EPS))


def allows(limits: Limits, t: float) -> float:
    """Units one budget lets through in [0, t]: its tightest policy's."""
    return min(policy_allows(p, t, limits.turn(i)) for i, p in enumerate(limits.policies))


def time_for(group: Sequence[Limits], units: float) -> float:
    """The earliest t at which budgets working side by side (keys) let `units` through together."""
    if units <= 0 or not group:
        return 0.0
    alike = Counter(group).items()  # keys usually share their limits: each kind counted once

    def enough(t: float) -> bool:
        return sum(n * allows(g, t) for g, n in alike) + _EPS >= units

    if enough(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while not enough(hi):
        lo, hi = hi, hi * 2
        if hi > 1e12:
            return math.inf
    # The step functions reach `units` at a window's turn: bisect to it.
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def least_time(demands: Iterable[tuple[Sequence[Limits], float]], rtt_s: float = 0.0) -> float:
    """The least time to do a job: every demand is (budgets side by side, units the job spends
    from them); the slowest sets the pace, plus one round trip (`rtt_s`) for the last answer."""
    slowest = max((time_for(group, units) for group, units in demands), default=0.0)
    return slowest + max(0.0, rtt_s)


def merge_makespans(parts: Sequence[Makespan | None]) -> Makespan | None:
    """Processes that worked one job side by side (`--procs`): jobs add, the slowest sets both times."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    return Makespan(
        sum(p.jobs for p in known), max(p.elapsed_s for p in known), max(p.least_s for p in known)
    )


class MakespanMeter:
    """A finish watcher for a job run: what the succeeded requests spent, and when the last ended.

    Units are counted per budget as the key workers spend them (`Budgets.route`):
    a key's own limits count weight with `key_weighted`, else requests; a named
    budget counts weight when it is weighted. Each fixed window's first turn is
    read from the limiter when the first job ends (by then aligned to the
    clock or to the reset the server announced).
    """

    def __init__(self, host: MeterHost, run: RunClock, key_weighted: bool = False):
        self.host = host  # the keys and the budgets
        self.run = run
        self.key_weighted = key_weighted
        self.jobs = 0
        self.requests = 0
        self.key_units = 0
        self.budget_units: dict[str, int] = {}
        self.last_at: float | None = None
        self._turns: dict[int, tuple[float | None, ...]] = {}  # id(limiter) -> first turns
        self._least: tuple[float, float] | None = None  # (when, least time): a running view's cache

    def finished(self, req: Request, ending: Ending) -> None:
        if ending is not Ending.SUCCEEDED:
            return
        host = self.host
        self._note_turns(req.key)
        self.jobs += 1
        self.requests += 1
        self.last_at = self.run.clock()
        route = host.budgets.route(req)
        if not any(spec.exclusive for spec in route.budgets):
            self.key_units += route.weight if self.key_weighted else 1
        for spec in route.budgets:
            self.budget_units[spec.name] = self.budget_units.get(spec.name, 0) + route.cost(spec)

    def _note_turns(self, label: str | None) -> None:
        """Each fixed window's first turn, read once the first answer could set it: a key's
        limiters at that key's first success (its answer synced them to the server's reset),
        the shared ones at the first success of all."""
        host = self.host
        lims: list[WindowLimiter] = []
        if not self._turns:
            lims += list(host.budgets.host.values())
            if host.host_limiter is not None:
                lims.append(host.host_limiter)
        for w in host.workers:
            if w.label == label and id(w.limiter) not in self._turns:
                lims += [w.limiter, *w.key_budgets.values()]
        for lim in lims:
            self._turns[id(lim)] = self._first_turns(lim)

    def _first_turns(self, lim: WindowLimiter) -> tuple[float | None, ...]:
        start = self.run.started_at
        turns: list[float | None] = []
        for policy, end in lim.window_turns():
            if end is None:
                turns.append(None)
                continue
            # A server's window may run a little past the told one (GitHub's reset is a whole
            # second): keep it; only a later window's end (a first success after a wait) goes back.
            first = end - start
            while first > 1.5 * policy.window_s:
                first -= policy.window_s
            turns.append(first if first > 0 else None)
        return tuple(turns)

    def first_turns(self, lim: WindowLimiter) -> tuple[float | None, ...]:
        """Each fixed window's first turn of `lim` in seconds after the start, as noted at the first
        success that could set it (() before: a whole window)."""
        return self._turns.get(id(lim), ())

    def _limits(self, lim: WindowLimiter, skip: Policy | None = None) -> Limits:
        turns = self.first_turns(lim)
        pairs = [
            # a bucket as its server's headers set it (followed); the others as given (a retuned
            # estimate is ours, not the server's)
            (now if now.kind is PolicyKind.BUCKET else p, turns[i] if i < len(turns) else None)
            for i, (p, now) in enumerate(zip(lim.policies, lim.current_policies(), strict=True))
            if p is not skip
        ]
        return Limits(tuple(p for p, _ in pairs), tuple(t for _, t in pairs))

    def view(self, rtt_s: float, final: bool = True) -> Makespan:
        """The makespan so far: `rtt_s` is the round trip the least time adds (the median answer).

        While the run lasts (`final` false) the least time is worked out at most once a
        second (snapshots come ten times a second); the final view is always exact.
        """
        host = self.host
        if self.last_at is None:
            return Makespan()
        elapsed = max(0.0, self.last_at - self.run.started_at)
        now = self.run.clock()
        if not final and self._least is not None and now - self._least[0] < 1.0:
            return Makespan(self.jobs, elapsed, self._least[1])
        # The limits the engine knows: told and advertised (a limit learned from rejections is ours, not the server's).
        # A key the server refused for good (a bad key, no quota) allows nothing.
        live = [w for w in host.workers if not w.blocked] or list(host.workers)
        keys = [self._limits(w.limiter, skip=w.learned_limit) for w in live]
        demands: list[tuple[Sequence[Limits], float]] = [(keys, self.key_units)]
        if host.host_limiter is not None:
            demands.append(([self._limits(host.host_limiter)], self.requests))
        for name, units in self.budget_units.items():
            shared = host.budgets.host.get(name)
            if shared is not None:
                demands.append(([self._limits(shared)], units))
            elif name in live[0].key_budgets:  # a budget per key and model: its lanes are not counted
                demands.append(([self._limits(w.key_budgets[name]) for w in live], units))
        least = least_time(demands, rtt_s)
        self._least = (now, least)
        return Makespan(self.jobs, elapsed, least)
