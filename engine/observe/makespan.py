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
budget) holds on its own, and with limits per key and model (engine/path/lanes.py)
each model's lane on each key holds for that model's jobs. The least time is
the earliest t at which every budget lets the job's units through, plus one
round trip for the last answer to come back. `least_time` is pure: numbers
in, seconds out. The same count from where a limiter stands now (what it
lets through at once, when what it counts comes back: `Limits.free`) is what
remains of a job's least time (observe/progress.py).

`MakespanMeter` is the engine's finish watcher for a job run: it counts what
each succeeded request spent (per model lane too), and when the last one
finished.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratedeck.core.policy import Policy
from ratedeck.core.vocab import Ending, PolicyKind
from ratedeck.engine.snapshot import Makespan

if TYPE_CHECKING:
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import MeterHost, RunClock
    from ratedeck.engine.request import Request

_EPS = 1e-9
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class Limits:
    """One budget's policies (all hold) and where each stands when the count starts.

    From a fresh start (`free` empty): each lets its whole limit through at once, and
    `first_turns[i]` is fixed window i's first turn in seconds (None or missing: a whole
    window). From where a limiter stands now (`WindowLimiter.standing`): `free[i]` is what
    policy i lets through at once, and `first_turns[i]` when what it counts comes back (a
    fixed window's turn, a sliding window's oldest counted send leaving it). `pad_s`: the
    headroom a limiter keeps (a sliding window's slot comes back `pad_s` after its window, a
    bucket keeps what it refills in `pad_s` free); 0 for the limits alone.
    """

    policies: tuple[Policy, ...]
    first_turns: tuple[float | None, ...] = ()
    free: tuple[float | None, ...] = ()
    pad_s: float = 0.0

    def turn(self, i: int) -> float | None:
        return self.first_turns[i] if i < len(self.first_turns) else None

    def room(self, i: int) -> float | None:
        return self.free[i] if i < len(self.free) else None


def policy_allows(
    policy: Policy, t: float, first_turn: float | None = None, free: float | None = None, pad_s: float = 0.0
) -> float:
    """Units `policy` lets through in [0, t], all sent as early as allowed: from a fresh start,
    or (`free`) from where it stands, with a limiter's headroom `pad_s` (see `Limits`)."""
    if t < 0:
        return 0.0
    limit = policy.limit
    now = float(limit) if free is None else max(0.0, min(free, float(limit)))
    if policy.kind is PolicyKind.BUCKET:
        return max(0.0, now - policy.rate * pad_s) + policy.rate * t
    w = policy.window_s
    back = w + pad_s if first_turn is None or first_turn <= 0 else first_turn
    if policy.kind is PolicyKind.FIXED:
        if t + _EPS < back:
            return now
        return now + limit * (1 + math.floor((t - back) / w + _EPS))
    w += pad_s
    # A sliding window: what it lets through now comes back a window later, and so on; what it
    # counts comes back (at the earliest, all of it with the oldest) and then each window after.
    allowed = now * (1 + math.floor(t / w + _EPS))
    if limit - now > 0 and t + _EPS >= back:
        allowed += (limit - now) * (1 + math.floor((t - back) / w + _EPS))
    return allowed


def allows(limits: Limits, t: float) -> float:
    """Units one budget lets through in [0, t]: its tightest policy's."""
    return min(
        policy_allows(p, t, limits.turn(i), limits.room(i), limits.pad_s)
        for i, p in enumerate(limits.policies)
    )


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


#: Demands on the budgets: (budgets side by side, units the job spends from them).
Demands = list[tuple[Sequence["Limits"], float]]


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

    With limits per key and model (engine/path/lanes.py) it also counts, per
    model lane, the requests that ended, those that succeeded and what they
    spent of each budget per key and model: each lane is a budget of its own
    (`lane_demands`).
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
        # id(limiter) -> (its fixed windows' first turns, its buckets' levels at the start)
        self._start: dict[int, tuple[tuple[float | None, ...], tuple[float | None, ...]]] = {}
        self.ended_by_model: dict[str, int] = {}  # every ending, by model lane (limits per model)
        self.jobs_by_model: dict[str, int] = {}  # successes, by model lane
        self.model_units: dict[tuple[str, str], int] = {}  # (budget, model) -> what its successes spent
        self._lanes: Any = _UNSET  # a key's ModelLanes, which name a request's lane (None: not per model)
        self._least: tuple[float, float] | None = None  # (when, least time): a running view's cache

    def finished(self, req: Request, ending: Ending) -> None:
        lanes = self.model_lanes()
        model = lanes.model_of(req) if lanes is not None else None
        if model is not None:
            self.ended_by_model[model] = self.ended_by_model.get(model, 0) + 1
        if ending is not Ending.SUCCEEDED:
            return
        host = self.host
        self._note_turns(req.key, model)
        self.jobs += 1
        self.requests += 1
        self.last_at = self.run.clock()
        route = host.budgets.route(req)
        if not any(spec.exclusive for spec in route.budgets):
            self.key_units += route.weight if self.key_weighted else 1
        for spec in route.budgets:
            cost = route.cost(spec)
            self.budget_units[spec.name] = self.budget_units.get(spec.name, 0) + cost
            if model is not None and spec.per_model:
                unit = (spec.name, model)
                self.model_units[unit] = self.model_units.get(unit, 0) + cost
        if model is not None:
            self.jobs_by_model[model] = self.jobs_by_model.get(model, 0) + 1

    def model_lanes(self) -> Any:
        """A key's `ModelLanes` (every key's name a request's lane the same way), or None when no limit
        holds per model."""
        if self._lanes is _UNSET:
            self._lanes = next(
                (w.limits.lanes for w in self.host.workers if w.limits.lanes is not None), None
            )
        return self._lanes

    def lane_demands(
        self, live: Sequence[Any], jobs: Mapping[str, float], limits: Callable[[WindowLimiter], Limits]
    ) -> Demands:
        """What `jobs` (jobs per model lane) spend of each model's own buckets, the keys `live`
        side by side: its requests (when the key's own limit holds per model) and each budget
        per key and model, at what that model's successes spent on average (the others' before
        any of its own; not counted before any success at all). A lane a key has not made yet
        stands at the limits it will start from (the key's told limits, the budget's).
        `limits` reads a limiter's policies (in force, or told and advertised)."""
        lanes = self.model_lanes()
        if lanes is None:
            return []
        budgets = self.host.budgets
        specs = budgets.model_specs
        per_job = self.key_units / self.jobs if self.jobs else 1.0
        demands: Demands = []
        for model, n in jobs.items():
            if n <= 0:
                continue
            made = [w.limits.lanes.by_model.get(model) for w in live]
            if lanes.per_model_requests:
                group = [
                    limits(lane.limiter)
                    if lane is not None and lane.limiter is not None
                    else limits(w.limiter)
                    for w, lane in zip(live, made, strict=True)
                ]
                demands.append((group, n * per_job))
            for spec in specs:
                units = self._units_per_job(spec.name, model)
                if units is None:
                    continue
                group = [
                    limits(lane.own[spec.name])
                    if lane is not None and spec.name in lane.own
                    else Limits(spec.policies)
                    for lane in made
                ]
                demands.append((group, n * units))
        return demands

    def _units_per_job(self, budget: str, model: str) -> float | None:
        """What one job of `model` spends of its lane's `budget`: its successes' mean, else all
        models' mean; None before any success."""
        jobs = self.jobs_by_model.get(model, 0)
        if jobs:
            return self.model_units.get((budget, model), 0) / jobs
        if self.jobs:
            return self.budget_units.get(budget, 0) / self.jobs
        return None

    def _note_turns(self, label: str | None, model: str | None = None) -> None:
        """Each fixed window's first turn and each bucket's level at the start (`_start_levels`),
        read once the first answer could set them: a key's limiters at that key's first success
        (its answer synced them to the server's reset and remaining count), a model's own at
        the first success of that model on that key, the shared ones at the first success of all."""
        host = self.host
        lims: list[WindowLimiter] = []
        if not self._start:
            lims += list(host.budgets.host.values())
            if host.host_limiter is not None:
                lims.append(host.host_limiter)
        for w in host.workers:
            if w.label != label:
                continue
            if id(w.limiter) not in self._start:
                lims += [w.limiter, *w.key_budgets.values()]
            lane = w.limits.lanes.by_model.get(model) if model is not None and w.limits.lanes else None
            if lane is not None:  # this model's own buckets on this key
                lims += [lim for _, lim in lane.buckets()]
        for lim in lims:
            if id(lim) not in self._start:
                self._start[id(lim)] = (self._first_turns(lim), self._start_levels(lim))

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

    def _start_levels(self, lim: WindowLimiter) -> tuple[float | None, ...]:
        """What each bucket held when the run started, as the first answer that could set it
        tells (the server's remaining count, followed): its level now plus what was sent from
        it since, at most its size (None for windows: they start whole). A run resumed just
        after another, or beside another client, finds the server's bucket part spent; its
        least time counted from a full bucket took the whole burst for granted (a job of 143
        resumed on a bucket of 120 a minute read "least 11.8 s: ratio 5.9" for 70 s of work
        the server allowed no faster)."""
        sent = float(lim.spent - lim.returned)
        return tuple(
            min(float(p.limit), free + sent) if p.kind is PolicyKind.BUCKET else None
            for p, (free, _back) in zip(lim.current_policies(), lim.standing(self.run.clock()), strict=True)
        )

    def first_turns(self, lim: WindowLimiter) -> tuple[float | None, ...]:
        """Each fixed window's first turn of `lim` in seconds after the start, as noted at the first
        success that could set it (() before: a whole window)."""
        return self._start.get(id(lim), ((), ()))[0]

    def _limits(self, lim: WindowLimiter, skip: Policy | None = None) -> Limits:
        turns, levels = self._start.get(id(lim), ((), ()))
        rows = [
            # a bucket as its server's headers set it (followed), from its level at the start;
            # the others as given (a retuned estimate is ours, not the server's)
            (
                now if now.kind is PolicyKind.BUCKET else p,
                turns[i] if i < len(turns) else None,
                levels[i] if i < len(levels) else None,
            )
            for i, (p, now) in enumerate(zip(lim.policies, lim.current_policies(), strict=True))
            if p is not skip
        ]
        return Limits(
            tuple(p for p, _, _ in rows), tuple(t for _, t, _ in rows), tuple(v for _, _, v in rows)
        )

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
        lanes = self.model_lanes()
        demands: Demands = []
        if lanes is None or not lanes.per_model_requests:  # else each model's lane holds requests
            keys = [self._limits(w.limiter, skip=w.learned_limit) for w in live]
            demands.append((keys, self.key_units))
        if host.host_limiter is not None:
            demands.append(([self._limits(host.host_limiter)], self.requests))
        for name, units in self.budget_units.items():
            shared = host.budgets.host.get(name)
            if shared is not None:
                demands.append(([self._limits(shared)], units))
            elif all(name in w.key_budgets for w in live):  # one per key (per key and model: below)
                demands.append(([self._limits(w.key_budgets[name]) for w in live], units))
        demands += self.lane_demands(live, self.jobs_by_model, self._limits)
        least = least_time(demands, rtt_s)
        self._least = (now, least)
        return Makespan(self.jobs, elapsed, least)
