"""A request's path from its launch to its verdict: send, settle, apply.

A key worker launches an attempt (`RequestPath.launch`), the `Transport`
answers in the attempt's own task with an `Outcome`, the key takes its facts
and returns what it knows (`ports.KeySide.answered`), `settle.decide` (pure)
returns the `Verdict`, and `_apply` carries it out: counts it, hands the key
its part (`KeySide.carry_out`: its tally, its block; the key's gate to close),
closes the gates (through the `Cooldown`), and ends the request (buried,
expired, succeeded: handed to the run's end, `Endings.finish`, path/ending.py) or
queues its retry. The path knows its key only as a `KeySide`. The path sees the other parts only through the ports (`ports.py`): it
hands a request on once, at its end.

The hot path: everything a request touches is an attribute of this object
or bound once (`_send`, `_finish`, `_cool`); no closure or
object is made per request beyond the attempt's task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Ending, EventKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.transport import Transport
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.observe.metrics import Metrics
from ratedeck.engine.observe.recording import Recorder
from ratedeck.engine.observe.spend import SpendMeter
from ratedeck.engine.ports import Cooldown, Endings, EventSink, GateWatcher, KeySide, SendStamp
from ratedeck.engine.queues import Graveyard, WorkQueues
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec
from ratedeck.engine.snapshot import ErrorRow

from .settle import Scope, SettleRules, Tally, Verdict, decide


class SharedGates:
    """The engine's cooldown: a server's delay closes the budget's gate for every sender,
    and a cluster member (`watcher`) shares it with the other processes."""

    __slots__ = ("event", "watcher")

    def __init__(self, events: EventSink, watcher: GateWatcher | None = None) -> None:
        self.event = events.event
        self.watcher = watcher

    def cool(self, gate: CooldownGate, req: Request, now: float, delay_s: float, reason: str) -> None:
        escalations = gate.escalations
        if gate.close(now + delay_s, reason, now):
            self.event(EventKind.COOLDOWN, f"{gate.name} cooling down {delay_s:.1f}s: {reason}")
            if self.watcher is not None:
                self.watcher.gate_closed(gate, reason)  # every member stops, not only this one
            if gate.escalations > escalations:
                self.event(
                    EventKind.ERROR, f"{gate.name}: the server escalated its penalty to {delay_s:.1f}s"
                )


def time_answer(
    headroom: HeadroomController, result: oc.Outcome, stamps: tuple[SendStamp, ...], now: float
) -> None:
    """The headroom learns from an answer's timing (a replay of a recording does the same,
    path/replay.py): its round trip, server time and remaining count, and the bound it puts
    on when the server stamped the request."""
    if result.status is not None and stamps:
        # Timed from the slot's stamp, not from the socket write: the task
        # may start late on a busy loop, and the server sees that delay too.
        held = now - stamps[0].t
        # What the attempt waited on our side before its exchange began was all on the way in.
        before = held - result.latency_s if result.latency_s > 0.0 else 0.0
        if result.head_s is not None:  # a stream: timed to its head, not to its end
            held = before + result.head_s
        # The server's own time (a hint, judged there) and remaining count.
        server_s = result.server_time_s
        # A 429 counts against the rejection budget here, whatever _apply makes of it.
        rejected = result.kind is oc.RATE_LIMITED
        headroom.observe_rtt(held, now, server_s, result.remaining, rejected)
        # The answer bounds how late the server stamped this request: its
        # slot frees by that, not by the worst case (see headroom.py).
        headroom.assign(stamps, held, now, server_s, before)
    elif stamps:
        headroom.let_go(stamps, now, result.kind is oc.TIMEOUT)


class RequestPath:
    """Attempts in flight and the verdicts on their answers, for one engine.

    `start(loop, clock, started_at, wall_offset)` binds it to the running loop.
    `in_flight` counts attempts in flight; `sends` holds their tasks.
    """

    def __init__(
        self,
        *,
        transport: Transport,
        queues: WorkQueues,
        metrics: Metrics,
        headroom: HeadroomController,
        graveyard: Graveyard,
        host_gate: CooldownGate,
        settle_rules: SettleRules,
        rng: random.Random,
        ends: Endings,
        events: EventSink,
        cooldown: Cooldown,
        redact: Redactor,
        pools: dict[str, int] | None = None,
        spend: SpendMeter | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.transport = transport
        self.recorder = recorder  # every answer's timing and limit headers, when asked (`--record`)
        self.spend = spend  # what the answers cost (None: no prices, no cap)
        self.queues = queues
        self.metrics = metrics
        self.headroom = headroom
        self.graveyard = graveyard
        self.host_gate = host_gate
        self.settle_rules = settle_rules
        self.rng = rng
        self._finish = ends.finish
        self._key_refused = ends.key_refused
        self.event = events.event
        self._cool = cooldown.cool
        self.redact = redact
        # Connection pools (`[pools]`): how many attempts each may have in flight.
        pools = pools or {}
        self.pool_capacity = dict(pools)
        self.pool_in_use = dict.fromkeys(pools, 0)
        self.pool_ok: Callable[[str | None], bool] | None = self._pool_has_room if pools else None
        self.in_flight = 0
        self.sends: dict[Request, asyncio.Task[None]] = {}  # attempts in flight, by request
        self.clock: Callable[[], float] = lambda: 0.0
        self.started_at = 0.0
        self.wall_offset = 0.0
        self._create_task: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None
        self._send: Callable[[KeySpec, Request, int | None], Awaitable[oc.Outcome]]  # bound in start()

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float],
        started_at: float,
        wall_offset: float,
    ) -> None:
        self._create_task = loop.create_task
        self._send = self.transport.send
        self.clock, self.started_at, self.wall_offset = clock, started_at, wall_offset
        if self.recorder is not None:
            self.recorder.start(started_at, started_at + wall_offset)

    @property
    def retry_errors(self) -> bool:
        return self.settle_rules.retry_errors

    @retry_errors.setter
    def retry_errors(self, on: bool) -> None:
        self.settle_rules = dataclasses.replace(self.settle_rules, retry_errors=on)

    def in_flight_requests(self) -> list[Request]:
        return list(self.sends)

    # ------------------------------------------------------------ sending
    def launch(
        self, key: KeySide, req: Request, nonce: int | None, stamps: tuple[SendStamp, ...] = ()
    ) -> None:
        """Send one attempt in its own task (so a key keeps several in flight)."""
        req.attempts += 1
        self.in_flight += 1
        m = self.metrics
        m.sent += 1
        sent_at = stamps[0].t if stamps else self.clock()
        if req.mark_sent(sent_at, key.label, stamps):
            m.queue_wait.add((sent_at - req.created_at) * 1000.0)
            flows = self.queues.flows
            if flows is not None:
                flows.sent(req, sent_at)  # its client's quota counts from the send (engine/flows.py)
        if self.pool_ok is not None and req.pool is not None:
            self.pool_in_use[req.pool] = self.pool_in_use.get(req.pool, 0) + 1
        create_task = self._create_task
        assert create_task is not None, "launch() before start()"
        # The attempt takes itself out of `sends` when it ends (no done callback: one
        # loop turn less per request). A request has one attempt in flight at a time.
        self.sends[req] = create_task(self._attempt(key, req, nonce, stamps))

    async def _attempt(
        self, key: KeySide, req: Request, nonce: int | None, stamps: tuple[SendStamp, ...]
    ) -> None:
        try:
            result = await self._send(key.spec, req, nonce)
        except asyncio.CancelledError:
            self.sends.pop(req, None)
            self.headroom.let_go(stamps, self.clock())  # its slots are not held for it
            raise  # stopped while in flight: the request stays counted as in flight
        except Exception as exc:  # a transport bug must not lose the request
            result = oc.Outcome(oc.CONNECTION, error=f"{type(exc).__name__}")
        self.sends.pop(req, None)
        result.key = key.label
        self.in_flight -= 1
        if self.pool_ok is not None and req.pool is not None:
            self.pool_in_use[req.pool] -= 1
            self.queues.pass_on()  # a request waiting for this pool may go now
        now = self.clock()
        if self.recorder is not None:  # once per answer, here where it is known (observe/recording.py)
            self.recorder.record(key.label, stamps[0].t if stamps else req.last_sent_at, now, result)
        try:
            time_answer(self.headroom, result, stamps, now)
            sent = req.sent_state()
            sent.last_status = result.status
            sent.result = result
            # The key takes the answer's facts (it learns what the answer says of its limits)
            # and returns what it knows for the verdict.
            self._settle(key, req, result, now, key.answered(result, req, stamps, now))
        except Exception as exc:
            # Whatever went wrong in handling the answer, the request is
            # accounted for: it ends in the graveyard with the error named.
            with contextlib.suppress(Exception):
                if req.sent_state().result is not result:  # the key has the answer all the same
                    key.answered(result, req, (), now)  # (its count in flight, its sizing)
            self._settle_failed(req, exc, now)
        key.wake_if_sooner(now)

    def _settle(
        self, key: KeySide, req: Request, result: oc.Outcome, now: float, facts: tuple[str, bool, bool, float]
    ) -> None:
        """`settle.decide` (pure) returns the verdict on the answer from what the key knows
        (`facts`: `KeySide.answered`'s label, refused, explains, cool-off), and it is carried out."""
        if self.spend is not None:
            self.spend.answered(req, result)
        label, refused, explains, cool = facts
        verdict = decide(result, req, self.settle_rules, now, label, refused, explains, cool)
        self._apply(verdict, key, req, result, now, refused)

    def _apply(
        self, v: Verdict, key: KeySide, req: Request, result: oc.Outcome, now: float, refused: bool
    ) -> None:
        """Carry out one verdict: count, pause, block (the key's part: `KeySide.carry_out`),
        pin, then end or retry the request. `refused`: the key was refused before this answer."""
        m = self.metrics
        tally = v.tally
        succeeded = tally is Tally.SUCCEEDED
        if succeeded:
            m.success(result.latency_s * 1000.0, (now - req.intended_at) * 1000.0)
            error = None
        else:
            if tally is Tally.REJECTED_429:
                m.rejected_429 += 1
            elif tally is Tally.REJECTED_OTHER:
                m.rejected_other += 1
            else:
                m.fail(v.cause or str(result.kind))
            req.last_error = result.error or str(result.kind)
            cause = str(result.kind) if result.status is not None else (result.error or str(result.kind))
            at_s = now - self.started_at
            m.errors.add(result.status, result.kind, cause, req.last_error, key.label, at_s)
            error = ErrorRow(result.status, result.kind, cause, 1, req.last_error, key.label, round(at_s, 1))
        if v.widen_headroom:
            self.headroom.observe_rejection(now)
        key_gate = key.carry_out(v, req, result, error)
        if v.cooldown is not None:
            cooldown = v.cooldown
            gate = self.host_gate if cooldown.scope is Scope.HOST else key_gate
            assert gate is not None  # a key-scoped cooldown closes the key's gate (`carry_out`)
            self._cool(gate, req, now, cooldown.delay_s, cooldown.reason)
        if v.unsure:
            req.unsure = True
            if result.request_id is not None or req.request_id is None:
                req.request_id = result.request_id
        if v.block_key and not refused:  # refused by this answer: the first time
            said = f"HTTP {result.status}" if result.status is not None else str(result.kind)
            if result.error and result.error != said:
                said += f": {result.error}"
            self.event(
                EventKind.ERROR,
                f"{key.label} {key.masked} refused by the server ({said}); not used again",
            )
            self._key_refused()
            self.strand(key.label, now)
        if v.pin is not None:
            req.pin = v.pin  # its retries go out on this key only (settle.decide)
        ending = v.ending
        if succeeded:
            self._finish(req, Ending.SUCCEEDED)
        elif ending is Ending.GRAVEYARD:
            self.bury(req, now)
        elif ending is Ending.EXPIRED:
            self.expire(req)
        elif ending is Ending.UNCERTAIN:
            self.uncertain(req)
        elif ending is Ending.SHED:  # its live client left mid-answer (settle._live_client_end)
            self.shed(req)
        else:
            delay = self.rng.uniform(0, v.backoff_cap_s) if v.backoff_cap_s > 0 else 0.0
            req.eligible_at = max(req.eligible_at, now + delay)
            m.retried += 1
            self.queues.retry(req)

    def _settle_failed(self, req: Request, exc: Exception, now: float) -> None:
        problem = f"internal error while handling an answer: {type(exc).__name__}: {exc}"
        self.event(EventKind.ERROR, self.redact(problem, 300))
        if req.ending is not None:
            return
        if req in self.queues.all_queued():  # queued for a retry before the error: it is still accounted
            return
        self.metrics.fail(f"internal:{type(exc).__name__}")
        req.last_error = f"internal error: {type(exc).__name__}"
        self.bury(req, now)

    def _pool_has_room(self, pool: str | None) -> bool:
        if pool is None:
            return True
        return self.pool_in_use.get(pool, 0) < self.pool_capacity.get(pool, 1 << 30)

    # ------------------------------------------------------------ endings
    def bury(self, req: Request, now: float) -> None:
        m = self.metrics
        m.graveyard += 1
        self.graveyard.add(req, now, self.wall_offset)
        if m.graveyard <= 20 or m.graveyard % 100 == 0:
            self.event(
                EventKind.GRAVEYARD,
                f"request {req.id} buried after {req.attempts} attempts ({req.last_error})",
            )
        self._finish(req, Ending.GRAVEYARD)

    def expire(self, req: Request) -> None:
        if req.unsure:  # its time ran out after an attempt that may have written
            self.uncertain(req)
            return
        self.metrics.expired += 1
        self._finish(req, Ending.EXPIRED)

    def uncertain(self, req: Request) -> None:
        """A write that may or may not have happened: reported with the server's request id."""
        m = self.metrics
        m.uncertain += 1
        if m.uncertain <= 20 or m.uncertain % 100 == 0:
            rid = f", server request id {req.request_id}" if req.request_id else ""
            self.event(
                EventKind.ERROR,
                f"request {req.id} uncertain on {req.key} after {req.attempts} attempts"
                f" ({req.last_error}){rid}",
            )
        self._finish(req, Ending.UNCERTAIN)

    def strand(self, label: str, now: float) -> None:
        """Key `label` is refused for good: the requests only it may send end here
        (uncertain when an attempt may have written, else in the graveyard)."""
        for req in self.queues.take_pinned(label):
            if req.unsure:
                self.uncertain(req)
            else:
                req.last_error = req.last_error or f"its key {label} was refused"
                self.bury(req, now)

    def shed(self, req: Request) -> None:
        self.metrics.shed += 1
        self._finish(req, Ending.SHED)
