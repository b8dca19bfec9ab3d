"""One worker per API key: waits for a slot, takes work, keeps several in flight.

`KeyWorker` is the sender loop; what the key knows of its limits is its
`KeyLimits` (`key.py`), and what it counts of its answers its `KeyStats`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import TYPE_CHECKING

from ratedeck.core.secrets import fingerprint, mask_secret
from ratedeck.core.vocab import KeyState
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http.outcome import OK, SERVER_ERROR, Outcome
from ratedeck.engine.limits.limiter import Stamp, WindowLimiter
from ratedeck.engine.limits.waker import Waker
from ratedeck.engine.observe.metrics import KeyLatency
from ratedeck.engine.settings import KeySpec
from ratedeck.engine.snapshot import ErrorRow, KeyRow

from .key import UNKNOWN_LIMIT, KeyLimits
from .settle import REJECTED_429, SUCCEEDED, Tally

if TYPE_CHECKING:
    from ratedeck.core.policy import Policy
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.estimate import KeyEstimate
    from ratedeck.engine.limits.leases import LeasedSlots
    from ratedeck.engine.ports import RunClock, WorkerHost, WorkerQueues
    from ratedeck.engine.request import Request

    from .lanes import ModelLane

__all__ = ["LEASE_EARLY_S", "RECENT_ERRORS", "UNKNOWN_LIMIT", "KeyStats", "KeyWorker"]

#: A lease may be used this much before its time: a timer fires up to the clock's resolution
#: early, and float sums of times differ in the last bits (a store's grants carry the margin).
LEASE_EARLY_S = 1e-6


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
        if outcome.status is not None:
            ms = self.last_latency_ms = outcome.latency_s * 1000.0
            self.last_status = outcome.status
            if outcome.kind is OK:  # a success (settle.decide), as the run's histogram counts
                self.latency.add(ms)
        if outcome.kind is not OK:
            self.errors += 1
            what = str(outcome.status) if outcome.status is not None else str(outcome.kind)
            self.last_error = f"{what}: {outcome.error}" if outcome.error else what

    def tally(self, tally: Tally) -> None:
        if tally is SUCCEEDED:
            self.succeeded += 1
        elif tally is REJECTED_429:
            self.rejected_429 += 1


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
        "_nonce",
        "_waker",
        "_plan",
        "_plan_now",
        "_wake_at",
        "_plan_slots",
        "_asked",
        "_route_tokens",
        "_lane",
        "_turn",
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
        self._plan: list[tuple[WindowLimiter, int]] = []  # what the request just admitted spends
        self._plan_now = 0.0
        self._wake_at = math.inf  # the earliest a skipped request's budgets have room
        self._plan_slots: LeasedSlots | None = None
        self._asked = False
        self._route_tokens = False
        self._lane: ModelLane | None = None  # the model lane of the request just admitted
        self._turn = 0  # counts the turns that look for work with budgets (a lane held in one)

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
                blocked, until = True, gate_at
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
            if self.budgets is None:
                req = queues.pop_ready(now, self.path.pool_ok_req, self.label)
            else:
                self._plan_now, self._wake_at, self._asked = now, math.inf, False
                self._turn += 1
                if limits.lanes is not None:
                    limits.lanes.for_answer = False
                req = queues.pop_ready(now, self._admit, self.label)
            if req is None:
                if self._wake_at < math.inf:  # work is there, its budgets have no room yet
                    queues.pass_on()
                    await wait(loop, self._wake_at)
                    self._wake_at = math.inf
                    continue
                if (
                    limits.lanes is not None and limits.lanes.for_answer and self.in_flight
                ):  # work is there, waiting for an answer
                    queues.pass_on()
                    await wait(loop, None)
                    continue
                await self._wait_for_work()
                woken_for_work = True
                continue
            woken_for_work = False
            if req.deadline <= now:
                self.path.expire(req)
                continue
            if req.cancelled:
                self.path.shed(req)
                continue
            self._send(req, now)

    def _send(self, req: Request, now: float) -> None:
        """Spend `req`'s slot in every budget (and its lease) and launch it."""
        limits = self.limits
        stamps: tuple[Stamp, ...]
        if self.budgets is not None:
            first, cost = self._plan[0]
            stamp = first.record(now, cost)
            for lim, cost in self._plan[1:]:
                lim.record(now, cost, stamp)
            stamps = (stamp,)
        elif len(limits.limiters) == 1:
            stamps = (limits.limiter.record(now),)
        else:
            stamp = limits.limiter.record(now)
            for lim in limits.limiters[1:]:
                lim.record(now, 1, stamp)
            stamps = (stamp,)
        leases = limits.leases
        if leases is not None:
            slots = leases.default if self.budgets is None else self._plan_slots
            assert slots is not None
            stamps[0].ticket = slots.take(now)
            if len(slots) <= 1 and not slots.single and len(self.queues):
                leases.want(self, now, slots)  # the next grant comes before these run out
        lane = self._lane
        if lane is not None and self.budgets is not None:
            lane.sent += 1
            if lane.first_pending:
                lane.first_out = True  # the model's others wait for this one's answer
        self.in_flight += 1
        self.stats.sent += 1
        limits.note_send(now)
        self.path.launch(self, req, self.next_nonce() if self.use_nonce else None, stamps)

    def spend_plan(self, req: Request) -> list[tuple[WindowLimiter, int]]:
        """Every limiter `req` spends from with this key, and how much of each."""
        assert self.budgets is not None
        limits = self.limits
        route = self.budgets.route(req)
        lane = self._lane = limits.lanes.lane(req) if limits.lanes is not None else None
        own, key_budgets = limits.limiter, limits.key_budgets
        if lane is not None:
            own = lane.limiter if lane.limiter is not None else own
            key_budgets = lane.budgets
        plan = []
        if not any(spec.exclusive for spec in route.budgets):
            plan.append((own, route.weight if limits.key_weighted else 1))
        plan.extend((lim, 1) for lim in limits.limiters[1:])
        tokens = False
        for spec in route.budgets:
            plan.append((self.budgets.limiter_for(spec, key_budgets), route.cost(spec)))
            tokens = tokens or spec.tokens
        self._route_tokens = tokens
        return plan

    def _admit(self, req: Request) -> bool | None:
        """Whether `req` can go now with this key (its pool has room, all its budgets do);
        None when a token budget every request spends from holds it back: the requests
        behind it wait too (a smaller prompt would only overtake it, and a big one could
        starve while small ones keep the bucket from filling)."""
        pool_ok = self.path.pool_ok
        if pool_ok is not None and not pool_ok(req.pool):
            return False
        plan = self.spend_plan(req)
        now = self._plan_now
        lane = self._lane
        if lane is not None and not self._lane_open(lane, now):
            return False
        ready, holder = now, None
        for lim, cost in plan:
            free = lim.next_free(now, cost)
            if free > ready:
                ready, holder = free, lim
        token_gates = self.limits.token_gates
        leases = self.limits.leases
        if ready <= now and leases is not None:
            # A shared store grants the plan's budgets together: a lease for this plan, or none
            slots = leases.for_plan(plan, self._route_tokens)
            other = req.leasing
            if other is not None and other is not slots and (other.fetching or other.next_at(now) < math.inf):
                return False  # another key is getting (or holds) its slot: the ones behind are ours
            lease_at = slots.next_at(now)
            if lease_at > now + LEASE_EARLY_S:
                if lease_at == math.inf:
                    if not self._asked and not leases.fetching:
                        self._asked = True  # one fetch a turn: the first request without a lease
                        req.leasing = slots
                        leases.want(self, now, slots)
                    lease_at = slots.retry_at if slots.retry_at > now else math.inf
                if lease_at < self._wake_at:
                    self._wake_at = lease_at
                # a token budget every request spends from: the ones behind wait for this lease too
                return None if any(lim in token_gates for lim, _ in plan) else False
            self._plan_slots = slots
        if ready <= now:
            self._plan = plan
            return True
        if ready < self._wake_at:
            self._wake_at = ready
        if holder is not None and holder in token_gates:
            return None
        if lane is not None and holder is not None and self._route_tokens and holder in lane.own.values():
            lane.held_turn = self._turn  # this model's next requests wait behind this one
        return False

    def _lane_open(self, lane: ModelLane, now: float) -> bool:
        """Whether a request of `lane`'s model may go now: its gate is open, its first answer
        is not awaited, no earlier request of it was held by a token bucket this turn."""
        open_at = lane.gate.open_at
        if open_at > now:
            if open_at < self._wake_at:
                self._wake_at = open_at
            return False
        if lane.first_out:
            lanes = self.limits.lanes
            assert lanes is not None
            lanes.for_answer = True  # the worker waits for an answer, not for more work
            return False
        return lane.held_turn != self._turn

    async def _wait_for_work(self) -> None:
        # The waiter doubles as the queue's getter: a put wakes it, and so
        # does poke() (pause, stop), with no extra task per wait.
        await self._waker.wait(self.run_state.loop, None, register=self.queues.add_getter)

    # -- answers
    def answered(self, outcome: Outcome) -> None:
        """An attempt of this key came back (or failed to)."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self.limits.answered_all()  # nothing in flight: nothing to wait for
        self.stats.answered(outcome)
        sizing = self.limits.sizing
        if sizing is not None:  # a timeout, no connection or a 5xx: the server or path is in trouble
            sizing.answered(
                outcome.latency_s, outcome.status is not None and outcome.kind is not SERVER_ERROR
            )

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
        )
