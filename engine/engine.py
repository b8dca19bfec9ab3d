"""The engine: key workers, queues, generator, outcome handling and snapshots.

Every request ends in exactly one place: succeeded, expired, graveyard or
shed; while the run lasts it is queued (main or DLQ) or in flight. The engine
owns all state and runs on one asyncio loop; other threads talk to it through
a host (`runtime.py`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque

from . import outcome as oc
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
from .config import RunConfig
from .delays import advertised_policies
from .gate import CooldownGate
from .headroom import HeadroomController
from .limiter import WindowLimiter
from .messages import workload_from_config
from .metrics import Metrics
from .queues import Graveyard, WorkQueues
from .request import Request
from .snapshot import Event, GateRow, KeyRow, Snapshot
from .transport import Transport
from .worker import KeyWorker
from .workload import Workload


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


class UnknownKey(ValueError):
    """A command named a key id that does not exist."""


class Engine:
    """Runs one configured workload against one target through a `Transport`.

    Use `start()` on a running loop (or `await run()`), steer it with
    `apply(command)`, read it with `snapshot()`, end it with `await stop()`.
    """

    def __init__(
        self,
        cfg: RunConfig,
        transport: Transport,
        *,
        workload: Workload | None = None,
        rng: random.Random | None = None,
    ):
        self.cfg = cfg
        self.transport = transport
        self.rng = rng or random.Random(cfg.seed)
        e = cfg.engine
        self.headroom = HeadroomController(
            initial_ms=e.headroom_initial_ms,
            min_ms=e.headroom_min_ms,
            max_ms=e.headroom_max_ms,
            fixed_ms=None if e.headroom == "adaptive" else float(e.headroom),
            rejection_budget=e.rejection_budget,
        )
        self.queues = WorkQueues()
        self.metrics = Metrics()
        self.graveyard = Graveyard(e.graveyard_path)
        self.backpressure = e.backpressure
        self.queue_max = e.queue_max
        self.ttl_s = e.ttl_s
        self.workload = workload or workload_from_config(cfg, self.rng)
        self.workers: list[KeyWorker] = []
        self.gates: dict[str, CooldownGate] = {}
        seconds = self.headroom.seconds
        # A host-wide limit is one more budget every key spends, with its own gate.
        pace = self.headroom.pace_seconds
        self.host_limiter = (
            WindowLimiter(cfg.host_policies, seconds, e.pacing, pace_s=pace) if cfg.host_policies else None
        )
        self.host_gate = CooldownGate("host") if cfg.host_policies else None
        if self.host_gate is not None:
            self.gates["host"] = self.host_gate
        shared = (self.host_limiter,) if self.host_limiter else ()
        for spec in cfg.keys:
            gate = self.gates.setdefault(spec.label, CooldownGate(spec.label))
            gates = (gate, self.host_gate) if self.host_gate else (gate,)
            # Sends closer than the network jitter can reach a nonce-checking
            # server out of order: keep whole gaps there.
            limiter = WindowLimiter(
                spec.policies,
                seconds,
                e.pacing,
                min_spacing=1.0 if cfg.target.nonce_param else 0.9,
                pace_s=pace,
            )
            self.workers.append(
                KeyWorker(
                    self,
                    spec,
                    limiter,
                    gates,
                    e.in_flight_per_key,
                    use_nonce=bool(cfg.target.nonce_param),
                    shared=shared,
                )
            )
        self.shared_cooldown = e.cooldown == "shared"
        self.retry_errors = True  # the library turns this off: errors reach the caller at once
        self.pool_capacity = dict(cfg.pools)
        self.pool_in_use = dict.fromkeys(cfg.pools, 0)
        self.pool_ok = self._pool_has_room if cfg.pools else None
        self.by_label = {w.label: w for w in self.workers}
        self.in_flight = 0
        self.events: deque[Event] = deque(maxlen=200)
        self.stopping = False
        self.phase = "starting"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started_at = 0.0
        self.ended_at: float | None = None
        self._wall_offset = 0.0
        self._tasks: list[asyncio.Task] = []
        self._sends: set[asyncio.Task] = set()
        self.finished: asyncio.Event | None = None  # created on the loop in start()
        self._next_id = 0
        self.problems: list[str] = []

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start workers, the generator and the ticker on the running loop."""
        self.loop = asyncio.get_running_loop()
        self.clock = engine_clock(self.loop)
        self.started_at = self.clock()
        self._wall_offset = time.time() - self.started_at
        self.finished = asyncio.Event()
        self.phase = "running"
        self._tasks = [self.loop.create_task(w.run(), name=f"key-{w.label}") for w in self.workers]
        self._tasks.append(self.loop.create_task(self.workload.run(self), name="generator"))
        self._tasks.append(self.loop.create_task(self._tick(), name="ticker"))
        self.event("info", f"started: {len(self.workers)} keys, capacity {self.cfg.capacity_tps:g}/s")

    async def run(self, duration_s: float | None = None) -> Snapshot:
        """Start, run until `duration_s` passes or the workload is done, then stop."""
        self.start()
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
        self.phase = "draining"
        self.queues.release_space()
        for w in self.workers:
            w.poke()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        timeout = self.cfg.engine.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        if self._sends:
            done, pending = await asyncio.wait(set(self._sends), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        self._expire_queued(self.clock())
        self.ended_at = self.clock()
        self.phase = "stopped"
        self._flush_graveyard()
        self.event("info", "stopped")
        return self.snapshot()

    # ------------------------------------------------------------ sending
    def launch(self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple = ()) -> None:
        """Send one attempt in its own task (so a key keeps several in flight)."""
        req.attempts += 1
        self.in_flight += 1
        self.metrics.sent += 1
        if req.pool is not None and self.pool_ok is not None:
            self.pool_in_use[req.pool] = self.pool_in_use.get(req.pool, 0) + 1
        task = self.loop.create_task(self._attempt(worker, req, nonce, stamps))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _attempt(self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple) -> None:
        try:
            result = await self.transport.send(worker.spec, req, nonce)
        except asyncio.CancelledError:
            raise  # stopped while in flight: the request stays counted as in flight
        except Exception as exc:  # a transport bug must not lose the request
            result = oc.Outcome(oc.CONNECTION, error=f"{type(exc).__name__}")
        worker.in_flight -= 1
        self.in_flight -= 1
        if req.pool is not None and self.pool_ok is not None:
            self.pool_in_use[req.pool] -= 1
            self.queues.pass_on()  # a request waiting for this pool may go now
        now = self.clock()
        if result.status is not None and stamps:
            # Timed from the slot's stamp, not from the socket write: the task
            # may start late on a busy loop, and the server sees that delay too.
            held = now - stamps[0].t
            self.headroom.observe_rtt(held, now)
            # The answer bounds how late the server stamped this request: its
            # slot frees by that, not by the worst case (see headroom.py).
            extra = self.headroom.extra_for(held, now)
            for stamp in stamps:
                stamp.extra = extra
        self._settle(worker, req, result, now)
        worker.poke()

    def _settle(self, worker: KeyWorker, req: Request, result: oc.Outcome, now: float) -> None:
        m = self.metrics
        kind = result.kind
        req.last_status = result.status
        req.result = result
        if result.status is not None:
            worker.last_latency_ms = result.latency_s * 1000.0
            if result.policy_header is not None and result.policy_header != worker.policy_header:
                self._learn_policy(worker, result.policy_header)
        if kind == oc.OK:
            m.success(result.latency_s * 1000.0)
            worker.succeeded += 1
            self._finish(req, "succeeded")
            return
        req.last_error = result.error or kind
        if kind == oc.RATE_LIMITED:
            m.rejected_429 += 1
            worker.rejected_429 += 1
            self.headroom.observe_rejection(now)
            if result.retry_after_s is not None:
                host = self.host_gate is not None and self.cfg.target.host_limit_match in (result.error or "")
                gate = self.host_gate if host else worker.gates[0]
                self._cool(
                    gate, req, now, result.retry_after_s, f"429, asked to wait {result.retry_after_s:g}s"
                )
        elif kind == oc.BLOCKED:
            if result.status == 429:
                m.rejected_429 += 1
                worker.rejected_429 += 1
            else:
                m.rejected_other += 1
            if not worker.blocked:
                worker.blocked = True
                self.event("error", f"{worker.label} {worker.masked} blocked by the server ({result.status})")
            if not self.retry_errors:
                self._bury(req, now)
                return
            self._retry(req, now, immediate=True)  # another key may still serve it
            return
        elif kind in (oc.NONCE, oc.CLIENT_ERROR):
            m.rejected_other += 1
            if kind == oc.CLIENT_ERROR:
                self._bury(req, now)  # retrying a bad request only repeats the error
                return
            self._retry(req, now, immediate=True)
            return
        else:  # server error, timeout, connection
            cause = f"{result.status}" if result.status is not None else kind
            m.fail(cause)
            if result.retry_after_s is not None:
                self._cool(
                    worker.gates[0],
                    req,
                    now,
                    result.retry_after_s,
                    f"{cause}, asked to wait {result.retry_after_s:g}s",
                )
            if not self.retry_errors:
                self._bury(req, now)
                return
        self._retry(req, now)

    def _cool(self, gate: CooldownGate, req: Request, now: float, delay: float, reason: str) -> None:
        """Honour a server's delay: close the budget's gate for every sender (shared),
        or, in the pre-actor design kept for comparison, hold back only this request."""
        if self.shared_cooldown:
            escalations = gate.escalations
            if gate.close(now + delay, reason, now):
                self.event("cooldown", f"{gate.name} cooling down {delay:.1f}s: {reason}")
                if gate.escalations > escalations:
                    self.event("error", f"{gate.name}: the server escalated its penalty to {delay:.1f}s")
        else:
            req.eligible_at = now + delay * 1.1  # "slightly more than the error said"

    def _learn_policy(self, worker: KeyWorker, header: str) -> None:
        """Adopt limits the server advertises (RateLimit-Policy) that are tighter than ours."""
        worker.policy_header = header
        if not self.cfg.engine.learn_policy:
            return
        for policy in advertised_policies(header):
            if worker.limiter.add_policy(policy):
                self.event("setting", f"{worker.label}: server advertises {policy}; adopted it")

    def _pool_has_room(self, pool: str | None) -> bool:
        if pool is None:
            return True
        return self.pool_in_use.get(pool, 0) < self.pool_capacity.get(pool, 1 << 30)

    def capacity_tps(self) -> float:
        """Requests per second the keys allow now (advertised limits included), host limit applied."""
        total = sum(w.limiter.capacity_tps for w in self.workers)
        if self.host_limiter is not None:
            total = min(total, self.host_limiter.capacity_tps)
        return total

    def _retry(self, req: Request, now: float, immediate: bool = False) -> None:
        if req.attempts >= self.cfg.engine.max_attempts:
            self._bury(req, now)
            return
        if req.deadline <= now:
            self.expire(req)
            return
        e = self.cfg.engine
        if immediate:
            delay = 0.0
        else:  # exponential backoff with full jitter
            cap = min(e.backoff_cap_ms, e.backoff_base_ms * (2 ** (req.attempts - 1)))
            delay = self.rng.uniform(0, cap) / 1000.0
        req.eligible_at = max(req.eligible_at, now + delay)
        self.metrics.retried += 1
        self.queues.retry(req)

    def _bury(self, req: Request, now: float) -> None:
        self.metrics.graveyard += 1
        self.graveyard.add(req, now, self._wall_offset)
        if self.metrics.graveyard <= 20 or self.metrics.graveyard % 100 == 0:
            self.event(
                "graveyard", f"request {req.id} buried after {req.attempts} attempts ({req.last_error})"
            )
        self._finish(req, "graveyard")

    def expire(self, req: Request) -> None:
        self.metrics.expired += 1
        self._finish(req, "expired")

    def shed(self, req: Request) -> None:
        self.metrics.shed += 1
        self._finish(req, "shed")

    def _finish(self, req: Request, where: str) -> None:
        if req.on_done is not None:
            req.on_done(req, where)
        self._check_finished()

    # ------------------------------------------------------------ generator side
    def submit(self, req: Request) -> None:
        """Accept a newly generated request into the main queue."""
        self.metrics.generated += 1
        self.queues.put(req)

    def new_request(
        self, params: dict | None = None, pool: str | None = None, ttl_s: float | None = None
    ) -> Request:
        """A request created now, with the engine's TTL unless `ttl_s` is given."""
        now = self.clock()
        self._next_id += 1
        if pool is not None and self.pool_capacity and pool not in self.pool_capacity:
            raise ValueError(f"no pool {pool!r}; pools are {', '.join(self.pool_capacity)}")
        return Request(self._next_id, now, now + (self.ttl_s if ttl_s is None else ttl_s), params, pool=pool)

    def _check_finished(self) -> None:
        if (
            self.workload.exhausted
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
            await asyncio.sleep(0.1)
            now = self.clock()
            self._expire_queued(now)
            self.metrics.sample_depths(len(self.queues.main), len(self.queues.dlq))
            while now >= next_second:
                self.metrics.close_second()
                self._workload_second()
                next_second += 1.0
                self._flush_graveyard()
            self._check_finished()

    def _expire_queued(self, now: float) -> None:
        for req in self.queues.drain_expired(now):
            self.expire(req)

    def _flush_graveyard(self) -> None:
        problem = self.graveyard.flush()
        if problem and problem not in self.problems:
            self.problems.append(problem)
            self.event("error", problem)

    # ------------------------------------------------------------ control
    def apply(self, cmd: Command) -> None:
        """Apply one command now. Raises `UnknownKey` for a key id that does not exist."""
        match cmd:
            case PauseKey(key=key):
                self._worker(key).paused = True
                self.event("pause", f"{key} paused")
            case ResumeKey(key=key):
                w = self._worker(key)
                w.paused = False
                w.poke()
                self.event("pause", f"{key} resumed")
            case PauseAll():
                for w in self.workers:
                    w.paused = True
                self.event("pause", "all keys paused")
            case ResumeAll():
                for w in self.workers:
                    w.paused = False
                    w.poke()
                self.event("pause", "all keys resumed")
            case SetHeadroom(ms=None):
                self.headroom.set_adaptive()
                self.event("setting", "headroom adaptive")
                self._poke_all()
            case SetHeadroom(ms=ms):
                if ms < 0:
                    raise ValueError(f"headroom must be 0 ms or more, got {ms}")
                self.headroom.set_fixed(ms)
                self.event("setting", f"headroom fixed at {self.headroom.value_ms:g} ms")
                self._poke_all()
            case SetBackpressure(on=on):
                self.backpressure = on
                if not on:
                    self.queues.release_space()
                self.workload.poke()
                self.event("setting", f"backpressure {'on' if on else 'off'}")
            case SetArrivalRate(rate=rate):
                if rate < 0:
                    raise ValueError(f"arrival rate must be 0 or more, got {rate}")
                self.workload.set_rate(rate)
                self.event("setting", f"arrival rate {rate:g}/s")
            case SetThrottle(mode_or_rate=value):
                set_throttle = getattr(self.workload, "set_throttle", None)
                if set_throttle is None:
                    raise ValueError("the entry throttle needs a message workload ([messages] in the config)")
                set_throttle(value)
                self.event("setting", f"entry throttle {value}")
            case _:
                raise TypeError(f"not a command: {cmd!r}")

    def _worker(self, key: str) -> KeyWorker:
        try:
            return self.by_label[key]
        except KeyError:
            raise UnknownKey(f"no key {key!r}; keys are {', '.join(self.by_label)}") from None

    def _poke_all(self) -> None:
        for w in self.workers:
            w.poke()

    def event(self, kind: str, text: str) -> None:
        at = (self.clock() - self.started_at) if self.loop is not None else 0.0
        self.events.append(Event(round(at, 1), kind, text))

    # ------------------------------------------------------------ reading
    def snapshot(self) -> Snapshot:
        """An immutable picture of everything, consistent because it is built on the loop."""
        m = self.metrics
        now = self.clock() if self.loop is not None else 0.0
        end = self.ended_at if self.ended_at is not None else now
        elapsed = max(0.0, end - self.started_at) if self.loop is not None else 0.0
        rows = []
        for w in self.workers:
            used, limit = w.window_fill(now)
            left = max(g.left(now) for g in w.gates)
            state = "blocked" if w.blocked else "paused" if w.paused else "cooling" if left > 0 else "active"
            rows.append(
                KeyRow(
                    w.label,
                    w.masked,
                    state,
                    round(left, 1),
                    w.in_flight,
                    w.sent,
                    w.succeeded,
                    w.rejected_429,
                    used,
                    limit,
                    w.last_latency_ms,
                )
            )
        h = self.headroom
        return Snapshot(
            elapsed_s=elapsed,
            phase=self.phase,
            capacity_tps=self.capacity_tps(),
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
            arrival_rate=self.workload.rate,
            latency=m.latency.summary(),
            tps_series=tuple(m.tps_series),
            p50_series=tuple(m.p50_series),
            p99_series=tuple(m.p99_series),
            keys=tuple(rows),
            events=tuple(self.events),
            gates=tuple(
                GateRow(g.name, round(g.left(now), 1), g.reason, g.closures, g.escalations)
                for g in self.gates.values()
            ),
            **self._workload_fields(),
        )

    # ------------------------------------------------------------ workload hooks
    # A workload may add Snapshot fields (`snapshot_fields()`) and roll its own
    # per-second series (`close_second()`): the message workload does both.
    def _workload_fields(self) -> dict:
        fields = getattr(self.workload, "snapshot_fields", None)
        return fields() if fields is not None else {}

    def _workload_second(self) -> None:
        close = getattr(self.workload, "close_second", None)
        if close is not None:
            close()
