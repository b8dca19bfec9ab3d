"""A job's progress: done of total, and when the rest will be done.

The ETA starts from the limits, so it is right from the first seconds: the
least time the limits allow for what remains is `least(total) - least(done)`
(`makespan.least_time` of the job's units, each over the keys side by side and
every shared budget), that is the limits' steady pace from here on, the
start's burst already spent. The limits are the ones in force: told,
advertised by the server, or learned from its rejections. What one job spends
of each budget is what the jobs that succeeded spent on average (one request,
weight 1, before any).

Once enough is done, the pace observed over the last `PACE_WINDOW_S` (jobs
ended per second, measured again after a stall: keys paused, a cooldown)
says how long the rest takes at that pace; the ETA moves
from the limits' figure toward it as the share done grows to `BLEND_AT`, and
never goes below the limits' figure: nothing finishes faster than the limits
allow. With no limit known yet (the server has not said), the pace alone.

`ProgressMeter` samples the pace on the engine's ticker (never on a request's
path) and builds a snapshot's `Progress`; `eta` is the pure blend.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ratedeck.core.policy import MAX_LIMIT
from ratedeck.engine.snapshot import Progress

from .makespan import Limits, least_time

if TYPE_CHECKING:
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import MeterHost, RunClock, Source

    from .makespan import MakespanMeter
    from .metrics import Metrics

#: The observed pace is measured over this many seconds, the newest.
PACE_WINDOW_S = 10.0
#: The share of the job done at which the ETA follows the observed pace alone (above the limits').
BLEND_AT = 0.2
#: The pace counts only once this many jobs have ended over at least `MIN_PACE_S` seconds.
MIN_PACE_JOBS = 10
MIN_PACE_S = 1.0
#: No ending for `STALL_S` (or `STALL_GAPS` of the usual gap between endings, if longer) is a
#: stall: the pace is measured again from after it.
STALL_S = 2.0
STALL_GAPS = 4.0
_SAMPLE_EVERY_S = 0.25
#: The limits' least time is worked out again at most this often (the console asks ten times a second).
_LEAST_EVERY_S = 0.25

Demands = list[tuple[Sequence[Limits], float]]


def eta(remaining: int, fraction: float, least_s: float | None, pace: float | None) -> float | None:
    """Seconds until the last of `remaining` jobs ends: the limits' `least_s` blended with
    `remaining / pace` (jobs per second observed) by the share done (`fraction` of `BLEND_AT`),
    never below `least_s`; None when neither is known."""
    if remaining <= 0:
        return 0.0
    observed = remaining / pace if pace else None
    if least_s is None:
        return observed
    if observed is None:
        return least_s
    weight = min(1.0, max(0.0, fraction / BLEND_AT))
    return max(least_s, (1.0 - weight) * least_s + weight * observed)


class ProgressMeter:
    """Done of total for a job of known size (`Source.job_total`), with its ETA (see the module)."""

    def __init__(
        self,
        source: Source,
        host: MeterHost,
        run: RunClock,
        metrics: Metrics,
        makespan: MakespanMeter | None,
    ):
        self.source = source
        self.host = host  # the keys and the budgets
        self.run = run
        self.metrics = metrics  # where requests ended
        self.makespan = makespan  # what the jobs that succeeded spent, each fixed window's first turn
        self._samples: deque[tuple[float, int]] = deque()  # (when, jobs ended by then), oldest first
        self._changed_at = 0.0  # when the count of jobs ended last moved
        self._least: tuple[float, int, float | None] | None = None  # (when, done, least_s), kept a while

    def done(self) -> int:
        """Requests that ended, in any place."""
        m = self.metrics
        return m.succeeded + m.uncertain + m.expired + m.graveyard + m.shed

    def tick(self, now: float) -> None:
        """The engine's ticker (ten times a second): sample the pace when jobs ended since the
        last tick; after a stall the pace starts again."""
        if self.source.job_total is None:
            return
        done = self.done()
        samples = self._samples
        if samples and done == samples[-1][1]:
            return
        if samples and now - self._changed_at > self._gap():
            samples.clear()  # a stall (keys paused, a cooldown): the pace is measured from after it
        self._changed_at = now
        if not samples or now - samples[-1][0] >= _SAMPLE_EVERY_S:
            samples.append((now, done))
            while len(samples) > 2 and now - samples[1][0] >= PACE_WINDOW_S:
                samples.popleft()
        else:
            samples[-1] = (samples[-1][0], done)  # a burst counts with the sample before it

    def _gap(self) -> float:
        """How long without an ending is a stall: `STALL_S`, or `STALL_GAPS` of the window's mean
        gap between endings when that is longer (slow answers are a pace, not a stall)."""
        samples = self._samples
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        mean_gap = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
        return max(STALL_S, STALL_GAPS * mean_gap)

    def pace(self) -> float | None:
        """Jobs ended per second over the last `PACE_WINDOW_S`, first sample to last (a job sent in
        bursts is measured burst to burst); None until enough have, or when none ended lately."""
        samples = self._samples
        if len(samples) < 2:
            return None
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        span = t1 - t0
        if span < MIN_PACE_S or n1 - n0 < MIN_PACE_JOBS or self.run.clock() - t1 > PACE_WINDOW_S:
            return None
        return (n1 - n0) / span

    def view(self, rtt_s: float, final: bool = False) -> Progress | None:
        """The job's `Progress` (None when its size is not known); `rtt_s` is the median round
        trip, `final` a stopped run's (no time left to tell)."""
        total = self.source.job_total
        if total is None:
            return None
        done, generated = self.done(), self.metrics.generated
        remaining = max(0, total - done)
        if final or remaining == 0:
            return Progress(total, done, 0.0 if remaining == 0 else None, 0.0 if remaining == 0 else None)
        least = self._least_for(total, done, rtt_s)
        source = self.source
        if least is not None and not source.fed and source.rate > 0:
            least = max(least, (total - generated) / source.rate)  # arrivals at their rate
        fraction = done / total if total else 1.0
        return Progress(total, done, eta(remaining, fraction, least, self.pace()), least)

    def _least_for(self, total: int, done: int, rtt_s: float) -> float | None:
        now = self.run.clock()
        cached = self._least
        if cached is not None and (cached[1] == done or now - cached[0] < _LEAST_EVERY_S):
            return cached[2]
        least = self.least_remaining(total, done, rtt_s)
        self._least = (now, done, least)
        return least

    def least_remaining(self, total: int, done: int, rtt_s: float = 0.0) -> float | None:
        """The least seconds the limits in force allow for jobs `done`+1 to `total` at their steady
        pace, plus one round trip; None when a key's limit is not known yet."""
        whole, part = self._demands(total), self._demands(done)
        if whole is None or part is None:
            return None
        rest = least_time(whole) - least_time(part)
        if not math.isfinite(rest):
            return None
        return max(0.0, rest) + max(0.0, rtt_s)

    def _demands(self, jobs: int) -> Demands | None:
        """What `jobs` jobs spend of each budget, with the budgets' limits in force."""
        host = self.host
        meter = self.makespan
        live = [w for w in host.workers if not w.blocked] or list(host.workers)
        keys = [self._limits(w.limiter) for w in live]
        if any(p.limit >= MAX_LIMIT for k in keys for p in k.policies):
            return None  # a key sends one at a time until its server says its limit
        succeeded = meter.jobs if meter is not None else 0
        per_job = meter.key_units / succeeded if meter is not None and succeeded else 1.0
        demands: Demands = [(keys, jobs * per_job)]
        if host.host_limiter is not None:
            demands.append(([self._limits(host.host_limiter)], jobs))
        if meter is None or not succeeded:
            return demands
        for name, units in meter.budget_units.items():
            shared = host.budgets.host.get(name)
            if shared is None and any(name not in w.key_budgets for w in live):
                continue  # a budget per key and model: each model's share of the job is not known
            group = [self._limits(shared)] if shared is not None else [
                self._limits(w.key_budgets[name]) for w in live
            ]  # fmt: skip
            demands.append((group, jobs * units / succeeded))
        return demands

    def _limits(self, lim: WindowLimiter) -> Limits:
        turns = self.makespan.first_turns(lim) if self.makespan is not None else ()
        return Limits(lim.current_policies(), turns)


def merge_progress(parts: Sequence[Progress | None]) -> Progress | None:
    """Processes that share one job (`--procs` with `--total`): sizes and counts add, the
    slowest part sets both times (unknown if any part's is)."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    etas = [p.eta_s for p in known]
    leasts = [p.least_s for p in known]
    return Progress(
        sum(p.total for p in known),
        sum(p.done for p in known),
        None if None in etas else max(e for e in etas if e is not None),
        None if None in leasts else max(x for x in leasts if x is not None),
    )
