"""The engine's snapshot, assembled from its parts: an immutable picture of everything,
consistent because it is built on the loop between two turns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratedeck.core.policy import MAX_LIMIT
from ratedeck.core.secrets import safe_url
from ratedeck.core.vocab import Phase
from ratedeck.engine.snapshot import (
    BudgetRow,
    EndpointRow,
    GateRow,
    KeyRow,
    LoopLag,
    Makespan,
    ModelLimits,
    Progress,
    Snapshot,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ratedeck.engine.cluster.member import ClusterMember
    from ratedeck.engine.gate import CooldownGate
    from ratedeck.engine.http.probe import Probe
    from ratedeck.engine.limits.headroom import HeadroomController
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.path.ending import RunEnd
    from ratedeck.engine.path.health import EndpointHealth
    from ratedeck.engine.path.intake import Intake
    from ratedeck.engine.path.keys import KeyRing
    from ratedeck.engine.path.worker import KeyWorker
    from ratedeck.engine.ports import RunClock, Source
    from ratedeck.engine.queues import WorkQueues

    from .events import EventLog
    from .loop_watch import LoopWatch
    from .makespan import MakespanMeter
    from .metrics import Metrics
    from .progress import ProgressMeter
    from .spend import SpendMeter


@dataclass(frozen=True, slots=True)
class SnapshotParts:
    """Every part a snapshot reads (types named for checking only: the snapshot reads the
    parts above this folder, never imports them). `intake` gives backpressure and queue_max,
    `ends` the no-limit text, `cluster` its last view."""

    run: RunClock
    metrics: Metrics
    queues: WorkQueues
    headroom: HeadroomController
    keys: KeyRing
    gates: Mapping[str, CooldownGate]
    source: Source
    intake: Intake
    ends: RunEnd
    log: EventLog
    loop: LoopWatch
    probe: Probe | None = None
    cluster: ClusterMember | None = None
    makespan: MakespanMeter | None = None
    progress: ProgressMeter | None = None
    spend: SpendMeter | None = None


class SnapshotBuilder:
    """Builds the engine's `Snapshot` from its parts; `mergeable` (one of several processes)
    makes the latency summaries carry their whole histograms."""

    __slots__ = ("parts", "mergeable")

    def __init__(self, parts: SnapshotParts) -> None:
        self.parts = parts
        self.mergeable = False

    def build(self) -> Snapshot:
        p = self.parts
        m, run, h, source = p.metrics, p.run, p.headroom, p.source
        started = run.loop is not None
        now = run.clock() if started else 0.0
        end = run.ended_at if run.ended_at is not None else now
        elapsed = max(0.0, end - run.started_at) if started else 0.0
        mergeable, capacity = self.mergeable, p.keys.capacity_tps()
        keys = tuple(w.row(now) for w in p.keys.workers)
        return Snapshot(
            elapsed_s=elapsed,
            phase=run.phase,
            capacity_tps=capacity,
            live_capacity_tps=p.keys.live_capacity(now) if run.phase is Phase.RUNNING else 0.0,
            throughput_tps=m.succeeded / elapsed if elapsed > 0 else 0.0,
            current_tps=m.tps_series[-1] if m.tps_series else 0.0,
            generated=m.generated,
            succeeded=m.succeeded,
            expired=m.expired,
            graveyard=m.graveyard,
            shed=m.shed,
            main_depth=p.queues.fresh(),
            dlq_depth=p.queues.retries(),
            in_flight=p.keys.in_flight(),
            sent=m.sent,
            rejected_429=m.rejected_429,
            rejected_other=m.rejected_other,
            failed=m.failed,
            retried=m.retried,
            failures=tuple(sorted(m.failures.items())),
            errors=m.errors.rows(),
            main_max=p.intake.queue_max,
            main_peak=m.main_peak,
            main_avg=m.main_avg,
            dlq_peak=m.dlq_peak,
            dlq_avg=m.dlq_avg,
            headroom_ms=h.effective_ms,
            headroom_adaptive=h.adaptive,
            headroom_min_ms=h.seen_min_ms,
            headroom_max_ms=h.seen_max_ms,
            backpressure=p.intake.backpressure,
            arrival_rate=source.rate,
            latency=m.latency.summary(mergeable),
            latency_total=m.latency_total.summary(mergeable),
            queue_wait=m.queue_wait.summary(mergeable),
            tps_series=tuple(m.tps_series),
            p50_series=tuple(m.p50_series),
            p99_series=tuple(m.p99_series),
            keys=keys,
            events=tuple(p.log.rows),
            gates=tuple(
                GateRow(g.name, round(g.left(now), 1), g.reason, g.closures, g.escalations)
                for g in p.gates.values()
            ),
            messages=source.stats(elapsed),
            budgets=self.budget_rows(now),
            headroom_source=h.source,
            rtt_spread_ms=h.rtt_spread_ms,
            network_spread_ms=h.network_spread_ms,
            server_time_ms=h.server_time_ms,
            rejection_budget=h.rejection_budget,
            rejections_spent=h.rejections_spent,
            probe_sent=p.probe.sent if p.probe is not None else 0,
            cpu_s=p.loop.cpu_s(),
            loop=p.loop.name,
            cpu_with=p.loop.shared_with,
            loop_lag_ms=p.loop.lag_ms,
            lag=self._lag(elapsed, capacity),
            cluster=p.cluster.view if p.cluster is not None else None,
            makespan=self._makespan(),
            progress=self._progress(),
            fed=source.fed,
            uncertain=m.uncertain,
            no_limit=p.ends.no_limit_text,
            spend=p.spend.view() if p.spend is not None else None,
            endpoints=self.endpoint_rows(keys),
        )

    def _lag(self, elapsed: float, capacity: float) -> LoopLag:
        """The loop's lateness and the verdict, told how near the run is to its capacity."""
        p = self.parts
        pct = 100.0 * p.metrics.succeeded / elapsed / capacity if capacity > 0 and elapsed > 0 else 0.0
        return p.loop.view(pct, self.mergeable)

    def _makespan(self) -> Makespan | None:
        p = self.parts
        if not p.makespan:
            return None
        return p.makespan.view(p.metrics.latency.quantiles(0.5)[0] / 1000.0, p.run.phase is Phase.STOPPED)

    def _progress(self) -> Progress | None:
        p = self.parts
        if p.progress is None:
            return None
        rtt = p.metrics.latency.quantiles(0.5)[0] / 1000.0
        return p.progress.view(rtt, final=p.run.phase is Phase.STOPPED)

    def budget_rows(self, now: float) -> tuple[BudgetRow, ...]:
        keys = self.parts.keys
        rows = [self._budget_row(name, "host", lim, now) for name, lim in keys.budgets.host.items()]
        for w in keys.workers:
            rows.extend(
                self._budget_row(name, w.label, lim, now) for name, lim in w.limits.key_budgets.items()
            )
            if w.limits.lanes is not None:  # budgets per key and model: one row each, "k1 gpt-4o"
                for lane in w.limits.lanes:
                    owner = f"{w.label} {lane.model}"
                    rows.extend(self._budget_row(name, owner, lim, now) for name, lim in lane.own.items())
        return tuple(rows)

    def _budget_row(self, name: str, owner: str, lim: WindowLimiter, now: float) -> BudgetRow:
        used, limit = lim.used(now)
        unit = self.parts.keys.budgets.specs[name].unit
        per_min = round(lim.capacity_tps * 60.0, 1)
        return BudgetRow(name, owner, used, limit, unit, per_min, lim.spent, lim.spent - lim.returned)

    def endpoint_rows(self, keys: tuple[KeyRow, ...]) -> tuple[EndpointRow, ...]:
        """One row per endpoint of a pool, in the order its keys come (the config's); `keys`
        are the workers' rows, in the same order. Empty with one target."""
        workers = self.parts.keys.workers
        by_name: dict[str, list[tuple[KeyWorker, KeyRow]]] = {}
        for w, row in zip(workers, keys, strict=True):
            if w.spec.endpoint is not None:
                by_name.setdefault(w.spec.endpoint.name, []).append((w, row))
        return tuple(_endpoint_row(pairs) for pairs in by_name.values())


#: A limiter's rate at or above this is no limit known yet (the key's placeholder, key.UNKNOWN_LIMIT).
_NO_LIMIT_RATE = MAX_LIMIT / 2


def _endpoint_row(pairs: list[tuple[KeyWorker, KeyRow]]) -> EndpointRow:
    """An endpoint's row from its keys (every one names the same `EndpointSpec`)."""
    spec = pairs[0][0].spec.endpoint
    assert spec is not None
    health = pairs[0][0].health
    serves = tuple(spec.models) if spec.models is not None else ("any",)
    return EndpointRow(
        name=spec.name,
        preset=spec.preset,
        url=safe_url(spec.target.url),
        serves=serves,
        models=_model_limits(spec.models, [w for w, _ in pairs]),
        state=_state(health, [r for _, r in pairs]),
        reason=health.reason if health is not None else "",
        downs=health.downs if health is not None else 0,
        keys=len(pairs),
        sent=sum(r.sent for _, r in pairs),
        succeeded=sum(r.succeeded for _, r in pairs),
        rejected_429=sum(r.rejected_429 for _, r in pairs),
    )


def _state(health: EndpointHealth | None, rows: list[KeyRow]) -> str:
    """ "refused" when the server refused every key of the endpoint for good, else its health's."""
    if all(r.state == "blocked" for r in rows):
        return "refused"
    return health.state if health is not None else "up"


def _model_limits(named: Mapping[str, object] | None, workers: list[KeyWorker]) -> tuple[ModelLimits, ...]:
    """Each model's limits per minute, summed over the keys' lanes for it: the models the
    endpoint names first (in its order, "not sent yet" until a key made their lane), then
    any other model its keys' lanes hold (an endpoint that serves any model); a model it
    does not serve, or a request that named none, is left out."""
    per_model: dict[str, dict[str, float]] = {m: {} for m in named or ()}
    followed: set[str] = set()
    for w in workers:
        limits = w.limits
        lanes = limits.lanes
        if lanes is None:  # one set of buckets for every model: the key's own, under "any"
            buckets = [("requests", limits.limiter), *limits.key_budgets.items()]
            _add(per_model.setdefault("any", {}), buckets)
            if limits.window_bound < math.inf:
                followed.add("any")
            continue
        for lane in lanes:
            if not lane.served or lane.model == "-":
                continue
            buckets = lane.buckets()
            if lane.limiter is None:  # the key's own request limit holds for every model
                buckets.insert(0, ("requests", limits.limiter))
            shared = [(n, lim) for n, lim in limits.key_budgets.items() if n not in lane.own]
            _add(per_model.setdefault(lane.model, {}), [*buckets, *shared])
            if lane.window_bound < math.inf:
                followed.add(lane.model)
    return tuple(
        ModelLimits(model, tuple((unit, round(v, 1)) for unit, v in units.items()), model in followed)
        for model, units in per_model.items()
    )


def _add(into: dict[str, float], buckets: list[tuple[str, WindowLimiter]]) -> None:
    """Add each bucket's rate per minute to `into` by unit (a limit not known yet adds nothing)."""
    for unit, lim in buckets:
        rate = lim.capacity_tps
        if 0 < rate < _NO_LIMIT_RATE:
            into[unit] = into.get(unit, 0.0) + rate * 60.0
