"""The engine: key workers, queues, a work source, settling answers, snapshots.

Every request ends in exactly one place (`Ending`): succeeded, expired,
graveyard or shed; while the run lasts it is queued (main or DLQ) or in
flight. The engine owns all state and runs on one asyncio loop; a front end
reaches it through a host (`ratedeck.host`), which pulls snapshots and
pushes commands.

A request's path, one direction: a `Source` submits it (`SourceSink`) ->
`WorkQueues` -> a `KeyWorker` takes it when its limiter has a slot and
`launch`es it into the `RequestPath` (`path.py`) -> the `Transport` answers
-> `settle.decide` says what the answer means -> the path counts it, pauses
whom it must, and retries the request or hands its end back here
(`Engine.finish`), which tells the request's caller and the finish watchers.
Everything the engine talks to plugs in through a protocol of `ports.py`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid

from ratedeck.core.errors import RatedeckError
from ratedeck.core.numbers import MAX_RATE, readable
from ratedeck.core.paths import run_graveyard_path
from ratedeck.core.policy import Policy
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Ending, EventKind, Pacing, Phase
from ratedeck.engine.cluster.member import ClusterMember, budget_name, gate_names
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http.probe import Probe
from ratedeck.engine.http.transport import Transport
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.estimate import ADDITIVE, PROBING
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.limits.leases import LeasedSlots
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.observe.events import EventLog
from ratedeck.engine.observe.makespan import MakespanMeter
from ratedeck.engine.observe.metrics import Metrics
from ratedeck.engine.path.request_path import RequestPath, SharedGates
from ratedeck.engine.path.settle import SettleRules
from ratedeck.engine.path.worker import UNKNOWN_LIMIT, KeyWorker
from ratedeck.engine.snapshot import BudgetRow, GateRow, Snapshot
from ratedeck.engine.sources.multicall import source_from_config
from ratedeck.engine.sources.workload import bursts_in_time

from .commands import (
    Command,
    PauseAll,
    PauseKey,
    ResumeAll,
    ResumeKey,
    SetArrivalRate,
    SetBackpressure,
    SetHeadroom,
    SetThrottle,
)
from .ports import Cooldown, FinishWatcher, SharedState, Source
from .queues import Graveyard, WorkQueues
from .request import CallFn, DoneCallback, Request
from .settings import GRAVEYARD_AUTO, EngineSettings, HoldsEngineSettings, engine_settings


def engine_clock(loop: asyncio.AbstractEventLoop):
    """The engine's one clock: the loop's own time, unless that time is coarse.

    uvloop's `time()` is whole milliseconds, cached once per loop turn: a
    send stamped with it can be stamped early by a busy turn, which eats
    into the headroom. It counts on the same monotonic clock, so timers set
    with `call_at` still agree with `time.monotonic()`. Standard and test
    (virtual time) loops keep their own `time()`.
    """
    if isinstance(loop, asyncio.BaseEventLoop):
        return loop.time
    return time.monotonic


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """ "uvloop" or "asyncio": the loop's family, as the report names it."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


#: Timers firing this late (ms) mean the loop cannot keep up: the client is the bottleneck.
LOOP_LAG_WARN_MS = 10.0
#: At most one loop-lag warning in the event log per this many seconds.
LOOP_LAG_WARN_EVERY_S = 30.0
_LAG_WINDOW_S = 5.0  # the lag shown is the worst in the last this-many seconds


class UnknownKey(RatedeckError, ValueError):
    """A command named a key id that does not exist."""


class Engine:
    """Runs one configured workload against one target through a `Transport`.

    Use `start()` on a running loop (or `await run()`), steer it with
    `apply(command)`, read it with `snapshot()`, end it with `await stop()`.

    `cooldown` is how a server's delay is honoured (`ports.Cooldown`): by
    default it closes the budget's gate for every sender (`path.SharedGates`).
    """

    def __init__(
        self,
        cfg: EngineSettings | HoldsEngineSettings,
        transport: Transport,
        *,
        source: Source | None = None,
        rng: random.Random | None = None,
        shared_state: SharedState | None = None,
        cooldown: Cooldown | None = None,
    ):
        self.cfg = cfg = engine_settings(cfg)
        self.transport = transport
        self.rng = rng or random.Random(cfg.seed)
        e = cfg.engine
        self.headroom = HeadroomController(
            initial_ms=e.headroom_initial_ms,
            min_ms=e.headroom_min_ms,
            max_ms=e.headroom_max_ms,
            fixed_ms=None if e.headroom == "adaptive" else float(e.headroom),
            rejection_budget=e.rejection_budget,
            policy_window_s=min((p.window_s for k in cfg.keys for p in k.policies), default=1.0),
        )
        # A cheap endpoint timed for the network's spread (engine/http/probe.py); off without a probe_url.
        self.probe: Probe | None = None
        if cfg.target.probe_url:
            self.probe = Probe(
                cfg.target.probe_url,
                cfg.target.probe_rate,
                get=transport.prober(),
                timeout_s=cfg.target.timeout_s,
            )
        self.queues = WorkQueues()
        self.metrics = Metrics()
        self.graveyard = Graveyard(
            str(run_graveyard_path()) if e.graveyard_path == GRAVEYARD_AUTO else e.graveyard_path
        )
        self.backpressure = e.backpressure
        self.queue_max = cfg.main_queue_max
        self.ttl_s = e.ttl_s  # None: requests never expire
        self.source: Source = source or source_from_config(cfg, self.rng)
        self.workers: list[KeyWorker] = []
        self.gates: dict[str, CooldownGate] = {}
        self.redact = Redactor(k.secret for k in cfg.keys)
        seconds = self.headroom.seconds
        pacing = Pacing(e.pacing)
        if pacing is Pacing.AUTO:
            # A job fed as fast as the limits allow spends each window's quota as soon as the
            # meters allow (a burst); spreading it would leave a window's worth unused at the
            # end. Not where nonces must arrive in order and several go at once, nor when a
            # request would expire waiting a whole window behind a burst. A pacing the user
            # names is kept (even pacing holds fewer requests on the wire at a kill -9).
            fed_burst = (
                self.source.fed
                and bursts_in_time(cfg)
                and not (cfg.target.nonce_param and e.in_flight_per_key > 1)
            )
            pacing = Pacing.BURST if fed_burst else Pacing.EVEN
        self.pacing = pacing  # what the limiters do: even or burst
        # A host-wide limit is one more budget every key spends, with its own gate.
        pace = self.headroom.pace_seconds
        self.host_limiter = (
            WindowLimiter(cfg.host_policies, seconds, pacing, pace_s=pace) if cfg.host_policies else None
        )
        # The host's gate: closed by a host-wide limit's delay, or a ban (Binance's 418 bans the IP).
        self.host_gate = CooldownGate("host")
        self.gates["host"] = self.host_gate
        shared = (self.host_limiter,) if self.host_limiter else ()
        uses_nonce = bool(cfg.target.nonce_param)
        spacing = 1.0 if uses_nonce else 0.9

        def make_limiter(policies: tuple[Policy, ...]) -> WindowLimiter:
            return WindowLimiter(policies, seconds, pacing, min_spacing=spacing, pace_s=pace)

        # Named budgets ([[budgets]]): host-scope ones shared here, key-scope ones per worker.
        self.budgets = Budgets(cfg, make_limiter)
        for spec in cfg.keys:
            gate = self.gates.setdefault(spec.label, CooldownGate(spec.label))
            # Sends closer than the network jitter can reach a nonce-checking
            # server out of order: keep whole gaps there.
            # A key with no limit given starts with none it would enforce: it sends one at a time
            # (KeyWorker.discovering) until the server's first answer advertises one.
            limiter = make_limiter(spec.policies or (UNKNOWN_LIMIT,))
            key_budgets = {b.name: make_limiter(b.policies) for b in self.budgets.key_specs}
            self.workers.append(
                KeyWorker(
                    self,
                    spec,
                    limiter,
                    (gate, self.host_gate),
                    e.in_flight_per_key,
                    use_nonce=uses_nonce,
                    shared=shared,
                    budgets=self.budgets,
                    key_budgets=key_budgets,
                    key_weighted=cfg.key_weighted,
                    climb=PROBING if e.rejection_budget > 0 else ADDITIVE,
                    slow_start=e.slow_start,
                    learn_first=e.learn_first,
                )
            )
        # A shared store (Redis): key budgets granted as leases, gates shared, the store's own gate.
        self.store_gate = CooldownGate("store")
        self.cluster: ClusterMember | None = None
        if shared_state is not None:
            self.gates["store"] = self.store_gate
            self.cluster = ClusterMember(
                self,
                shared_state,
                {w.label: budget_name(cfg.target.url, w.spec.secret) for w in self.workers},
                gate_names(cfg.target.url, {w.label: w.spec.secret for w in self.workers}),
            )
            # Every budget is granted by the store: each key's own limits, the host's, the
            # named ones (host scope: one for every member; key scope: one per key).
            url = cfg.target.url
            host_names = {name: budget_name(url, None, name) for name in self.budgets.host}
            for w in self.workers:
                names = w.store_names
                names[w.limiter] = self.cluster.budget_ids[w.label]
                if self.host_limiter is not None:
                    names[self.host_limiter] = budget_name(url, None, "host_limits")
                for name, lim in self.budgets.host.items():
                    names[lim] = host_names[name]
                for name, lim in w.key_budgets.items():
                    names[lim] = budget_name(url, w.spec.secret, name)
                w.gates = (*w.gates, self.store_gate)
                w.leases = LeasedSlots()
                w.want_leases = self.cluster.want
        self.log = EventLog()
        self.events = self.log.rows
        self.event = self.log.event
        settle_rules = SettleRules(
            max_attempts=e.max_attempts,
            backoff_base_s=e.backoff_base_ms / 1000.0,
            backoff_cap_s=e.backoff_cap_ms / 1000.0,
            host_gate=bool(cfg.host_policies),
            host_limit_match=cfg.target.host_limit_match,
        )
        weighted = [b.name for b in cfg.budgets if b.weighted and b.scope == "host"]
        # The request path: launch, send, settle, apply; it hands each end back to `finish`.
        self.path = RequestPath(
            transport,
            self.queues,
            self.metrics,
            self.headroom,
            self.graveyard,
            self.budgets,
            self.budgets.host.get(weighted[0]) if weighted else None,
            self.host_gate,
            settle_rules,
            self.rng,
            cfg.pools,
            self,
            self.log,
            cooldown if cooldown is not None else SharedGates(self.log, self.cluster),
            self.redact,
            learn_policy=e.learn_policy,
            free_statuses=cfg.target.free_statuses,
            budget_watcher=self.cluster,
        )
        self.path.no_limit = self.no_limit
        self.path.discovered = self.limits_discovered
        # What a key worker calls (`ports.WorkerHost`): the path's own, bound once.
        self.launch = self.path.launch
        self.expire = self.path.expire
        self.shed = self.path.shed
        self.pool_ok = self.path.pool_ok
        self.pool_ok_req = self.path.pool_ok_req
        self.pool_capacity = self.path.pool_capacity
        self.by_label = {w.label: w for w in self.workers}
        self.stopping = False
        self.phase = Phase.STARTING
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_name = ""  # "uvloop" or "asyncio", once started
        self.clock = time.monotonic  # replaced by the loop's clock in start()
        self.started_at = 0.0
        self.ended_at: float | None = None
        self._wall_offset = time.time() - time.monotonic()  # until start() measures the loop's clock
        self._tasks: list[asyncio.Task] = []
        self.finished: asyncio.Event | None = None  # created on the loop in start()
        self._next_id = 0
        # The client's own cost (Snapshot.cpu_s, loop_lag_ms): process CPU since the start,
        # and how late the ticker's timer fires (a loop that cannot keep up).
        self._cpu0 = 0.0
        self._cpu_end: float | None = None
        self.loop_lag_ms = 0.0
        self._lag_now = 0.0  # the worst lateness in the running window
        self._lag_prev = 0.0  # and in the one before
        self._late_ticks = 0  # ticks in a row that fired late
        self._lag_window_end = 0.0
        self._lag_warned_at = -math.inf
        self.mergeable = False  # one of several processes: snapshots carry whole histograms
        self.problems: list[str] = []
        self.no_limit_text = ""  # set when no limit was given and the server advertises none
        # Called with (request, ending) for every request that ends (a results
        # file, a store's journal): after the request's own on_done.
        self.finish_watchers: list[DoneCallback] = []
        # A job (a workload file, a store): its makespan against the least time the limits allow.
        self.makespan: MakespanMeter | None = None
        if self.source.job:
            self.makespan = MakespanMeter(self, cfg.key_weighted)
            self.watch(self.makespan)

    @property
    def retry_errors(self) -> bool:
        """Whether errors other than rate limits are retried (a library caller wants them at once)."""
        return self.path.retry_errors

    @retry_errors.setter
    def retry_errors(self, on: bool) -> None:
        self.path.retry_errors = on

    @property
    def settle_rules(self) -> SettleRules:
        return self.path.settle_rules

    @property
    def in_flight(self) -> int:
        """Attempts in flight now."""
        return self.path.in_flight

    def watch(self, watcher: FinishWatcher) -> None:
        """Tell `watcher` of every request that ends (`ports.FinishWatcher`)."""
        self.finish_watchers.append(watcher.finished)

    def queued(self) -> list[Request]:
        """Requests still queued: the main queue first, then the retry queue by due time."""
        return self.queues.all_queued()

    def in_flight_requests(self) -> list[Request]:
        return self.path.in_flight_requests()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start workers, the source and the ticker on the running loop."""
        self.loop = asyncio.get_running_loop()
        self.loop_name = loop_name(self.loop)
        self.clock = engine_clock(self.loop)
        self.started_at = self.clock()
        self._cpu0 = time.process_time()
        self._lag_window_end = self.started_at + _LAG_WINDOW_S
        self._wall_offset = time.time() - self.started_at
        self.log.start(self.clock, self.started_at)
        self.path.start(self.loop, self.clock, self.started_at, self._wall_offset)
        for lim in self.all_limiters():
            lim.align(self._wall_offset, self.started_at)  # fixed windows turn at the clock's minutes
        self.finished = asyncio.Event()
        self.phase = Phase.RUNNING
        self._tasks = [self.loop.create_task(w.run(), name=f"key-{w.label}") for w in self.workers]
        self._tasks.append(self.loop.create_task(self.source.run(self), name="source"))
        self._tasks.append(self.loop.create_task(self._tick(), name="ticker"))
        if self.cluster is not None:
            self.cluster.start()
        if self.probe is not None:
            probing = self.probe.run(self.clock, self.headroom.observe_network, self.problem)
            self._tasks.append(self.loop.create_task(probing, name="probe"))
        capacity = readable(self.cfg.capacity_tps)
        self.event(EventKind.INFO, f"started: {len(self.workers)} keys, capacity {capacity}/s")
        if any(w.discovering for w in self.workers):
            # No limit given: one request per key to learn what the server advertises.
            self.event(EventKind.INFO, "no limit given: one request in flight per key until the server says")
            self.limits_discovered()

    async def run(self, duration_s: float | None = None) -> Snapshot:
        """Start, run until `duration_s` passes or the workload is done, then stop."""
        self.start()
        assert self.finished is not None
        try:
            if duration_s is None:
                await self.finished.wait()
            else:
                try:
                    await asyncio.wait_for(self.finished.wait(), duration_s)
                except TimeoutError:
                    pass
        finally:
            snap = await self.stop()
        return snap

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Stop generating and sending, let in-flight attempts finish (bounded).

        Queued requests stay queued and in-flight ones that did not finish in
        time stay in flight: both are reported, never dropped.
        """
        if self.ended_at is not None:
            return self.snapshot()
        self.stopping = True
        self.phase = Phase.DRAINING
        self.queues.release_space()
        for w in self.workers:
            w.poke()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.close()
        if self.probe is not None:
            await self.probe.close()
        timeout = self.cfg.drain_s if drain_timeout_s is None else drain_timeout_s
        if self.path.sends:
            _done, pending = await asyncio.wait(set(self.path.sends.values()), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        self._expire_queued(self.clock())
        self.ended_at = self.clock()
        self._cpu_end = time.process_time()
        self.phase = Phase.STOPPED
        self.source.close_second()  # flush what the source still holds (shed lines)
        self._flush_graveyard()
        self.event(EventKind.INFO, "stopped")
        return self.snapshot()

    def _budget_rows(self, now: float) -> tuple[BudgetRow, ...]:
        rows = [self._budget_row(name, "host", lim, now) for name, lim in self.budgets.host.items()]
        for w in self.workers:
            rows.extend(self._budget_row(name, w.label, lim, now) for name, lim in w.key_budgets.items())
        return tuple(rows)

    def _budget_row(self, name: str, owner: str, lim: WindowLimiter, now: float) -> BudgetRow:
        used, limit = lim.used(now)
        unit = self.budgets.specs[name].unit
        per_min = round(lim.capacity_tps * 60.0, 1)
        return BudgetRow(name, owner, used, limit, unit, per_min, lim.spent, lim.spent - lim.returned)

    def all_limiters(self) -> list[WindowLimiter]:
        limiters = [w.limiter for w in self.workers] + list(self.budgets.host.values())
        limiters += [lim for w in self.workers for lim in w.key_budgets.values()]
        if self.host_limiter is not None:
            limiters.append(self.host_limiter)
        return limiters

    def capacity_tps(self) -> float:
        """Requests per second the keys allow (advertised limits included), host limit applied;
        where a token budget binds, what it lets through at the requests' settled cost so far.

        A key still waiting for its server to advertise a limit counts for nothing: its
        placeholder limit is no capacity (0 in all: not known yet)."""
        total = sum(w.live_rate(0.0) for w in self.workers if not w.discovering)
        if self.host_limiter is not None:
            total = min(total, self.host_limiter.capacity_tps)
        return total

    def live_capacity(self, now: float) -> float:
        """Requests per second the keys that can send now really allow.

        Keys that are paused, blocked or cooling down count for nothing. The
        limiter spaces sends by (window + headroom) / limit, so the headroom
        is part of the rate: the nominal limit would promise a few percent
        more than can be sent. A key whose token budget binds counts what that
        budget lets through at the requests' settled cost so far (`KeyWorker.live_rate`).
        """
        h = self.headroom.seconds()
        total = 0.0
        for w in self.workers:
            if w.can_send(now):
                total += w.live_rate(h)
        if self.host_limiter is not None and self.host_gate is not None:
            if self.host_gate.open_at > now:
                return 0.0
            total = min(total, self.host_limiter.live_rate(h))
        return total

    def next_gate_open(self, now: float) -> float | None:
        later = [w.gate_open_at() for w in self.workers if not (w.paused or w.blocked)]
        later = [t for t in later if t > now]
        return min(later) if later else None

    # ------------------------------------------------------------ the end of a request's path (Endings)
    def finish(self, req: Request, ending: Ending) -> None:
        """`req` reached its final place: tell its caller, then every finish watcher."""
        req.ending = ending
        if req.on_done is not None:
            req.on_done(req, ending)
        for watch in self.finish_watchers:
            watch(req, ending)
        self._check_finished()

    # ------------------------------------------------------------ the source's side (SourceSink)
    def submit(self, req: Request) -> None:
        """Accept a new request into the main queue."""
        self.metrics.generated += 1
        if req.pin is not None:
            owner = self.by_label.get(req.pin)
            if owner is None or owner.blocked:  # its one key is not ours, or was refused for good
                req.last_error = f"its key {req.pin} {'was refused' if owner else 'is not one of ours'}"
                self.path.bury(req, self.clock())
                return
        self.queues.put(req)

    def withdraw(self, req: Request) -> bool:
        """A queued request its caller gave up on: out of the queue now and shed, so it holds
        no place and never reserves a slot. False when it is not queued (sent, or ended)."""
        req.cancelled = True  # not sent again if it is in flight now
        if not self.queues.discard(req):
            return False
        self.shed(req)
        return True

    def refuse(self, req: Request) -> None:
        """A new request that found no room: counted as generated, and shed at once."""
        self.metrics.generated += 1
        self.shed(req)

    def new_request(
        self,
        params: dict | None = None,
        pool: str | None = None,
        ttl_s: float | None = None,
        call: CallFn | None = None,
        intended_at: float | None = None,
    ) -> Request:
        """A request created now, with the engine's TTL unless `ttl_s` is given (no TTL: it never expires).

        `intended_at` is when it should have arrived (a fixed arrival rate's
        schedule): latency from arrival counts from there.
        """
        now = self.clock()
        self._next_id += 1
        if pool is not None and self.pool_capacity and pool not in self.pool_capacity:
            raise ValueError(f"no pool {pool!r}; pools are {', '.join(self.pool_capacity)}")
        ttl = self.ttl_s if ttl_s is None else ttl_s
        deadline = now + ttl if ttl is not None else math.inf
        req = Request(self._next_id, now, deadline, params, pool=pool, call=call, intended_at=intended_at)
        if self.cfg.target.idempotency:
            req.idempotency_key = uuid.uuid4().hex  # one per logical request, kept across its retries
        return req

    def recent_sends(self) -> dict[str, list[float]]:
        """Each key's sends in its longest window (at most its limit), as Unix times, by the
        key's fingerprint (its label for a short secret): what a store keeps for a resume."""
        now = self.clock()
        out: dict[str, list[float]] = {}
        for w in self.workers:
            policies = w.limiter.policies
            span = max(p.window_s for p in policies)
            keep = max(p.limit for p in policies)
            times = w.limiter.sends_since(now - span)[-keep:]
            out[w.fingerprint or w.label] = [self.wall_time(t) for t in times]
        return out

    def seed_sends(self, sends: dict[str, list[float]]) -> int:
        """Start each key's limiter with the sends another run made (Unix times, keyed as
        `recent_sends` keys them): the server still counts them, so the first sends of this
        run keep to the same window. Call before `start`; returns how many were taken."""
        now, wall = self.clock(), time.time()
        taken = 0
        for w in self.workers:
            for t in sorted(sends.get(w.fingerprint or w.label, ())):
                at = now - (wall - t)
                if at <= now:
                    w.limiter.record(at)
                    taken += 1
        return taken

    def source_done(self) -> None:
        self._check_finished()

    def wall_time(self, t: float) -> float:
        return t + self._wall_offset

    def limits_discovered(self) -> None:
        """A key adopted the limit its server advertises: a generated load with no rate of its
        own follows what the keys now allow."""
        if self.cfg.workload.rate is not None or self.cfg.workload.file is not None:
            return
        known = [w.limiter.capacity_tps for w in self.workers if not w.discovering]
        waiting = sum(1 for w in self.workers if w.discovering)
        self.source.set_rate(min(MAX_RATE, sum(known) + waiting))

    def no_limit(self, text: str) -> None:
        """No limit was given and the server advertises none: the run cannot pace itself; it stops."""
        if not self.no_limit_text:
            self.no_limit_text = text
            self.problem(text)
            if self.finished is not None:
                self.finished.set()

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            self.event(EventKind.ERROR, text)

    @property
    def all_refused(self) -> bool:
        """Every key was refused by the server for good: nothing more can be sent."""
        return bool(self.workers) and all(w.blocked for w in self.workers)

    def key_refused(self) -> None:
        """A key was refused for good; when it was the last, the run is over (`finished`) at once:
        generating on would only queue work no key can send."""
        if self.all_refused and self.finished is not None and not self.finished.is_set():
            self.event(EventKind.ERROR, "every key was refused by the server: nothing can be sent; stopping")
            self.finished.set()

    def _check_finished(self) -> None:
        if (
            self.source.exhausted
            and not self.path.in_flight
            and not len(self.queues)
            and self.finished is not None
        ):
            self.finished.set()

    # ------------------------------------------------------------ ticking
    async def _tick(self) -> None:
        """Ten times a second: expire queued requests, sample depths; each second roll series."""
        next_second = self.started_at + 1.0
        while True:
            due = self.clock() + 0.1
            await asyncio.sleep(0.1)
            now = self.clock()
            self.note_lag(now - due, now)
            self._expire_queued(now)
            self.metrics.sample_depths(self.queues.fresh(), self.queues.retries())
            while now >= next_second:
                self.metrics.close_second()
                self.source.close_second()
                next_second += 1.0
                self._flush_graveyard()
            self._check_finished()

    def note_lag(self, late_s: float, now: float) -> None:
        """The ticker's timer fired `late_s` late: keep the worst of the last few seconds,
        and say so in the event log (at most every `LOOP_LAG_WARN_EVERY_S`) when two ticks
        in a row were later than `LOOP_LAG_WARN_MS`: then every timer (pacing, deadlines) is
        that late too."""
        late_ms = max(0.0, late_s * 1000.0)
        if now >= self._lag_window_end:  # a new window: the last one's worst is still shown
            self._lag_prev, self._lag_now = self._lag_now, late_ms
            self._lag_window_end = now + _LAG_WINDOW_S
        elif late_ms > self._lag_now:
            self._lag_now = late_ms
        self.loop_lag_ms = max(self._lag_prev, self._lag_now)
        # Two late ticks in a row: one alone may be a single long turn (the start, a GC).
        self._late_ticks = self._late_ticks + 1 if late_ms > LOOP_LAG_WARN_MS else 0
        if self._late_ticks >= 2 and now - self._lag_warned_at >= LOOP_LAG_WARN_EVERY_S:
            self._lag_warned_at = now
            cpu = self._cpu_us_per_request()
            cost = f", {cpu:.0f} µs CPU per request" if cpu is not None else ""
            self.event(
                EventKind.ERROR,
                f"the engine's loop runs late: a timer fired {late_ms:.0f} ms late{cost};"
                " the client, not the server, may be the bottleneck (try --procs)",
            )

    def cpu_s(self) -> float:
        """CPU seconds of this process since the engine started (frozen when it stopped)."""
        end = self._cpu_end if self._cpu_end is not None else time.process_time()
        return max(0.0, end - self._cpu0) if self.loop is not None else 0.0

    def _cpu_us_per_request(self) -> float | None:
        answered = self.metrics.sent - self.in_flight
        return self.cpu_s() * 1e6 / answered if answered > 0 else None

    def _expire_queued(self, now: float) -> None:
        for req in self.queues.drain_expired(now):
            self.expire(req)

    def _flush_graveyard(self) -> None:
        problem = self.graveyard.flush()
        if problem:
            self.problem(problem)

    # ------------------------------------------------------------ control
    def apply(self, cmd: Command) -> None:
        """Apply one command now. Raises `UnknownKey` for a key id that does not exist,
        ValueError for a value the engine cannot take."""
        match cmd:
            case PauseKey(key=key):
                self._worker(key).paused = True
                self.event(EventKind.PAUSE, f"{key} paused")
            case ResumeKey(key=key):
                w = self._worker(key)
                w.paused = False
                w.poke()
                self.event(EventKind.PAUSE, f"{key} resumed")
            case PauseAll():
                for w in self.workers:
                    w.paused = True
                self.event(EventKind.PAUSE, "all keys paused")
            case ResumeAll():
                for w in self.workers:
                    w.paused = False
                    w.poke()
                self.event(EventKind.PAUSE, "all keys resumed")
            case SetHeadroom(ms=ms):
                if ms is None:
                    self.headroom.set_adaptive()
                    self.event(EventKind.SETTING, "headroom adaptive")
                else:
                    if not ms >= 0 or ms == float("inf"):
                        raise ValueError(f"headroom must be a finite number of ms, 0 or more, got {ms}")
                    self.headroom.set_fixed(ms)
                    self.event(EventKind.SETTING, f"headroom fixed at {self.headroom.value_ms:g} ms")
                self._poke_all()
            case SetBackpressure(on=on):
                self.backpressure = on
                if not on:
                    self.queues.release_space()
                self.source.poke()
                self.event(EventKind.SETTING, f"backpressure {'on' if on else 'off'}")
            case SetArrivalRate(rate=rate):
                if not rate >= 0 or rate == float("inf"):
                    raise ValueError(f"arrival rate must be a finite number, 0 or more, got {rate}")
                self.source.set_rate(rate)
                self.event(EventKind.SETTING, f"arrival rate {readable(rate)}/s")
            case SetThrottle(mode_or_rate=value):
                self.source.set_throttle(value)
                self.event(EventKind.SETTING, f"entry throttle {value}")
            case _:
                raise TypeError(f"not a command: {cmd!r}")
        # Pausing or resuming keys changes what an auto throttle may admit.
        self.source.poke()

    def _worker(self, key: str) -> KeyWorker:
        try:
            return self.by_label[key]
        except KeyError:
            raise UnknownKey(f"no key {key!r}; keys are {', '.join(self.by_label)}") from None

    def _poke_all(self) -> None:
        for w in self.workers:
            w.poke()

    # ------------------------------------------------------------ reading
    def snapshot(self) -> Snapshot:
        """An immutable picture of everything, consistent because it is built on the loop."""
        m = self.metrics
        now = self.clock() if self.loop is not None else 0.0
        end = self.ended_at if self.ended_at is not None else now
        elapsed = max(0.0, end - self.started_at) if self.loop is not None else 0.0
        h = self.headroom
        return Snapshot(
            elapsed_s=elapsed,
            phase=self.phase,
            capacity_tps=self.capacity_tps(),
            live_capacity_tps=self.live_capacity(now) if self.phase is Phase.RUNNING else 0.0,
            throughput_tps=m.succeeded / elapsed if elapsed > 0 else 0.0,
            current_tps=m.tps_series[-1] if m.tps_series else 0.0,
            generated=m.generated,
            succeeded=m.succeeded,
            expired=m.expired,
            graveyard=m.graveyard,
            shed=m.shed,
            main_depth=self.queues.fresh(),
            dlq_depth=self.queues.retries(),
            in_flight=self.in_flight,
            sent=m.sent,
            rejected_429=m.rejected_429,
            rejected_other=m.rejected_other,
            failed=m.failed,
            retried=m.retried,
            failures=tuple(sorted(m.failures.items())),
            errors=m.errors.rows(),
            main_max=self.queue_max,
            main_peak=m.main_peak,
            main_avg=m.main_avg,
            dlq_peak=m.dlq_peak,
            dlq_avg=m.dlq_avg,
            headroom_ms=h.effective_ms,
            headroom_adaptive=h.adaptive,
            headroom_min_ms=h.seen_min_ms,
            headroom_max_ms=h.seen_max_ms,
            backpressure=self.backpressure,
            arrival_rate=self.source.rate,
            latency=m.latency.summary(self.mergeable),
            latency_total=m.latency_total.summary(self.mergeable),
            queue_wait=m.queue_wait.summary(self.mergeable),
            tps_series=tuple(m.tps_series),
            p50_series=tuple(m.p50_series),
            p99_series=tuple(m.p99_series),
            keys=tuple(w.row(now) for w in self.workers),
            events=tuple(self.events),
            gates=tuple(
                GateRow(g.name, round(g.left(now), 1), g.reason, g.closures, g.escalations)
                for g in self.gates.values()
            ),
            messages=self.source.stats(elapsed),
            budgets=self._budget_rows(now),
            headroom_source=h.source,
            rtt_spread_ms=h.rtt_spread_ms,
            network_spread_ms=h.network_spread_ms,
            server_time_ms=h.server_time_ms,
            rejection_budget=h.rejection_budget,
            rejections_spent=h.rejections_spent,
            probe_sent=self.probe.sent if self.probe is not None else 0,
            cpu_s=self.cpu_s(),
            loop=self.loop_name,
            loop_lag_ms=self.loop_lag_ms,
            cluster=self.cluster.view if self.cluster is not None else None,
            makespan=self.makespan.view(m.latency.quantiles(0.5)[0] / 1000.0, self.phase is Phase.STOPPED)
            if self.makespan
            else None,
            fed=self.source.fed,
            uncertain=m.uncertain,
            no_limit=self.no_limit_text,
        )
