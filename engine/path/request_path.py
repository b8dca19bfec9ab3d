"""A request's path from its launch to its verdict: send, settle, apply.

A key worker launches an attempt (`RequestPath.launch`), the `Transport`
answers in the attempt's own task, `settle.decide` (pure) says what the
answer means, and `_apply` counts it, closes the gates it must (through the
`Cooldown`), blocks a key the server refused, and ends the request (buried,
expired, succeeded: handed to the engine's `Endings.finish`) or queues its
retry. The path sees the engine only through the ports (`ports.py`): it
enters the engine once per request, at the end.

The hot path: everything a request touches is an attribute of this object
or bound once (`_send`, `_finish`, `_cool`); no closure or
object is made per request beyond the attempt's task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ratedeck.core.policy import Policy
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Ending, EventKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.delays import Quota, advertised_policies
from ratedeck.engine.http.transport import Transport
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.observe.metrics import Metrics
from ratedeck.engine.ports import BudgetWatcher, Cooldown, Endings, EventSink, GateWatcher, SendStamp
from ratedeck.engine.queues import Graveyard, WorkQueues
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec
from ratedeck.engine.snapshot import ErrorRow

from .settle import Scope, SettleRules, Tally, Verdict, decide
from .worker import KeyWorker


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


class RequestPath:
    """Attempts in flight and the verdicts on their answers, for one engine.

    `start(loop, clock, started_at, wall_offset)` binds it to the running loop.
    `in_flight` counts attempts in flight; `sends` holds their tasks.
    """

    def __init__(
        self,
        transport: Transport,
        queues: WorkQueues,
        metrics: Metrics,
        headroom: HeadroomController,
        graveyard: Graveyard,
        budgets: Budgets,
        weighted_host: WindowLimiter | None,
        host_gate: CooldownGate,
        settle_rules: SettleRules,
        rng: random.Random,
        pools: dict[str, int],
        ends: Endings,
        events: EventSink,
        cooldown: Cooldown,
        redact: Redactor,
        *,
        learn_policy: bool,
        free_statuses: tuple[int, ...] = (),
        budget_watcher: BudgetWatcher | None = None,
    ) -> None:
        self.transport = transport
        self.queues = queues
        self.metrics = metrics
        self.headroom = headroom
        self.graveyard = graveyard
        self.budgets = budgets
        self.weighted_host = weighted_host  # the host budget a weight quota names, if any
        self.host_gate = host_gate
        self.settle_rules = settle_rules
        self.rng = rng
        self.learn_policy = learn_policy
        self.free_statuses = frozenset(free_statuses)
        self.budget_watcher = budget_watcher  # a cluster member: budgets a store shares
        self._finish = ends.finish
        self._key_refused = ends.key_refused
        self.event = events.event
        self._cool = cooldown.cool
        self.redact = redact
        # Called when no limit was given and an answer advertises none (the engine stops the run).
        self.no_limit: Callable[[str], None] | None = None
        self.discovered: Callable[[], None] | None = None  # a key adopted an advertised limit
        # Connection pools (`[pools]`): how many attempts each may have in flight.
        self.pool_capacity = dict(pools)
        self.pool_in_use = dict.fromkeys(pools, 0)
        self.pool_ok: Callable[[str | None], bool] | None = self._pool_has_room if pools else None
        self.pool_ok_req: Callable[[Request], bool] | None = self._req_pool_has_room if pools else None
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
        self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple[SendStamp, ...] = ()
    ) -> None:
        """Send one attempt in its own task (so a key keeps several in flight)."""
        req.attempts += 1
        self.in_flight += 1
        m = self.metrics
        m.sent += 1
        sent_at = req.last_sent_at = stamps[0].t if stamps else self.clock()
        if req.first_sent_at is None:
            req.first_sent_at = sent_at
            m.queue_wait.add((sent_at - req.created_at) * 1000.0)
        if req.pool is not None and self.pool_ok is not None:
            self.pool_in_use[req.pool] = self.pool_in_use.get(req.pool, 0) + 1
        req.key = worker.label
        create_task = self._create_task
        assert create_task is not None, "launch() before start()"
        # The attempt takes itself out of `sends` when it ends (no done callback: one
        # loop turn less per request). A request has one attempt in flight at a time.
        self.sends[req] = create_task(self._attempt(worker, req, nonce, stamps))

    async def _attempt(
        self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple[SendStamp, ...]
    ) -> None:
        try:
            result = await self._send(worker.spec, req, nonce)
        except asyncio.CancelledError:
            self.sends.pop(req, None)
            raise  # stopped while in flight: the request stays counted as in flight
        except Exception as exc:  # a transport bug must not lose the request
            result = oc.Outcome(oc.CONNECTION, error=f"{type(exc).__name__}")
        self.sends.pop(req, None)
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
            self._settle(worker, req, result, now, stamps)
        except Exception as exc:
            # Whatever went wrong in handling the answer, the request is
            # accounted for: it ends in the graveyard with the error named.
            self._settle_failed(req, exc, now)
        worker.wake_if_sooner(now)

    def _settle(
        self,
        worker: KeyWorker,
        req: Request,
        result: oc.Outcome,
        now: float,
        stamps: tuple[SendStamp, ...] = (),
    ) -> None:
        """Decide what the answer means (`settle.decide`, pure) and apply it here."""
        req.last_status = result.status
        req.result = result
        if worker.first_pending and result.status is not None:
            worker.first_answered()
        # Only an answer that went through (2xx) or was rate-limited (429) speaks for the limit:
        # a 404 or a 401 says something else (a wrong URL, a refused key).
        if worker.discovering and result.status is not None and (result.status < 300 or result.status == 429):
            self._discover(worker, result, now)
        if result.policy_header is not None and self.learn_policy:
            for policy in worker.adopt_advertised(result.policy_header, now):
                self.event(EventKind.SETTING, f"{worker.label}: server advertises {policy}; adopted it")
        if stamps and (self.budgets.settled or self.free_statuses) and result.status is not None:
            self._give_back(worker, req, result, stamps[0], now)
        if result.quotas:
            self._sync_quotas(worker, req, result, now)
        verdict = decide(result, req, self.settle_rules, now)
        self._apply(verdict, worker, req, result, now)

    def _discover(self, worker: KeyWorker, result: oc.Outcome, now: float) -> None:
        """No limit was given for this key: its first answer must advertise one, or the run stops."""
        policy = worker.discover(advertised_limits(result), now)
        if policy is not None:
            self.event(
                EventKind.SETTING,
                f"{worker.label}: no limit given; the server advertises {policy}: adopted it",
            )
            if self.discovered is not None:
                self.discovered()
        elif self.no_limit is not None:
            self.no_limit("the server advertises no rate limit on its answers; give one with --limit N/W")

    def _sync_quotas(self, worker: KeyWorker, req: Request, result: oc.Outcome, now: float) -> None:
        """Take the server's own counts: a budget it names, a weight budget, else the key's own.

        What this key spent after the answered request was sent is added, since
        the server cannot have counted it yet (`spent_since`). An LLM API's
        buckets are followed both ways (`_follow`).
        """
        sent_at = req.last_sent_at if req.last_sent_at is not None else now
        for quota in result.quotas:
            if quota.follow:
                self._follow(worker, result.quotas, sent_at, now)
                break
        for quota in result.quotas:
            if quota.follow:
                continue
            limiter = self._limiter_for_quota(worker, quota)
            if limiter is None:
                continue
            reset_at = now + quota.reset_in_s if quota.reset_in_s is not None else None
            extra = limiter.sync(
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
            if self.budget_watcher is not None:
                used = quota.used
                if used is None and quota.remaining is not None and quota.limit is not None:
                    used = max(0, quota.limit - quota.remaining)
                if used is not None:
                    policy = limiter.policy_for(quota.window_s)
                    self.budget_watcher.synced(worker, limiter, policy, used, sent_at, reset_at)
            if extra > 0 and limiter is worker.limiter and worker.note_shared(extra, quota.limit, now):
                share = worker.estimate.shared_share if worker.estimate is not None else None
                self.event(
                    EventKind.SETTING,
                    f"{worker.label}: shared: someone else used {share or 0:.0%} of this window "
                    "(the server counted more than we sent); using what is left",
                )

    def _follow(self, worker: KeyWorker, quotas: tuple[Quota, ...], sent_at: float, now: float) -> None:
        """An LLM API's buckets as its answer states them: size, refill and count, adopted
        lower or higher than ours (the tier, learned; nobody needs to know theirs).

        A bucket that refills fully in `reset` from `remaining` refills
        `(limit - remaining) / reset` per second. Every unit refills over the same
        window, so the window comes from whichever unit is busy (a full one says
        nothing). Each reading is a bound never shorter than the true window (the
        remaining count less one, the reset's last figure rounded up, a wall-clock
        reset given back the round trip it may have spent reaching us); the key
        keeps the shortest bound seen. The count corrects ours where it proves it
        wrong (`_Bucket.follow`).
        """
        bound = worker.window_bound
        transit = now - sent_at  # a wall-clock reset lost at most the round trip on its way here
        for q in quotas:
            if q.follow and q.limit and q.remaining is not None and q.reset_in_s:
                short = q.limit - q.remaining
                if short >= 2:
                    reset = q.reset_in_s + transit if q.reset_from_time else q.reset_in_s
                    bound = min(bound, q.limit * reset / (short - 1))
        first_window = bound < math.inf and worker.window_bound == math.inf
        worker.window_bound = bound
        window = bound if bound < math.inf else None
        moved = []
        for q in quotas:
            if not q.follow or q.limit is None or q.remaining is None:
                continue
            limiter = self._limiter_for_follow(worker, q.name)
            if limiter is None:
                continue
            before = limiter.bucket()
            # What the server may not have counted: ours sent since the answered request, and
            # since a headroom before it (one sent earlier may have reached it later: a new
            # connection's handshake, a late loop).
            since = limiter.spent_since(sent_at - self.headroom.seconds())
            if limiter.follow(now, q.limit, q.limit - q.remaining, since, window):
                bucket = limiter.bucket()
                if self.budget_watcher is not None and bucket is not None:
                    counted = q.limit - q.remaining
                    self.budget_watcher.synced(worker, limiter, bucket, counted, sent_at, None)
                if before is not None and (before.limit != q.limit or first_window):
                    was = f" (was {before.limit:,})" if before.limit != q.limit else ""
                    moved.append(f"{q.name} {q.limit:,}{was}")
            worker.note_quota(q, now + q.reset_in_s if q.reset_in_s is not None else None)
        if moved:
            refill = f", refilled over {bound:.1f} s" if bound < math.inf else ""
            self.event(
                EventKind.SETTING, f"{worker.label}: the server's limits: {', '.join(moved)}{refill}; adopted"
            )

    def _limiter_for_follow(self, worker: KeyWorker, unit: str | None) -> WindowLimiter | None:
        if unit == "requests":
            return worker.limiter
        if unit in worker.key_budgets:
            return worker.key_budgets[unit]
        return self.budgets.host.get(unit) if unit is not None else None

    def _give_back(
        self,
        worker: KeyWorker,
        req: Request,
        result: oc.Outcome,
        stamp: SendStamp,
        now: float,
    ) -> None:
        """Give back what the server did not charge: all of it for a status the API documents
        as free (`target.free_statuses`), else the part of a settled budget's reservation
        beyond the real use the answer reports (`settle`, like usage.output_tokens)."""
        route = self.budgets.route(req)
        ticket = getattr(stamp, "ticket", None)
        watcher = self.budget_watcher if ticket is not None else None
        if result.status in self.free_statuses:
            back = []
            if not any(b.exclusive for b in route.budgets):
                back.append((worker.limiter, route.weight if worker.key_weighted else 1))
            for spec in route.budgets:
                back.append((self.budgets.limiter_for(spec, worker.key_budgets), route.cost(spec)))
            for lim, units in back:
                lim.refund(stamp, units, now)
                if watcher is not None:
                    watcher.gave_back(worker, lim, ticket, units)
            return
        if result.kind is not oc.OK:
            return
        doc: list[Any] = []
        for spec in route.budgets:
            if spec.settle is None:
                continue
            lim = self.budgets.limiter_for(spec, worker.key_budgets)
            used = _used(result.response, spec.settle, doc)
            reserved = route.cost(spec)
            if used is not None and used < reserved:
                lim.refund(stamp, reserved - used, now)
                if req.units is not None:  # what it cost, for the makespan's count of the job's units
                    req.units = {**req.units, spec.unit: used}
                if watcher is not None:
                    watcher.gave_back(worker, lim, ticket, reserved - used)

    def _limiter_for_quota(self, worker: KeyWorker, quota: Quota) -> WindowLimiter | None:
        name = quota.name
        if name is not None:
            if name in worker.key_budgets:
                return worker.key_budgets[name]
            if name in self.budgets.host:
                return self.budgets.host[name]
        if quota.weight:
            return self.weighted_host
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
            if self.learn_policy and worker.climb(now):
                self._estimate_moved(worker)
        elif v.tally is Tally.REJECTED_429:
            m.rejected_429 += 1
            # A 429 while the headroom deliberately narrows (a rejection budget, remaining
            # counts) is about timing, not the limit: learn nothing from it.
            if self.learn_policy and req.last_sent_at is not None and not self.headroom.narrowing:
                moved, explained = worker.learn_from_rejection(req.last_sent_at, self.headroom.seconds(), now)
                if explained:
                    widen = False  # the limit was wrong, not the timing: the headroom stays
                if moved:
                    self._estimate_moved(worker)
        elif v.tally is Tally.REJECTED_OTHER:
            m.rejected_other += 1
        else:
            m.fail(v.cause or str(result.kind))
        if v.tally is not Tally.SUCCEEDED:
            req.last_error = result.error or str(result.kind)
            cause = str(result.kind) if result.status is not None else (result.error or str(result.kind))
            at_s = now - self.started_at
            m.errors.add(result.status, result.kind, cause, req.last_error, worker.label, at_s)
            worker.recent_errors.append(
                ErrorRow(result.status, result.kind, cause, 1, req.last_error, worker.label, round(at_s, 1))
            )
        if widen:
            self.headroom.observe_rejection(now)
        if v.cooldown is not None:
            gate = self.host_gate if v.cooldown.scope is Scope.HOST else worker.gates[0]
            self._cool(gate, req, now, v.cooldown.delay_s, v.cooldown.reason)
        if v.unsure:
            req.unsure = True
            if result.request_id is not None or req.request_id is None:
                req.request_id = result.request_id
        if v.block_key and worker.block(result.status, result.error or ""):
            said = f"HTTP {result.status}" if result.status is not None else str(result.kind)
            if result.error and result.error != said:
                said += f": {result.error}"
            self.event(
                EventKind.ERROR,
                f"{worker.label} {worker.masked} refused by the server ({said}); not used again",
            )
            self._key_refused()
            self.strand(worker.label, now)
        ending = v.ending
        if ending is None and (result.keyed or req.pin is not None):
            # An Idempotency-Key is scoped to the account that first sent it: its retries go
            # out on that key only, like a workload line's `_key`.
            if req.pin is None:
                req.pin = worker.label
            if req.pin == worker.label and worker.blocked:
                ending = Ending.UNCERTAIN if req.unsure else Ending.GRAVEYARD
        if ending is Ending.SUCCEEDED:
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

    def _estimate_moved(self, worker: KeyWorker) -> None:
        est = worker.estimate
        if est is not None and est.reason != "climbing":  # each step up would flood the log
            self.event(
                EventKind.SETTING, f"{worker.label}: told {worker.told}, limit estimate {est.describe()}"
            )

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

    def _req_pool_has_room(self, req: Request) -> bool:
        return self._pool_has_room(req.pool)

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


def _used(response: Any, field: str, doc: list[Any]) -> int | None:
    """A whole number at the dotted `field` of a JSON answer body (parsed once into `doc`)."""
    if not doc:
        try:
            doc.append(json.loads(response.body) if isinstance(response.body, (bytes, str)) else None)
        except (AttributeError, ValueError, RecursionError):
            doc.append(None)
    node = doc[0]
    for part in field.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not node >= 0:
        return None
    return math.ceil(node)


def advertised_limits(result: oc.Outcome) -> tuple[Policy, ...]:
    """The limits an answer advertises for its key: RateLimit-Policy, else a count with a known
    window (`RateLimit` with its policy, X-RateLimit-Limit with the seconds to its reset as the
    window, at least 1 s; the limiter then follows the server's own counts)."""
    policies = advertised_policies(result.policy_header)
    if policies:
        return policies
    found = []
    for quota in result.quotas:
        if quota.limit is None or quota.weight or quota.name not in (None, "core", "default"):
            continue
        window = quota.window_s or (
            max(1.0, float(math.ceil(quota.reset_in_s))) if quota.reset_in_s else None
        )
        if window is not None and quota.limit >= 1:
            found.append(Policy(quota.limit, window))
    return tuple(found)
