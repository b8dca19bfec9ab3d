"""The composition root: every part of an engine built once, in order, each handed the few
small capabilities it uses (the protocols of `ports.py`), never the engine.

The order follows what each part needs: the run's clock and event log; the
headroom and the limiters; the key registry (empty: the keys are added as
they are built); the run's end and a cluster member (both read the registry);
the request path; the intake a source feeds; each key (its limits, leases and
gates decided here, at construction); the makespan meter; the snapshot.
`Engine` (engine.py) keeps the lifecycle, the commands and the snapshot.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratedeck.core.paths import run_graveyard_path
from ratedeck.core.policy import Policy, format_policy
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Pacing
from ratedeck.engine.cluster.member import ClusterMember, MemberParts, budget_name, gate_names
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http.probe import Probe
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.estimate import ADDITIVE, PROBING
from ratedeck.engine.limits.headroom import PROBE_WARM, HeadroomController
from ratedeck.engine.limits.in_flight import InFlightSizing
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.observe.events import EventLog
from ratedeck.engine.observe.loop_watch import LoopWatch
from ratedeck.engine.observe.makespan import MakespanMeter
from ratedeck.engine.observe.metrics import Metrics
from ratedeck.engine.observe.progress import ProgressMeter
from ratedeck.engine.observe.recording import Recorder
from ratedeck.engine.observe.snapshot_builder import SnapshotBuilder, SnapshotParts
from ratedeck.engine.observe.spend import SpendMeter
from ratedeck.engine.path.ending import RunEnd
from ratedeck.engine.path.health import EndpointHealth
from ratedeck.engine.path.intake import Intake
from ratedeck.engine.path.key import UNKNOWN_LIMIT, KeyLeases, KeyLimits, Learning
from ratedeck.engine.path.keys import KeyRing
from ratedeck.engine.path.lanes import NO_MODEL, ModelLanes, lane_model
from ratedeck.engine.path.request_path import RequestPath, SharedGates
from ratedeck.engine.path.settle import SettleRules
from ratedeck.engine.path.worker import KeyWorker
from ratedeck.engine.sources.multicall import source_from_config
from ratedeck.engine.sources.workload import bursts_in_time

from .flows import FlowQueue
from .ports import Cooldown, RunClock, SharedState, Source, Transport
from .queues import Graveyard, WorkQueues
from .request import UNSERVED, Request
from .settings import GRAVEYARD_AUTO, EngineSettings, KeySpec


@dataclass(frozen=True, slots=True)
class SharedLimits:
    """The run's shared limits: the named budgets, the host-wide limiter, the gates, how
    the limiters pace, and how to make one more."""

    budgets: Budgets
    host_limiter: WindowLimiter | None
    gates: dict[str, CooldownGate]  # by name: each key's, "host", and "store" with a shared store
    host_gate: CooldownGate
    store_gate: CooldownGate
    pacing: Pacing
    make: Callable[[tuple[Policy, ...]], WindowLimiter]


@dataclass(frozen=True, slots=True)
class EngineParts:
    """Every part of one engine, as `build_parts` made them."""

    cfg: EngineSettings
    transport: Transport
    rng: random.Random
    redact: Redactor
    run: RunClock
    log: EventLog
    headroom: HeadroomController
    probe: Probe | None
    queues: WorkQueues
    metrics: Metrics
    graveyard: Graveyard
    source: Source
    limits: SharedLimits
    keys: KeyRing
    ends: RunEnd
    cluster: ClusterMember | None
    path: RequestPath
    intake: Intake
    makespan: MakespanMeter | None
    progress: ProgressMeter
    loop: LoopWatch
    snapshots: SnapshotBuilder


def build_parts(
    cfg: EngineSettings,
    transport: Transport,
    *,
    source: Source | None = None,
    rng: random.Random | None = None,
    shared_state: SharedState | None = None,
    cooldown: Cooldown | None = None,
    retry_errors: bool = True,
) -> EngineParts:
    """Build every part of an engine for `cfg` against `transport` (see the module's docstring)."""
    e = cfg.engine
    rng = rng or random.Random(cfg.seed)
    redact = Redactor(k.secret for k in cfg.keys)
    run = RunClock(time.monotonic, wall_offset=time.time() - time.monotonic())  # the loop's, once started
    log = EventLog()
    headroom = _headroom(cfg)
    source = source or source_from_config(cfg, rng)
    limits = _limits(cfg, headroom, source, shared=shared_state is not None)
    queues, metrics = WorkQueues(), Metrics()
    graveyard = _graveyard(cfg, source, redact)
    keys = KeyRing(
        run=run,
        budgets=limits.budgets,
        headroom=headroom,
        host_gate=limits.host_gate,
        host_limiter=limits.host_limiter,
    )
    ends = RunEnd(keys=keys, queues=queues, source=source, events=log)
    cluster = None
    if shared_state is not None:
        member = MemberParts(
            run, keys, limits.gates, limits.store_gate, headroom, metrics, queues, log, ends, redact
        )
        cluster = _cluster(cfg, member, shared_state)
    spend = _spend(cfg, log, ends)
    queues.flows = _flows(cfg, limits.budgets, spend)
    if queues.flows is not None:
        queues.urgent = keys.poke_all
    path = RequestPath(
        transport=transport,
        queues=queues,
        metrics=metrics,
        headroom=headroom,
        graveyard=graveyard,
        host_gate=limits.host_gate,
        settle_rules=_settle_rules(cfg, retry_errors),
        rng=rng,
        ends=ends,
        events=log,
        cooldown=cooldown if cooldown is not None else SharedGates(log, cluster),
        redact=redact,
        pools=cfg.pools,
        spend=spend,
        recorder=_recorder(cfg, redact),
    )
    intake = _intake(cfg, run, queues, metrics, keys, path, ends, source, log)
    learning = Learning(
        budgets=limits.budgets,
        headroom=headroom,
        events=log,
        learn_policy=e.learn_policy,
        free_statuses=cfg.target.free_statuses,
        weighted_host=_weighted_host(cfg, limits.budgets),
        discovered=intake.limits_discovered,
        no_limit=ends.no_limit,
        watcher=cluster,
    )
    health = _health(cfg, log, keys)
    for spec in cfg.keys:
        worker = _key(cfg, spec, limits, learning, cluster, run=run, queues=queues, path=path)
        if spec.endpoint is not None and spec.endpoint.name in health:
            worker.health = health[spec.endpoint.name]
            worker.gates = (*worker.gates, worker.health.gate)
        keys.add(worker)
    makespan = None
    if source.job:  # a job (a workload file, a store): its makespan against the least time the limits allow
        makespan = MakespanMeter(keys, run, cfg.key_weighted)
        ends.watch(makespan)
    progress = ProgressMeter(source, keys, run, metrics, makespan)  # done of total, when the size is known
    loop = LoopWatch(log, lambda: metrics.sent - keys.in_flight())
    probe = _probe(cfg, transport)
    parts = (run, metrics, queues, headroom, keys, limits.gates, source, intake, ends, log, loop, probe)
    snapshots = SnapshotBuilder(SnapshotParts(*parts, cluster, makespan, progress, spend))
    return EngineParts(
        cfg, transport, rng, redact, run, log, headroom, probe, queues, metrics, graveyard,
        source, limits, keys, ends, cluster, path, intake, makespan, progress, loop, snapshots,
    )  # fmt: skip


def _health(cfg: EngineSettings, log: EventLog, keys: KeyRing) -> dict[str, EndpointHealth]:
    """Each endpoint's health in a pool of two or more (health.py): failover needs another."""
    if len(cfg.endpoints) < 2:
        return {}

    def waker(name: str) -> Callable[[], None]:
        def wake() -> None:
            for worker in keys:
                if worker.spec.endpoint is not None and worker.spec.endpoint.name == name:
                    worker.poke()

        return wake

    return {e.name: EndpointHealth(e.name, log, waker(e.name)) for e in cfg.endpoints}


def _graveyard(cfg: EngineSettings, source: Source, redact: Redactor) -> Graveyard:
    """The file named, else ("auto", placed by no runner) one under the XDG state directory;
    none for live clients' requests unless one was named: what a client sends is its own.
    Every key is masked in what it writes."""
    path = cfg.engine.graveyard_path
    if path == GRAVEYARD_AUTO:
        path = None if source.clients else str(run_graveyard_path())
    graveyard = Graveyard(path)
    graveyard.redact = redact
    return graveyard


def _flows(cfg: EngineSettings, budgets: Budgets, spend: SpendMeter | None) -> FlowQueue | None:
    """The flows' queue (gateway clients: priority, fair share, quotas), or None for one queue.

    A request's tokens are what admission charges (the token budgets' estimate); its USD, the
    most it may cost at its model's dearest price (`SpendMeter.ceiling_usd`)."""
    if not cfg.flows:
        return None
    tokens = None
    if budgets.costs is not None:

        def tokens(req: Request) -> int:
            units = budgets.units(req)
            return units["tokens"] if units else 0

    usd = None
    if spend is not None:
        meter = spend

        def usd(req: Request) -> float | None:
            shape = req.shape
            return meter.ceiling_usd(shape.body if shape is not None else None)

    return FlowQueue(cfg.flows, tokens=tokens, usd=usd, weighted=cfg.key_weighted)


def _spend(cfg: EngineSettings, log: EventLog, ends: RunEnd) -> SpendMeter | None:
    """What the answers cost: with prices (the config's) or a cost cap; a library run with
    neither counts none. With a cap, a request's reservation ends with it (a finish watcher)."""
    if not cfg.prices and cfg.max_cost is None:
        return None
    spend = SpendMeter.from_settings(cfg, log)
    if spend.gating:
        ends.watch(spend)
    return spend


def _intake(
    cfg: EngineSettings,
    run: RunClock,
    queues: WorkQueues,
    metrics: Metrics,
    keys: KeyRing,
    path: RequestPath,
    ends: RunEnd,
    source: Source,
    log: EventLog,
) -> Intake:
    e = cfg.engine
    return Intake(
        run=run,
        queues=queues,
        metrics=metrics,
        keys=keys,
        burial=path,
        ends=ends,
        source=source,
        events=log,
        backpressure=e.backpressure,
        queue_max=cfg.main_queue_max,
        ttl_s=e.ttl_s,  # None: requests never expire
        idempotency=cfg.target.idempotency,
        pools=path.pool_capacity,
        # A generated load with no rate of its own follows the limits keys discover.
        follow_discovered=cfg.workload.rate is None and cfg.workload.file is None,
        spend=path.spend,
        unserved=_unserved(cfg),
    )


def _unserved(cfg: EngineSettings) -> Callable[[Request], str | None] | None:
    """In a pool whose every endpoint names its models: why a request naming another model
    cannot go ("no endpoint serves model X"); None when some endpoint serves any model."""
    if not cfg.endpoints or any(e.models is None for e in cfg.endpoints):
        return None
    served = {m for e in cfg.endpoints for m in e.models or ()}
    listed = ", ".join(sorted(served)[:8])
    field = tuple(cfg.target.model_field.split("."))

    def unserved(req: Request) -> str | None:
        shape = req.shape
        model = lane_model(shape.body if shape is not None else None, field)
        if model in served:
            return None
        named = "names no model" if model == NO_MODEL else f"names model {model!r}"
        return f"{UNSERVED}: it {named}; the endpoints serve {listed}"

    return unserved


def _url_of(cfg: EngineSettings, spec: KeySpec) -> str | None:
    """The URL a key's budgets are named by in a shared store: its endpoint's, or the target's."""
    return spec.endpoint.target.url if spec.endpoint is not None else cfg.target.url


def _cluster(cfg: EngineSettings, member: MemberParts, shared_state: SharedState) -> ClusterMember:
    """A member of the store's cluster: each key's budget (and gate) named by its endpoint's
    URL and its secret, the host's gate by the target's."""
    ids = {k.label: budget_name(_url_of(cfg, k), k.secret) for k in cfg.keys}
    return ClusterMember(member, shared_state, ids, {**ids, **gate_names(cfg.target.url, {})})


def _settle_rules(cfg: EngineSettings, retry_errors: bool) -> SettleRules:
    e = cfg.engine
    return SettleRules(
        max_attempts=e.max_attempts,
        backoff_base_s=e.backoff_base_ms / 1000.0,
        backoff_cap_s=e.backoff_cap_ms / 1000.0,
        host_gate=bool(cfg.host_policies),
        host_limit_match=cfg.target.host_limit_match,
        retry_errors=retry_errors,
    )


def _headroom(cfg: EngineSettings) -> HeadroomController:
    return HeadroomController(**headroom_args(cfg))


def headroom_args(cfg: EngineSettings) -> dict[str, Any]:
    """The run's `HeadroomController` arguments (a recording's header keeps them, for replay)."""
    e = cfg.engine
    return {
        "initial_ms": e.headroom_initial_ms,
        "min_ms": e.headroom_min_ms,
        "max_ms": e.headroom_max_ms,
        "fixed_ms": None if e.headroom == "adaptive" else float(e.headroom),
        "rejection_budget": e.rejection_budget,
        "policy_window_s": min((p.window_s for k in cfg.keys for p in k.policies), default=1.0),
    }


def _climb(cfg: EngineSettings) -> str:
    """How a key's estimate climbs back: in bigger steps when the run spends a rejection budget."""
    return PROBING if cfg.engine.rejection_budget > 0 else ADDITIVE


def _recorder(cfg: EngineSettings, redact: Redactor) -> Recorder | None:
    """The recording `--record` asks for (observe/recording.py): its header says what a replay
    builds (each key's told limits, the headroom's and the estimate's settings)."""
    e = cfg.engine
    if not e.record_path:
        return None
    header = {
        "keys": {k.label: [format_policy(p) for p in k.policies] for k in cfg.keys},
        "headroom": headroom_args(cfg),
        "estimate": {"climb": _climb(cfg), "slow_start": e.slow_start, "learn_policy": e.learn_policy},
    }
    return Recorder(e.record_path, header, redact)


def _probe(cfg: EngineSettings, transport: Transport) -> Probe | None:
    """A cheap endpoint timed for the network's spread (engine/http/probe.py); off without a probe_url."""
    if not cfg.target.probe_url:
        return None
    return Probe(
        cfg.target.probe_url,
        cfg.target.probe_rate,
        get=transport.prober(),
        timeout_s=cfg.target.timeout_s,
        warm=PROBE_WARM,
    )


def _pacing(cfg: EngineSettings, source: Source) -> Pacing:
    """What the limiters do: even or burst.

    A job fed as fast as the limits allow spends each window's quota as soon as the
    meters allow (a burst); spreading it would leave a window's worth unused at the
    end. Not where nonces must arrive in order and several go at once, nor when a
    request would expire waiting a whole window behind a burst. A pacing the user
    names is kept (even pacing holds fewer requests on the wire at a kill -9).
    """
    e = cfg.engine
    pacing = Pacing(e.pacing)
    if pacing is not Pacing.AUTO:
        return pacing
    fed_burst = (
        source.fed and bursts_in_time(cfg) and not (cfg.target.nonce_param and cfg.in_flight_pinned != 1)
    )
    return Pacing.BURST if fed_burst else Pacing.EVEN


def _limits(
    cfg: EngineSettings, headroom: HeadroomController, source: Source, *, shared: bool
) -> SharedLimits:
    seconds, pace = headroom.seconds, headroom.pace_seconds
    pacing = _pacing(cfg, source)
    # Sends closer than the network jitter can reach a nonce-checking server out of order:
    # keep whole gaps there, none early. Elsewhere a send may go half a gap early, so a slot
    # that frees early is not held back by the pace (`WindowLimiter`, pace_slack).
    nonces = bool(cfg.target.nonce_param)
    spacing, slack = (1.0, 0.0) if nonces else (0.9, 0.5)

    def make(policies: tuple[Policy, ...]) -> WindowLimiter:
        return WindowLimiter(
            policies,
            seconds,
            pacing,
            min_spacing=spacing,
            pace_slack=slack,
            pace_s=pace,
            headroom=headroom.figures,
        )

    # A host-wide limit is one more budget every key spends, with its own gate.
    host_limiter = (
        WindowLimiter(cfg.host_policies, seconds, pacing, pace_s=pace, headroom=headroom.figures)
        if cfg.host_policies
        else None
    )
    # The host's gate: closed by a host-wide limit's delay, or a ban (Binance's 418 bans the IP).
    host_gate = CooldownGate("host")
    gates = {"host": host_gate}
    for spec in cfg.keys:
        gates.setdefault(spec.label, CooldownGate(spec.label))
    # A shared store's own gate: closed while the store is unreachable.
    store_gate = CooldownGate("store")
    if shared:
        gates["store"] = store_gate
    # Named budgets ([[budgets]]): host-scope ones shared here, key-scope ones per key.
    budgets = Budgets(cfg, make)
    return SharedLimits(budgets, host_limiter, gates, host_gate, store_gate, pacing, make)


def _weighted_host(cfg: EngineSettings, budgets: Budgets) -> WindowLimiter | None:
    """The host budget a weight quota names, if any."""
    weighted = [b.name for b in cfg.budgets if b.weighted and b.scope == "host"]
    return budgets.host.get(weighted[0]) if weighted else None


def _key(
    cfg: EngineSettings,
    spec: KeySpec,
    limits: SharedLimits,
    learning: Learning,
    cluster: ClusterMember | None,
    *,
    run: RunClock,
    queues: WorkQueues,
    path: RequestPath,
) -> KeyWorker:
    """One key: its limiter and budgets, its leases and gates (with a shared store, every
    budget is granted by the store), and its sender loop."""
    e = cfg.engine
    # A key with no limit given starts with none it would enforce: it sends one at a time
    # (KeyLimits.discovering) until the server's first answer advertises one.
    limiter = limits.make(spec.policies or (UNKNOWN_LIMIT,))
    key_budgets = {b.name: limits.make(b.policies) for b in limits.budgets.key_specs}
    gates: tuple[CooldownGate, ...] = (limits.gates[spec.label], limits.host_gate)
    leases = None
    if cluster is not None:
        leases = KeyLeases(_store_names(cfg, spec, limiter, key_budgets, limits, cluster), cluster.want)
        gates = (*gates, limits.store_gate)
    lanes = None
    if cfg.per_model:
        # Limits per key and model: each model its own buckets, made when first named (and
        # with a shared store, each its own budget there: the key's and the model's).
        url, secret = _url_of(cfg, spec), spec.secret
        lanes = ModelLanes(
            spec.label,
            cfg.target.model_field,
            limits.make,
            policies=spec.policies if cfg.key_per_model and spec.policies else None,
            specs=limits.budgets.model_specs,
            key_budgets=key_budgets,
            learn_first=e.learn_first,
            store_names=leases.store_names if leases is not None else None,
            store_name=lambda unit, model: budget_name(url, secret, f"{unit}\0model\0{model}"),
            endpoint=spec.endpoint,
        )
    key = KeyLimits(
        spec,
        limiter,
        learning,
        max_in_flight=cfg.in_flight_ceiling,
        sizing=InFlightSizing(e.in_flight_max) if cfg.in_flight_pinned is None else None,
        shared=(limits.host_limiter,) if limits.host_limiter else (),
        key_budgets=key_budgets,
        key_weighted=cfg.key_weighted,
        climb=_climb(cfg),
        slow_start=e.slow_start,
        learn_first=e.learn_first,
        leases=leases,
        lanes=lanes,
    )
    return KeyWorker(
        spec,
        key,
        run=run,
        queues=queues,
        path=path,
        gates=gates,
        use_nonce=bool(cfg.target.nonce_param),
        budgets=limits.budgets,
    )


def _store_names(
    cfg: EngineSettings,
    spec: KeySpec,
    limiter: WindowLimiter,
    key_budgets: dict[str, WindowLimiter],
    limits: SharedLimits,
    cluster: ClusterMember,
) -> dict[WindowLimiter, str]:
    """Each of a key's limiters' budget in the store: the key's own limits, the host's, the
    named ones (host scope: one for every member; key scope: one per key)."""
    url = cfg.target.url
    names = {limiter: cluster.budget_ids[spec.label]}
    if limits.host_limiter is not None:
        names[limits.host_limiter] = budget_name(url, None, "host_limits")
    for name, lim in limits.budgets.host.items():
        names[lim] = budget_name(url, None, name)
    for name, lim in key_budgets.items():
        names[lim] = budget_name(_url_of(cfg, spec), spec.secret, name)
    return names
