"""One worker per API key: waits for a slot, takes work, keeps several in flight.

`KeyWorker` is the sender loop, and the key side of the request path
(`ports.KeySide`: it takes an answer's facts, carries out a verdict's key
part, wakes its loop); what the key knows of its limits is its `KeyLimits`
(`key.py`), and what it counts of its answers its `KeyStats`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import TYPE_CHECKING

from ratedeck.core.secrets import fingerprint, mask_secret
from ratedeck.core.vocab import KeyState, OutcomeKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.limits.waker import Waker
from ratedeck.engine.observe.metrics import KeyLatency
from ratedeck.engine.settings import KeySpec
from ratedeck.engine.snapshot import ErrorRow, KeyRow

from .admit import LEASE_EARLY_S, Hold, KeyView, Pass, Plan, Send, admit, default_plan
from .key import UNKNOWN_LIMIT, KeyLimits
from .settle import Scope, Tally, Verdict, tally_of

if TYPE_CHECKING:
    from ratedeck.core.policy import Policy
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.estimate import KeyEstimate
    from ratedeck.engine.limits.leases import LeasedSlots
    from ratedeck.engine.ports import RunClock, SendStamp, WorkerHost, WorkerQueues
    from ratedeck.engine.request import Request

    from .health import EndpointHealth

__all__ = ["LEASE_EARLY_S", "RECENT_ERRORS", "UNKNOWN_LIMIT", "KeyStats", "KeyWorker"]

#: Failed attempts each key keeps for its detail view (the run's error groups keep the counts).
RECENT_ERRORS = 8


class KeyStats:
    """What one key counts of its sends and answers, for its row in the snapshot."""

    __slots__ = (
        "sent",
        "succeeded",
        "rejected_429",
        "last_latency_ms",
        "latency",
        "errors",
        "last_status",
        "last_error",
        "recent_errors",
        "refused_status",
        "refused_message",
    )

    def __init__(self) -> None:
        self.sent = self.succeeded = self.rejected_429 = 0
        self.last_latency_ms: float | None = None
        self.latency = KeyLatency()  # this key's successes, send -> answer
        self.errors = 0
        self.last_status: int | None = None
        self.last_error = ""
        self.recent_errors: deque[ErrorRow] = deque(maxlen=RECENT_ERRORS)  # for the key detail
        self.refused_status: int | None = None  # the answer that refused the key for good
        self.refused_message = ""  # its text (masked where it was made)

    def answered(self, outcome: Outcome) -> None:
        ok = outcome.kind is OutcomeKind.OK  # a success (settle.decide), as the run's histogram counts
        if outcome.status is not None:
            ms = self.last_latency_ms = outcome.latency_s * 1000.0
            self.last_status = outcome.status
            if ok:
                self.latency.add(ms)
        if not ok:
            self.errors += 1
            what = str(outcome.status) if outcome.status is not None else str(outcome.kind)
            self.last_error = f"{what}: {outcome.error}" if outcome.error else what


class KeyWorker:
    """Sends requests for one key as fast as its limits allow.

    The loop checks, in order: paused or blocked, cooldown gates, the
    in-flight cap, the limiter's next free slot, and only then takes a
    request, so a request is never held while the key cannot send it. Every
    wait is a single future woken by a timer or by `poke()`; nothing polls.

    `run` is the run's clock and state, `queues` where work waits, `path`
    where an attempt is launched (`ports.WorkerHost`); `gates` the cooldown
    gates the key obeys; `budgets` the named budgets when requests route
    (None: every request spends alike).
    """

    __slots__ = (
        "spec",
        "label",
        "masked",
        "fingerprint",
        "limits",
        "stats",
        "gates",
        "run_state",
        "queues",
        "path",
        "budgets",
        "use_nonce",
        "paused",
        "blocked",
        "in_flight",
        "view",
        "_nonce",
        "_waker",
        "_turn",
        "health",
    )

    def __init__(
        self,
        spec: KeySpec,
        limits: KeyLimits,
        *,
        run: RunClock,
        queues: WorkerQueues,
        path: WorkerHost[KeyWorker],
        gates: tuple[CooldownGate, ...],
        use_nonce: bool = False,
        budgets: Budgets | None = None,
    ) -> None:
        self.spec = spec
        self.label = spec.label
        self.masked = mask_secret(spec.secret)
        self.fingerprint = fingerprint(spec.secret)
        self.limits = limits
        self.stats = KeyStats()
        self.gates = gates
        self.health: EndpointHealth | None = None  # its endpoint's, in a pool of several (health.py)
        self.run_state = run
        self.queues = queues
        self.path = path
        self.budgets = budgets if budgets is not None and budgets.routing else None
        self.use_nonce = use_nonce
        self.paused = False
        self.blocked = False
        self.in_flight = 0
        self._nonce = 0
        self._waker = Waker()
        # What admission reads of this key (admit.py); the default plan is computed once.
        self.view = KeyView(limits, self.budgets, path.pool_ok, Send(default_plan(limits)))
        self._turn = 0  # counts the looks for work that ask admission (a lane held in one)

    # -- what callers read of the key (its limits and counts live in `limits` and `stats`)
    @property
    def limiter(self) -> WindowLimiter:
        return self.limits.limiter

    @property
    def key_budgets(self) -> dict[str, WindowLimiter]:
        return self.limits.key_budgets

    @property
    def estimate(self) -> KeyEstimate | None:
        return self.limits.estimate

    @property
    def learned_limit(self) -> Policy | None:
        return self.limits.learned_limit

    @property
    def discovering(self) -> bool:
        return self.limits.discovering

    @property
    def leases(self) -> LeasedSlots | None:
        """The default plan's leases (None without a shared store)."""
        return self.limits.leases.default if self.limits.leases is not None else None

    @property
    def sent(self) -> int:
        return self.stats.sent

    def all_leases(self) -> list[LeasedSlots]:
        """Every lease holder of this key (its default plan's and each plan's)."""
        return self.limits.all_leases()

    # -- waking
    def poke(self) -> None:
        """Wake the worker from whatever it waits for, so it re-checks its state."""
        self._waker.poke()

    def wake_if_sooner(self, now: float) -> None:
        """After an answer: wake the worker only when that lets it send sooner than the wait
        it is in ends by itself (a slot freed early, room in flight); a wake costs a turn
        of the loop and a new timer, and most answers change nothing the worker waits for."""
        waker = self._waker
        if not waker.waiting:
            return
        until = waker.until
        if waker.for_work and self.budgets is None:
            return  # waiting for work: a put (or a retry falling due) wakes it, not an answer
        if until is None or self.budgets is not None:
            waker.poke()  # waiting for room in flight, paused, or a budget plan: look again
            return
        if self.paused or self.blocked:
            return
        sooner = self.gate_open_at()
        if sooner <= now:
            limits = self.limits
            if self.in_flight >= limits.max_in_flight:
                return  # full in flight: this wait ends by itself, or the next answer pokes
            if limits.limiter.pace_due() >= until:
                return  # the even pace alone keeps it waiting as long (most answers)
            sooner = limits.next_free(now)
        if sooner < until:
            waker.poke()

    def next_nonce(self) -> int:
        """Strictly increasing per key, and above any earlier run's (epoch ms based)."""
        self._nonce = max(self._nonce + 1, int(time.time() * 1000))
        return self._nonce

    def gate_open_at(self) -> float:
        gates = self.gates
        if len(gates) == 2:  # the key's own gate and the host's: the usual case, asked per send
            a, b = gates[0].open_at, gates[1].open_at
            return a if a > b else b
        if len(gates) == 1:
            return gates[0].open_at
        return max(g.open_at for g in gates)

    def next_free(self, now: float) -> float:
        return self.limits.next_free(now)

    def live_rate(self, h: float) -> float:
        return self.limits.live_rate(h)

    def can_send(self, now: float) -> bool:
        """Not paused, not blocked and no closed gate: the key counts toward capacity now."""
        return not (self.paused or self.blocked) and self.gate_open_at() <= now

    # -- the loop
    async def run(self) -> None:
        run, queues, limits = self.run_state, self.queues, self.limits
        leases = limits.leases
        sends = limits.sends
        # The gates: the key's own and the host's (their open times read here, not by a call)
        gates = self.gates
        first, last, many = gates[0], gates[-1], len(gates) > 2
        wait, loop = self._waker.wait, asyncio.get_running_loop()  # a wait per send: no wrapper
        woken_for_work = False
        per_request, default = self.view.per_request, self.view.default.plan
        while not run.stopping:
            now = run.clock()
            # What stops this key from sending right now, if anything: one slot
            # computation per turn, since this loop runs for every send.
            until = None
            if self.paused or self.blocked:
                blocked = True
            elif (first.open_at > now or last.open_at > now or many) and (
                gate_at := self.gate_open_at()
            ) > now:
                blocked, until = True, (gate_at if gate_at < math.inf else None)  # held: a poke ends it
            elif self.in_flight >= limits.max_in_flight or sends.probe_out:
                blocked = True
            elif (slot_at := limits.next_free(now)) > now:
                blocked, until = True, slot_at
            elif (
                leases is not None
                and self.budgets is None
                and (lease_at := leases.default.next_at(now)) > now + LEASE_EARLY_S
            ):
                if lease_at < math.inf:
                    blocked, until = True, lease_at
                elif not len(queues):
                    await self._wait_for_work()  # no lease is asked for while there is no work
                    woken_for_work = True
                    continue
                else:
                    leases.want(self, now, leases.default)  # pokes this worker when the grant comes
                    retry_at = leases.default.retry_at
                    blocked, until = True, (retry_at if retry_at > now else None)
            else:
                blocked = False
            if blocked:
                if woken_for_work:
                    queues.pass_on()  # the work we were woken for goes to another key
                    woken_for_work = False
                await wait(loop, until)
                continue
            if not per_request:  # every request spends alike: the head goes, with the key's plan
                req = queues.pop_ready(now, self.label)
                if req is None:
                    await self._wait_for_work()
                    woken_for_work = True
                    continue
                plan = default
            else:
                got = self._look(now)
                if isinstance(got, Hold):
                    if got.until < math.inf:  # work is there, its budgets have no room yet
                        queues.pass_on()
                        await wait(loop, got.until)
                        continue
                    if got.answer and self.in_flight:  # work is there, waiting for an answer
                        queues.pass_on()
                        await wait(loop, None)
                        continue
                    await self._wait_for_work()
                    woken_for_work = True
                    continue
                req, plan = got[0], got[1].plan
            woken_for_work = False
            if req.deadline <= now:
                self.path.expire(req)
                continue
            if req.cancelled:
                self.path.shed(req)
                continue
            self._send(req, plan, now)

    def _look(self, now: float) -> tuple[Request, Send] | Hold:
        """One look for work whose admission depends on the request: the first request
        `admit` sends, with its decision; else the turn's holds folded into one (the
        earliest time, and whether an answer is awaited; Hold(inf): wait for work)."""
        turn = self._turn = self._turn + 1
        view, leases = self.view, self.limits.leases
        wake_at, for_answer, asked = math.inf, False, False

        def choose(req: Request) -> Send | Hold | Pass:
            nonlocal wake_at, for_answer, asked
            decision = admit(req, view, now, turn)
            if isinstance(decision, Hold):
                ask = decision.ask
                if ask is not None and leases is not None and not asked and not leases.fetching:
                    asked = True  # one fetch a turn: the first request without a lease
                    req.leasing = ask
                    leases.want(self, now, ask)  # pokes this worker when the grant comes
                if decision.lane is not None:
                    decision.lane.held_turn = turn
                if decision.until < wake_at:
                    wake_at = decision.until
                for_answer = for_answer or decision.answer
            return decision

        got = self.queues.pick(now, choose, self.label)
        if got is not None:
            req, decision = got
            assert isinstance(decision, Send)  # only a Send takes a request (`Admission.take`)
            return req, decision
        return Hold(wake_at, answer=for_answer)

    def _send(self, req: Request, plan: Plan, now: float) -> None:
        """Spend `plan` (a slot of every limiter it names, a lease) and launch `req`."""
        limits = self.limits
        spends = plan.spends
        first, cost = spends[0]
        stamp = first.record(now, cost)
        stamp.out = True  # until its attempt ends (`request_path.time_answer`)
        if len(spends) > 1:
            for lim, cost in spends[1:]:
                lim.record(now, cost, stamp)
        slots = plan.slots
        if slots is not None:
            stamp.ticket = slots.take(now)
            leases = limits.leases
            if leases is not None and len(slots) <= 1 and not slots.single and len(self.queues):
                leases.want(self, now, slots)  # the next grant comes before these run out
        lane = plan.lane
        if lane is not None:
            lane.sent += 1
            if lane.first_pending:
                lane.first_out = True  # the model's others wait for this one's answer
        self.in_flight += 1
        self.stats.sent += 1
        limits.note_send(now)
        if self.health is not None:
            self.health.sent(now)
        self.path.launch(self, req, self.next_nonce() if self.use_nonce else None, (stamp,))

    async def _wait_for_work(self) -> None:
        # The waiter doubles as the queue's getter: a put wakes it, and so
        # does poke() (pause, stop), with no extra task per wait.
        await self._waker.wait(self.run_state.loop, None, register=self.queues.add_getter)

    # -- answers: the key side of the request path (`ports.KeySide`)
    def answered(
        self, outcome: Outcome, req: Request, stamps: tuple[SendStamp, ...], now: float
    ) -> tuple[str, bool, bool, float]:
        """An attempt of this key came back (or failed to): count it, learn what the answer says
        of the key's limits (`KeyLimits.learn`), judge the limit by the answer's tally; returns
        what the verdict takes of the key: its label, refused already, its limit explains a 429,
        and how long it sits out for 429s in a row (`KeyLimits.cool_off`)."""
        self.in_flight -= 1
        limits = self.limits
        if self.in_flight == 0:
            limits.answered_all()  # nothing in flight: nothing to wait for
        self.stats.answered(outcome)
        if self.health is not None:
            self.health.answered(outcome, now)
        sizing = limits.sizing
        if sizing is not None:  # a timeout, no connection or a 5xx: the server or path is in trouble
            sizing.answered(
                outcome.latency_s, outcome.status is not None and outcome.kind is not OutcomeKind.SERVER_ERROR
            )
        limits.learn(outcome, req, stamps, now)
        # The key judges its limit by the answer's tally; the verdict takes what it said.
        tally, sent_at = tally_of(outcome, req.cancelled and req.answer is not None), req.last_sent_at
        explains = limits.judged(tally, sent_at, now)
        cool = limits.cool_off(tally, sent_at, now, outcome.retry_after_s is not None)
        return self.label, self.blocked, explains, cool

    def carry_out(
        self, verdict: Verdict, req: Request, outcome: Outcome, error: ErrorRow | None
    ) -> CooldownGate | None:
        """The verdict's key part: its tally and `error` (a failure's row) counted, the key blocked
        when the verdict refuses it; returns the key's gate a key-scoped cooldown closes (the
        request's model's with limits per model), else None."""
        tally = verdict.tally
        if tally is Tally.SUCCEEDED:
            self.stats.succeeded += 1
            if verdict.cooldown is None:
                return None  # nothing else for the key (the usual answer)
        elif tally is Tally.REJECTED_429:
            self.stats.rejected_429 += 1
        if error is not None:
            self.stats.recent_errors.append(error)
        lanes = self.limits.lanes
        lane = lanes.lane(req) if lanes is not None else None
        if lane is not None and tally is Tally.REJECTED_429:
            lane.rejected_429 += 1
        if verdict.block_key:
            self.block(outcome.status, outcome.error or "")
        cooldown = verdict.cooldown
        if cooldown is None or cooldown.scope is Scope.HOST:
            return None
        return lane.gate if lane is not None else self.gates[0]  # a lane's: the key's other models go on

    def block(self, status: int | None = None, message: str = "") -> bool:
        """The server refused this key for good (`status`, its masked `message`); True the first time."""
        first = not self.blocked
        self.blocked = True
        if first:
            self.stats.refused_status, self.stats.refused_message = status, message
        return first

    # -- reading
    def state(self, now: float) -> KeyState:
        if self.blocked:
            return KeyState.BLOCKED
        if self.paused:
            return KeyState.PAUSED
        if self.gate_open_at() > now:
            return KeyState.COOLING
        return KeyState.ACTIVE

    def row(self, now: float) -> KeyRow:
        limits, stats, server = self.limits, self.stats, self.limits.server
        used, limit = limits.limiter.used(now)
        left = max(g.left(now) for g in self.gates)
        learned = limits.learned_limit
        return KeyRow(
            self.label,
            self.masked,
            self.state(now),
            round(left, 1),
            self.in_flight,
            stats.sent,
            stats.succeeded,
            stats.rejected_429,
            used,
            limit,
            stats.last_latency_ms,
            stats.errors,
            stats.last_status,
            stats.last_error,
            server.remaining,
            server.limit,
            round(max(0.0, server.reset_at - now), 1) if server.reset_at is not None else None,
            str(learned) if learned is not None else None,
            limits.told,
            self.fingerprint,
            stats.latency.summary(now),
            tuple(stats.recent_errors),
            stats.refused_status,
            stats.refused_message,
            *limits.estimate_fields(now),
            limits.binding(now),
            limits.followed(),
            limits.max_in_flight,
            limits.sizing is not None,
            self.spec.endpoint.name if self.spec.endpoint is not None else "",
        )
