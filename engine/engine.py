"""The engine: key workers, queues, a work source, settling answers, snapshots.

Every request ends in exactly one place (`Ending`): succeeded, expired,
graveyard or shed; while the run lasts it is queued (main or DLQ) or in
flight. The engine owns all state and runs on one asyncio loop; a front end
reaches it through a host (`ratedeck.host`), which pulls snapshots and
pushes commands.

A request's path, one direction: a `Source` submits it (`SourceSink`) ->
`WorkQueues` -> a `KeyWorker` takes it when its limiter has a slot and
`launch`es it -> the `Transport` answers -> `settle.decide` says what the
answer means -> `_apply` counts it, pauses whom it must, and ends or
retries the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
import uuid
from collections import deque

from ratedeck.core.errors import RatedeckError
from ratedeck.core.policy import Policy
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import CooldownScope, Ending, EventKind, Pacing, Phase

from . import outcome as oc
from .budgets import Budgets
from .cluster import ClusterMember, LeasedSlots, SharedState, budget_name, gate_names
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
from .delays import Quota
from .gate import CooldownGate
from .headroom import HeadroomController
from .limiter import Stamp, WindowLimiter
from .metrics import Metrics
from .multicall import source_from_config
from .ports import Source
from .probe import Probe
from .queues import Graveyard, WorkQueues
from .request import CallFn, DoneCallback, Request
from .settings import EngineSettings, HoldsEngineSettings, engine_settings
from .settle import Scope, SettleRules, Tally, Verdict, decide
from .snapshot import BudgetRow, Event, GateRow, Snapshot
from .transport import Transport
from .worker import KeyWorker


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
    """

    def __init__(
        self,
        cfg: EngineSettings | HoldsEngineSettings,
        transport: Transport,
        *,
        source: Source | None = None,
        rng: random.Random | None = None,
        shared_state: SharedState | None = None,
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
        # A cheap endpoint timed for the network's spread (engine/probe.py); off without a probe_url.
        self.probe: Probe | None = None
        if cfg.target.probe_url:
            self.probe = Probe(
                cfg.target.probe_url,
                cfg.target.probe_rate,
                get=getattr(transport, "probe", None),
                timeout_s=cfg.target.timeout_s,
            )
        self.queues = WorkQueues()
        self.metrics = Metrics()
        self.graveyard = Graveyard(e.graveyard_path)
        self.backpressure = e.backpressure
        self.queue_max = e.queue_max
        self.ttl_s = e.ttl_s
        self.source: Source = source or source_from_config(cfg, self.rng)
        self.workers: list[KeyWorker] = []
        self.gates: dict[str, CooldownGate] = {}
        self.redact = Redactor(k.secret for k in cfg.keys)
        seconds = self.headroom.seconds
        pacing = Pacing(e.pacing)
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
            limiter = make_limiter(spec.policies)
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
            for w in self.workers:
                w.gates = (*w.gates, self.store_gate)
                w.leases = LeasedSlots()
                w.want_leases = self.cluster.want
        self.cooldown_scope = CooldownScope.SHARED  # the bench's per-request mode: bench/ (issue 21)
        self.settle_rules = SettleRules(
            max_attempts=e.max_attempts,
            backoff_base_s=e.backoff_base_ms / 1000.0,
            backoff_cap_s=e.backoff_cap_ms / 1000.0,
            host_gate=bool(cfg.host_policies),
            host_limit_match=cfg.target.host_limit_match,
        )
        self.pool_capacity = dict(cfg.pools)
        self.pool_in_use = dict.fromkeys(cfg.pools, 0)
        self.pool_ok = self._pool_has_room if cfg.pools else None
        self.pool_ok_req = (lambda req: self._pool_has_room(req.pool)) if cfg.pools else None
        self.by_label = {w.label: w for w in self.workers}
        self.in_flight = 0
        self.events: deque[Event] = deque(maxlen=200)
        self.stopping = False
        self.phase = Phase.STARTING
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_name = ""  # "uvloop" or "asyncio", once started
        self.clock = time.monotonic  # replaced by the loop's clock in start()
        self.started_at = 0.0
        self.ended_at: float | None = None
        self._wall_offset = 0.0
        self._tasks: list[asyncio.Task] = []
        self._sends: dict[int, asyncio.Task] = {}  # attempts in flight, by request id
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
        # Called with (request, ending) for every request that ends (a results
        # file, metrics): after the request's own on_done.
        self.finish_watchers: list[DoneCallback] = []

    @property
    def retry_errors(self) -> bool:
        """Whether errors other than rate limits are retried (a library caller wants them at once)."""
        return self.settle_rules.retry_errors

    @retry_errors.setter
    def retry_errors(self, on: bool) -> None:
        self.settle_rules = dataclasses.replace(self.settle_rules, retry_errors=on)

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
        self.event(EventKind.INFO, f"started: {len(self.workers)} keys, capacity {self.cfg.capacity_tps:g}/s")

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
        timeout = self.cfg.engine.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        if self._sends:
            _done, pending = await asyncio.wait(set(self._sends.values()), timeout=timeout)
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

    # ------------------------------------------------------------ sending
    def launch(
        self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple[Stamp, ...] = ()
    ) -> None:
        """Send one attempt in its own task (so a key keeps several in flight)."""
        req.attempts += 1
        self.in_flight += 1
        self.metrics.sent += 1
        sent_at = req.last_sent_at = stamps[0].t if stamps else self.clock()
        if req.first_sent_at is None:
            req.first_sent_at = sent_at
            self.metrics.queue_wait.add((sent_at - req.created_at) * 1000.0)
        if req.pool is not None and self.pool_ok is not None:
            self.pool_in_use[req.pool] = self.pool_in_use.get(req.pool, 0) + 1
        loop = self.loop
        assert loop is not None, "launch() before start()"
        # The attempt takes itself out of `_sends` when it ends (no done callback: one
        # loop turn less per request). A request has one attempt in flight at a time.
        self._sends[req.id] = loop.create_task(self._attempt(worker, req, nonce, stamps))

    async def _attempt(
        self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple[Stamp, ...]
    ) -> None:
        try:
            result = await self.transport.send(worker.spec, req, nonce)
        except asyncio.CancelledError:
            self._sends.pop(req.id, None)
            raise  # stopped while in flight: the request stays counted as in flight
        except Exception as exc:  # a transport bug must not lose the request
            result = oc.Outcome(oc.CONNECTION, error=f"{type(exc).__name__}")
        self._sends.pop(req.id, None)
        result.key = worker.label
        worker.answered(result)
        self.in_flight -= 1
        if req.pool is not None and self.pool_ok is not None:
            self.pool_in_use[req.pool] -= 1
            self.queues.pass_on()  # a request waiting for this pool may go now
        now = self.clock()
        try:
            if result.status is not None and stamps:
                # Timed from the slot's stamp, not from the socket write: the task
                # may start late on a busy loop, and the server sees that delay too.
                held = now - stamps[0].t
                # The server's own time (a hint, judged there) and remaining count.
                server_s = result.server_time_s
                # A 429 counts against the rejection budget here, whatever _apply makes of it.
                rejected = result.kind is oc.RATE_LIMITED
                self.headroom.observe_rtt(held, now, server_s, result.remaining, rejected)
                # The answer bounds how late the server stamped this request: its
                # slot frees by that, not by the worst case (see headroom.py).
                self.headroom.assign(stamps, held, now, server_s)
            self._settle(worker, req, result, now)
        except Exception as exc:
            # Whatever went wrong in handling the answer, the request is
            # accounted for: it ends in the graveyard with the error named.
            self._settle_failed(req, exc, now)
        worker.wake_if_sooner(now)

    def _settle(self, worker: KeyWorker, req: Request, result: oc.Outcome, now: float) -> None:
        """Decide what the answer means (`settle.decide`, pure) and apply it here."""
        req.last_status = result.status
        req.result = result
        if result.policy_header is not None and self.cfg.engine.learn_policy:
            for policy in worker.adopt_advertised(result.policy_header):
                self.event(EventKind.SETTING, f"{worker.label}: server advertises {policy}; adopted it")
        if result.quotas:
            self._sync_quotas(worker, req, result, now)
        verdict = decide(result, req, self.settle_rules, now)
        self._apply(verdict, worker, req, result, now)

    def _sync_quotas(self, worker: KeyWorker, req: Request, result: oc.Outcome, now: float) -> None:
        """Take the server's own counts: a budget it names, a weight budget, else the key's own.

        What this key spent after the answered request was sent is added, since
        the server cannot have counted it yet (`spent_since`).
        """
        sent_at = req.last_sent_at if req.last_sent_at is not None else now
        for quota in result.quotas:
            limiter = self._limiter_for_quota(worker, quota)
            if limiter is None:
                continue
            reset_at = now + quota.reset_in_s if quota.reset_in_s is not None else None
            limiter.sync(
                now,
                used=quota.used,
                remaining=quota.remaining,
                limit=quota.limit,
                reset_at=reset_at,
                window_s=quota.window_s,
                sent_since=limiter.spent_since(sent_at),
                sent_at=sent_at,
            )
            worker.note_quota(quota, reset_at)

    def _limiter_for_quota(self, worker: KeyWorker, quota: Quota) -> WindowLimiter | None:
        name = quota.name
        if name is not None:
            if name in worker.key_budgets:
                return worker.key_budgets[name]
            if name in self.budgets.host:
                return self.budgets.host[name]
        if quota.weight:
            return next(
                (self.budgets.host[b.name] for b in self.cfg.budgets if b.weighted and b.scope == "host"),
                None,
            )
        if name in (None, "core", "default") or not self.budgets.specs:
            return worker.limiter
        return None

    def _apply(self, v: Verdict, worker: KeyWorker, req: Request, result: oc.Outcome, now: float) -> None:
        """Apply one verdict: count, pause, block, then end or retry the request."""
        m = self.metrics
        widen = v.widen_headroom
        worker.tally(v.tally, req.last_sent_at)
        if v.tally is Tally.SUCCEEDED:
            m.success(result.latency_s * 1000.0, (now - req.intended_at) * 1000.0)
        elif v.tally is Tally.REJECTED_429:
            m.rejected_429 += 1
            # A 429 while the headroom deliberately narrows (a rejection budget, remaining
            # counts) is about timing, not the limit: learn nothing from it.
            if self.cfg.engine.learn_policy and req.last_sent_at is not None and not self.headroom.narrowing:
                learned = worker.learn_from_rejection(req.last_sent_at, self.headroom.seconds(), now)
                if learned is not None or worker.learned_limit is not None:
                    widen = False  # the limit was wrong, not the timing: the headroom stays
                if learned is not None:
                    self.event(
                        EventKind.SETTING,
                        f"{worker.label}: told {worker.told}, learned {learned} from rejections",
                    )
        elif v.tally is Tally.REJECTED_OTHER:
            m.rejected_other += 1
        else:
            m.fail(v.cause or str(result.kind))
        if v.tally is not Tally.SUCCEEDED:
            req.last_error = result.error or str(result.kind)
            cause = str(result.kind) if result.status is not None else (result.error or str(result.kind))
            m.errors.add(
                result.status, result.kind, cause, req.last_error, worker.label, now - self.started_at
            )
        if widen:
            self.headroom.observe_rejection(now)
        if v.cooldown is not None:
            host_gate = self.host_gate if v.cooldown.scope is Scope.HOST else None
            gate = host_gate if host_gate is not None else worker.gates[0]
            self._cool(gate, req, now, v.cooldown.delay_s, v.cooldown.reason)
        if v.block_key and worker.block():
            self.event(
                EventKind.ERROR, f"{worker.label} {worker.masked} blocked by the server ({result.status})"
            )
        if v.ending is Ending.SUCCEEDED:
            self._finish(req, Ending.SUCCEEDED)
        elif v.ending is Ending.GRAVEYARD:
            self._bury(req, now)
        elif v.ending is Ending.EXPIRED:
            self.expire(req)
        else:
            delay = self.rng.uniform(0, v.backoff_cap_s) if v.backoff_cap_s > 0 else 0.0
            req.eligible_at = max(req.eligible_at, now + delay)
            self.metrics.retried += 1
            self.queues.retry(req)

    def _settle_failed(self, req: Request, exc: Exception, now: float) -> None:
        problem = f"internal error while handling an answer: {type(exc).__name__}: {exc}"
        self.event(EventKind.ERROR, self.redact(problem, 300))
        if req.ending is not None:
            return
        if req in self.queues.dlq:  # queued for a retry before the error: it is still accounted
            return
        self.metrics.fail(f"internal:{type(exc).__name__}")
        req.last_error = f"internal error: {type(exc).__name__}"
        self._bury(req, now)

    def _cool(self, gate: CooldownGate, req: Request, now: float, delay: float, reason: str) -> None:
        """Honour a server's delay: close the budget's gate for every sender (shared),
        or, in the pre-actor design kept for comparison, hold back only this request."""
        if self.cooldown_scope is CooldownScope.SHARED:
            escalations = gate.escalations
            if gate.close(now + delay, reason, now):
                self.event(EventKind.COOLDOWN, f"{gate.name} cooling down {delay:.1f}s: {reason}")
                if self.cluster is not None:
                    self.cluster.gate_closed(gate, reason)  # every member stops, not only this one
                if gate.escalations > escalations:
                    self.event(
                        EventKind.ERROR, f"{gate.name}: the server escalated its penalty to {delay:.1f}s"
                    )
        else:
            req.eligible_at = now + delay * 1.1  # "slightly more than the error said"

    def _pool_has_room(self, pool: str | None) -> bool:
        if pool is None:
            return True
        return self.pool_in_use.get(pool, 0) < self.pool_capacity.get(pool, 1 << 30)

    def _budget_rows(self, now: float) -> tuple[BudgetRow, ...]:
        rows = []
        for name, lim in self.budgets.host.items():
            used, limit = lim.used(now)
            rows.append(BudgetRow(name, "host", used, limit, self.budgets.specs[name].weighted))
        for w in self.workers:
            for name, lim in w.key_budgets.items():
                used, limit = lim.used(now)
                rows.append(BudgetRow(name, w.label, used, limit, self.budgets.specs[name].weighted))
        return tuple(rows)

    def all_limiters(self) -> list[WindowLimiter]:
        limiters = [w.limiter for w in self.workers] + list(self.budgets.host.values())
        limiters += [lim for w in self.workers for lim in w.key_budgets.values()]
        if self.host_limiter is not None:
            limiters.append(self.host_limiter)
        return limiters

    def capacity_tps(self) -> float:
        """Requests per second the keys allow (advertised limits included), host limit applied."""
        total = sum(w.limiter.capacity_tps for w in self.workers)
        if self.host_limiter is not None:
            total = min(total, self.host_limiter.capacity_tps)
        return total

    def live_capacity(self, now: float) -> float:
        """Requests per second the keys that can send now really allow.

        Keys that are paused, blocked or cooling down count for nothing. The
        limiter spaces sends by (window + headroom) / limit, so the headroom
        is part of the rate: the nominal limit would promise a few percent
        more than can be sent.
        """
        h = self.headroom.seconds()
        total = 0.0
        for w in self.workers:
            if w.can_send(now):
                total += min(p.limit / (p.window_s + h) for p in w.limiter.policies)
        if self.host_limiter is not None and self.host_gate is not None:
            if self.host_gate.open_at > now:
                return 0.0
            total = min(total, min(p.limit / (p.window_s + h) for p in self.host_limiter.policies))
        return total

    def next_gate_open(self, now: float) -> float | None:
        later = [w.gate_open_at() for w in self.workers if not (w.paused or w.blocked)]
        later = [t for t in later if t > now]
        return min(later) if later else None

    def _bury(self, req: Request, now: float) -> None:
        self.metrics.graveyard += 1
        self.graveyard.add(req, now, self._wall_offset)
        if self.metrics.graveyard <= 20 or self.metrics.graveyard % 100 == 0:
            self.event(
                EventKind.GRAVEYARD,
                f"request {req.id} buried after {req.attempts} attempts ({req.last_error})",
            )
        self._finish(req, Ending.GRAVEYARD)

    def expire(self, req: Request) -> None:
        self.metrics.expired += 1
        self._finish(req, Ending.EXPIRED)

    def shed(self, req: Request) -> None:
        self.metrics.shed += 1
        self._finish(req, Ending.SHED)

    def _finish(self, req: Request, ending: Ending) -> None:
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
        self.queues.put(req)

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
        """A request created now, with the engine's TTL unless `ttl_s` is given.

        `intended_at` is when it should have arrived (a fixed arrival rate's
        schedule): latency from arrival counts from there.
        """
        now = self.clock()
        self._next_id += 1
        if pool is not None and self.pool_capacity and pool not in self.pool_capacity:
            raise ValueError(f"no pool {pool!r}; pools are {', '.join(self.pool_capacity)}")
        deadline = now + (self.ttl_s if ttl_s is None else ttl_s)
        req = Request(self._next_id, now, deadline, params, pool=pool, call=call, intended_at=intended_at)
        if self.cfg.target.idempotency:
            req.idempotency_key = uuid.uuid4().hex  # one per logical request, kept across its retries
        return req

    def source_done(self) -> None:
        self._check_finished()

    def wall_time(self, t: float) -> float:
        return t + self._wall_offset

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            self.event(EventKind.ERROR, text)

    def _check_finished(self) -> None:
        if (
            self.source.exhausted
            and not self.in_flight
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
            self.metrics.sample_depths(len(self.queues.main), len(self.queues.dlq))
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
                self.event(EventKind.SETTING, f"arrival rate {rate:g}/s")
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

    def event(self, kind: EventKind, text: str) -> None:
        at = (self.clock() - self.started_at) if self.loop is not None else 0.0
        self.events.append(Event(round(at, 1), EventKind(kind), text))

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
            main_depth=len(self.queues.main),
            dlq_depth=len(self.queues.dlq),
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
        )
