"""A job's progress: done of total, and when the rest will be done.

The least time (`least`) is what the limits allow for what remains, from where
each limiter stands now: the jobs not yet sent (not ended, not in flight) spend
what is free at once of every budget (what is left of a bucket's burst, of a
window's quota), then what each refills or turns (`makespan.least_time` over
`Limits` read from `WindowLimiter.standing`), plus one round trip. Every budget
that binds the job counts: each key's own limits, the host's, the named budgets
(per key or shared), and with limits per key and model (engine/path/lanes.py,
OpenAI's and Anthropic's) each model's lane of each key, in each unit
(requests, weight, tokens). The limits are the ones in force: told, advertised
by the server (the x-ratelimit-* headers of the first answers replace a
preset's start), or learned from its rejections, and the server's own counts
where it sent them. What one job spends of a budget is what the jobs that
succeeded spent on average (of its own model's, for a model's lane); before
any success, one request, weight 1, and no token budget.

A model's share of the job: a workload file's lines are counted per model in
its check pass, before the run (`Source.job_models`), so the share is exact
from the first snapshot. Work whose models are not counted up front (a store's
jobs) is split as what the keys sent so far is: right for work that mixes its
models, a guess for work sorted by model; before anything is sent, the keys'
own limits stand for every model.

The ETA is the later of three figures:
- the least time;
- the same count with the engine's own brakes: each limiter's headroom, as its
  answered slots keep it on average and at most a round trip (a window's slot
  comes back that much later, a bucket keeps that much of its refill free),
  and each key's pinned in-flight size over the median round trip (a key never
  has more than that many requests a round trip; a burst the limits allow is
  spent no faster; an "auto" size counts at its ceiling, since it grows
  while it holds the key back);
- the pace observed (jobs ended per second over the last `PACE_WINDOW_S`,
  measured again after a stall: keys paused, a cooldown), once at least
  `MIN_PACE_JOBS` ended over `MIN_PACE_S` and two round trips (answers that
  come back in waves a round trip apart are measured wave to wave): at the slower of the whole window's
  pace and its newer half's, so a burst at the start (a bucket's full burst
  spent, then its refill) is not extrapolated; a pace still rising (the newer
  half `PACE_RISING` faster than the older, as the engine settles its headroom
  and in-flight sizes) is not used, the brakes' figure stands.
So nothing finishes faster than the limits allow, a burst left over counts as
a burst and the rest at the refill, and a pace the limits do not explain (slow
answers, a server that queues, retries) wins. With no limit known yet (the
server has not said), the pace alone.

`ProgressMeter` samples the pace on the engine's ticker (never on a request's
path) and builds a snapshot's `Progress`; `eta` is the pure rule.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ratedeck.core.policy import MAX_LIMIT, Policy
from ratedeck.core.vocab import PolicyKind
from ratedeck.engine.snapshot import Progress

from .makespan import Demands, Limits, least_time

if TYPE_CHECKING:
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import MeterHost, RunClock, Source

    from .makespan import MakespanMeter
    from .metrics import Metrics

#: The observed pace is measured over this many seconds, the newest.
PACE_WINDOW_S = 10.0
#: The pace counts only once this many jobs have ended over at least `MIN_PACE_S` seconds and
#: `PACE_RTTS` round trips (answers that come back in waves a round trip apart: a span of one
#: wave's front measures the wave, not the pace).
MIN_PACE_JOBS = 10
MIN_PACE_S = 1.0
PACE_RTTS = 2.0
#: A window's newer half this much faster than its older half is a pace still rising.
PACE_RISING = 0.1
#: No ending for `STALL_S` (or `STALL_GAPS` of the usual gap between endings, or `STALL_RTTS`
#: round trips, if longer) is a stall: the pace is measured again from after it.
STALL_S = 2.0
STALL_GAPS = 4.0
STALL_RTTS = 2.0
_SAMPLE_EVERY_S = 0.25
#: The least time is worked out again at most this often (the console asks ten times a second).
_LEAST_EVERY_S = 0.25

LimitsOf = Callable[["WindowLimiter"], Limits]


def eta(remaining: int, least_s: float | None, pace: float | None) -> float | None:
    """Seconds until the last of `remaining` jobs ends: the later of `least_s` (what the
    limits allow, or the engine's brakes) and `remaining / pace` (jobs per second observed);
    None when neither is known."""
    if remaining <= 0:
        return 0.0
    observed = remaining / pace if pace else None
    if least_s is None:
        return observed
    if observed is None:
        return least_s
    return max(least_s, observed)


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
        self.makespan = makespan  # what the jobs that succeeded spent, per model too
        self._samples: deque[tuple[float, int]] = deque()  # (when, jobs ended by then), oldest first
        self._changed_at = 0.0  # when the count of jobs ended last moved
        self._rtt_s = 0.0  # the median round trip, as the last view was told
        # (when, done, least_s, the brakes' figure), kept a while
        self._least: tuple[float, int, float | None, float | None] | None = None

    def done(self) -> int:
        """Requests that ended, in any place."""
        m = self.metrics
        return m.succeeded + m.uncertain + m.expired + m.graveyard + m.shed

    # ------------------------------------------------------------ the pace observed
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
        gap between endings, or `STALL_RTTS` round trips, when longer (slow answers are a pace,
        not a stall, and answers that come back a round trip after they went, in waves, too)."""
        samples = self._samples
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        mean_gap = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
        return max(STALL_S, STALL_GAPS * mean_gap, STALL_RTTS * self._rtt_s)

    def _closed(self) -> list[tuple[float, int]]:
        """The samples whose count is final: the newest fills for `_SAMPLE_EVERY_S` after it
        was taken (a burst counts with the sample before it), and is left out until then."""
        samples = list(self._samples)
        if len(samples) > 1 and self.run.clock() - samples[-1][0] < _SAMPLE_EVERY_S:
            samples.pop()
        return samples

    def pace(self) -> float | None:
        """Jobs ended per second over the last `PACE_WINDOW_S`, first sample to last (a job sent in
        bursts is measured burst to burst); None until enough have, or when none ended lately."""
        return self._pace(self._closed())

    def _pace(self, samples: list[tuple[float, int]]) -> float | None:
        if len(samples) < 2:
            return None
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        span = t1 - t0
        least_span = max(MIN_PACE_S, PACE_RTTS * self._rtt_s)
        if span < least_span or n1 - n0 < MIN_PACE_JOBS or self.run.clock() - t1 > PACE_WINDOW_S:
            return None
        return (n1 - n0) / span

    def rest_pace(self) -> float | None:
        """The pace the rest is foreseen at: the slower of the window's (`pace`) and its newer
        half's (a burst at the start is not extrapolated); None while the newer half is
        `PACE_RISING` faster than the older (a pace still rising says little of the rest).
        Halves shorter than `MIN_PACE_S` or `MIN_PACE_JOBS` tell no trend: the window's pace."""
        samples = self._closed()
        whole = self._pace(samples)
        if whole is None:
            return None
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        tm, nm = next(s for s in samples if s[0] >= t0 + (t1 - t0) / 2)
        if not t0 < tm < t1 or t1 - tm < max(MIN_PACE_S, PACE_RTTS * self._rtt_s) or n1 - nm < MIN_PACE_JOBS:
            return whole  # halves too short to tell a trend from the noise
        older, newer = (nm - n0) / (tm - t0), (n1 - nm) / (t1 - tm)
        if newer > older * (1.0 + PACE_RISING):
            return None
        return min(whole, newer) if newer > 0 else whole

    # ------------------------------------------------------------ the snapshot's figures
    def view(self, rtt_s: float, final: bool = False) -> Progress | None:
        """The job's `Progress` (None when its size is not known); `rtt_s` is the median round
        trip, `final` a stopped run's (no time left to tell)."""
        total = self.source.job_total
        if total is None:
            return None
        self._rtt_s = max(0.0, rtt_s)
        done, generated = self.done(), self.metrics.generated
        remaining = max(0, total - done)
        if final or remaining == 0:
            return Progress(total, done, 0.0 if remaining == 0 else None, 0.0 if remaining == 0 else None)
        least, braked = self._least_for(total, done, rtt_s)
        source = self.source
        if least is not None and not source.fed and source.rate > 0:
            arrivals = (total - generated) / source.rate  # arrivals at their rate
            least = max(least, arrivals)
            braked = max(braked, arrivals) if braked is not None else None
        floor = max(braked, least) if braked is not None and least is not None else least
        pace = self.rest_pace() if floor is not None else self.pace()
        return Progress(total, done, eta(remaining, floor, pace), least)

    def _least_for(self, total: int, done: int, rtt_s: float) -> tuple[float | None, float | None]:
        now = self.run.clock()
        cached = self._least
        if cached is not None and (cached[1] == done or now - cached[0] < _LEAST_EVERY_S):
            return cached[2], cached[3]
        least = self.least_remaining(total, done, rtt_s)
        braked = self.least_remaining(total, done, rtt_s, brakes=True) if least is not None else None
        self._least = (now, done, least, braked)
        return least, braked

    def least_remaining(
        self, total: int, done: int, rtt_s: float = 0.0, brakes: bool = False
    ) -> float | None:
        """The least seconds the limits in force allow for what remains of the job, from where
        each limiter stands now, plus one round trip; None when a key's limit is not known yet.
        With `brakes`, each limiter's headroom and each key's in-flight size count too.

        What remains to send is what has not ended less what is in flight (its units are
        spent already); with limits per model, each model's part of it (`_model_split`)."""
        in_flight = sum(w.in_flight for w in self.host.workers)
        unsent = max(0, total - done - in_flight)
        split = self._model_split(total)
        by_model = None
        if split is not None:
            whole, ended = split
            left = {model: max(0.0, n - ended.get(model, 0.0)) for model, n in whole.items()}
            share = unsent / sum(left.values()) if sum(left.values()) > 0 else 0.0
            by_model = {model: n * share for model, n in left.items()}
        now = self.run.clock()

        def limits(lim: WindowLimiter) -> Limits:
            # The headroom answered slots keep, on average: at most a round trip (the spread it
            # covers lies within one; more is a start not yet learned from the answers).
            pad = max(0.0, min(lim.pace_s(), rtt_s)) if brakes else 0.0
            standing = lim.standing(now, pad)
            turns, free = tuple(t for _, t in standing), tuple(f for f, _ in standing)
            return Limits(lim.current_policies(), turns, free, pad)

        demands = self._demands(unsent, by_model, limits)
        if demands is None:
            return None
        if brakes and rtt_s > 0:
            demands.append((self._in_flight(rtt_s), unsent))
        rest = least_time(demands)
        if not math.isfinite(rest):
            return None
        return rest + max(0.0, rtt_s)

    def _in_flight(self, rtt_s: float) -> list[Limits]:
        """Each key's in-flight size as a budget of requests: that many a round trip (a bucket of
        its size refilled over `rtt_s`), what is not in flight now free at once."""
        out = []
        for w in self.host.workers:
            if w.blocked:
                continue
            sizing = w.limits.sizing  # an "auto" size grows while it holds the key back
            size = max(1, sizing.ceiling if sizing is not None else w.limits.max_in_flight)
            policy = Policy(size, rtt_s, PolicyKind.BUCKET, float(size))
            out.append(Limits((policy,), (), (float(max(0, size - w.in_flight)),)))
        return out

    def _model_split(self, total: int) -> tuple[dict[str, float], dict[str, float]] | None:
        """With limits per model: (jobs per model lane in the whole job, those ended), or None
        (no limit per model, or no model known yet). The whole job's split is the file's own
        count (`Source.job_models`), else that of what the keys sent so far."""
        meter = self.makespan
        lanes = meter.model_lanes() if meter is not None else None
        if meter is None or lanes is None:
            return None
        counts = self.source.job_models
        if not counts:
            counts = {}
            for w in self.host.workers:
                for lane in w.limits.lanes:
                    counts[lane.model] = counts.get(lane.model, 0) + lane.sent
        lines = sum(counts.values())
        if lines <= 0:
            return None
        whole = {model: total * n / lines for model, n in counts.items()}
        return whole, {model: float(n) for model, n in meter.ended_by_model.items()}

    def _demands(self, jobs: int, by_model: dict[str, float] | None, limits: LimitsOf) -> Demands | None:
        """What `jobs` jobs (`by_model`: so many per model lane) spend of each budget, each
        budget's limits read by `limits`."""
        host = self.host
        meter = self.makespan
        live: list[Any] = [w for w in host.workers if not w.blocked] or list(host.workers)
        lanes = meter.model_lanes() if meter is not None else None
        succeeded = meter.jobs if meter is not None else 0
        per_job = meter.key_units / succeeded if meter is not None and succeeded else 1.0
        demands: Demands = []
        if by_model is None or lanes is None or not lanes.per_model_requests:
            demands.append(([limits(w.limiter) for w in live], jobs * per_job))
        if host.host_limiter is not None:
            demands.append(([limits(host.host_limiter)], jobs))
        if meter is not None and succeeded:
            for name, units in meter.budget_units.items():
                shared = host.budgets.host.get(name)
                if shared is not None:
                    demands.append(([limits(shared)], jobs * units / succeeded))
                elif all(name in w.key_budgets for w in live):  # per key and model: the lanes' below
                    group = [limits(w.key_budgets[name]) for w in live]
                    demands.append((group, jobs * units / succeeded))
        if by_model is not None and meter is not None:
            demands += meter.lane_demands(live, by_model, limits)
        if any(p.limit >= MAX_LIMIT for group, _ in demands for lim in group for p in lim.policies):
            return None  # a key sends one at a time until its server says its limit
        return demands


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
