"""One worker per API key: waits for a slot, takes work, keeps several in flight."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratedeck.core.policy import MAX_LIMIT, Policy
from ratedeck.core.secrets import fingerprint, mask_secret
from ratedeck.core.vocab import KeyState, OutcomeKind, PolicyKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http.delays import advertised_policies
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.limits.estimate import ADDITIVE, KeyEstimate
from ratedeck.engine.limits.limiter import Stamp, WindowLimiter
from ratedeck.engine.limits.waker import Waker
from ratedeck.engine.observe.metrics import KeyLatency
from ratedeck.engine.settings import KeySpec
from ratedeck.engine.snapshot import ErrorRow, KeyRow

from .settle import Tally

if TYPE_CHECKING:
    from ratedeck.engine.http.delays import Quota
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.leases import LeasedSlots
    from ratedeck.engine.ports import WorkerHost
    from ratedeck.engine.request import Request


#: What a key with no limit given enforces until the server advertises one: nothing (its worker
#: sends one request at a time meanwhile, `KeyWorker.discovering`).
UNKNOWN_LIMIT = Policy(MAX_LIMIT, 1.0)

#: A lease may be used this much before its time: a timer fires up to the clock's resolution
#: early, and float sums of times differ in the last bits (a store's grants carry the margin).
LEASE_EARLY_S = 1e-6


#: Failed attempts each key keeps for its detail view (the run's error groups keep the counts).
RECENT_ERRORS = 8


class KeyWorker:
    """Sends requests for one key as fast as its limiter allows.

    The loop checks, in order: paused or blocked, cooldown gates, the
    in-flight cap, the limiter's next free slot, and only then takes a
    request, so a request is never held while the key cannot send it. Every
    wait is a single future woken by a timer or by `poke()`; nothing polls.

    The worker owns its counters: it counts a send when it launches one and
    an answer when the engine hands it back (`answered`, `tally`).
    """

    def __init__(
        self,
        host: WorkerHost[KeyWorker],
        spec: KeySpec,
        limiter: WindowLimiter,
        gates: tuple[CooldownGate, ...],
        max_in_flight: int,
        use_nonce: bool,
        shared: tuple[WindowLimiter, ...] = (),
        budgets: Budgets | None = None,
        key_budgets: dict[str, WindowLimiter] | None = None,
        key_weighted: bool = False,
        climb: str = ADDITIVE,
        slow_start: bool = False,
        learn_first: bool = False,
    ):
        self.host = host
        self.spec = spec
        self.label = spec.label
        self.masked = mask_secret(spec.secret)
        self.fingerprint = fingerprint(spec.secret)
        self.told = ", ".join(str(p) for p in spec.policies)  # the limits given, as the user wrote them
        self.limiter = limiter  # this key's own budget
        self.limiters = (limiter, *shared)  # every budget a send spends (key, host)
        self.budgets = budgets if budgets is not None and budgets.routing else None
        self.key_budgets = key_budgets or {}  # this key's own named budgets (key scope)
        self.key_weighted = key_weighted  # the key's budget counts weight, not requests
        self._plan: list[tuple[WindowLimiter, int]] = []  # what the request just admitted spends
        # Token budgets every request spends from: one that holds a request back holds all.
        self._token_gates: frozenset[WindowLimiter] = frozenset()
        if self.budgets is not None:
            self._token_gates = frozenset(
                self.budgets.limiter_for(b, self.key_budgets) for b in self.budgets.covering if b.tokens
            )
        self._plan_now = 0.0
        self._wake_at = math.inf  # the earliest a skipped request's budgets have room
        self.gates = gates
        self.max_in_flight = max_in_flight
        # No limit given: one request in flight until the server's answers advertise one.
        self.discovering = not spec.policies
        self._max_in_flight = max_in_flight
        # An LLM API's tier is in its answers' headers: one request until the first answer.
        self.first_pending = learn_first
        if self.discovering or learn_first:
            self.max_in_flight = 1
        # The shortest refill window the server's buckets proved (engine/path/request_path.py `_follow`).
        self.window_bound = math.inf
        self.use_nonce = use_nonce
        self.paused = False
        self.blocked = False
        self.refused_status: int | None = None  # the answer that refused the key for good
        self.refused_message = ""  # its text (masked where it was made)
        self.in_flight = 0
        self.sent = self.succeeded = self.rejected_429 = 0
        self.last_latency_ms: float | None = None
        self.latency = KeyLatency()  # this key's successes, send -> answer
        self.errors = 0
        self.last_status: int | None = None
        self.last_error = ""
        self.recent_errors: deque[ErrorRow] = deque(maxlen=RECENT_ERRORS)  # for the key detail
        # The server's own view of this key's main budget, from the last answer that gave it.
        self.server_remaining: int | None = None
        self.server_limit: int | None = None
        self.server_reset_at: float | None = None
        self._policy_header: str | None = None  # the last RateLimit-Policy seen, to parse once
        # The key's limit as an estimate that moves both ways (engine/limits/estimate.py): the tightest
        # sliding window it was told, enforced by the limiter's meter of that policy.
        sliding = [p for p in spec.policies if p.kind is PolicyKind.SLIDING]
        self._estimated: Policy | None = min(sliding, key=lambda p: p.rate) if sliding else None
        self.estimate: KeyEstimate | None = (
            KeyEstimate(self._estimated.limit, self._estimated.window_s, climb=climb, slow_start=slow_start)
            if self._estimated is not None
            else None
        )
        self._sends: deque[float] = deque(maxlen=4096)  # send times, for a probe's count
        self._failed_sends: deque[float] = deque(maxlen=4096)  # send times of answers not accepted
        self._probe_out = False  # a send beyond the confirmed level is in flight: wait for it
        self._probe_at = -1.0  # its send time
        self._probe_level = 0  # and our count in the window with it
        self._nonce = 0
        self._waker = Waker()
        # A budget shared through a store (engine/cluster/member.py, engine/limits/leases.py): sends only at
        # the times it granted.
        # With budgets (routing), each plan has its own (`plan_leases`); `leases` is then only
        # the switch and the default plan's. `store_names`: each limiter's budget in the store.
        self.leases: LeasedSlots | None = None
        self.plan_leases: dict[tuple[tuple[str, int], ...], LeasedSlots] = {}
        self.store_names: dict[WindowLimiter, str] = {}
        self.want_leases: Callable[[KeyWorker, float, LeasedSlots], None] | None = None
        self.fetching = 0  # lease fetches in flight for this key (one at a time with budgets)
        self._plan_slots: LeasedSlots | None = None
        self._asked = False
        self._route_tokens = False

    def all_leases(self) -> list[LeasedSlots]:
        """Every lease holder of this key (its default plan's and each plan's)."""
        if self.leases is None:
            return []
        return [self.leases, *self.plan_leases.values()]

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
            sooner = self.next_free(now) if self.in_flight < self.max_in_flight else math.inf
        if sooner < until:
            waker.poke()

    async def _wait(self, until: float | None = None) -> None:
        await self._waker.wait(self.host.loop, until)

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
        if len(self.limiters) == 1:
            return self.limiter.next_free(now)
        return max(lim.next_free(now) for lim in self.limiters)

    def live_rate(self, h: float) -> float:
        """Requests per second this key lets through now: its own limit's, or fewer where a
        token budget every request spends from binds (its refill over what one request has
        cost once settled, on average so far)."""
        rate = self.limiter.live_rate(h)
        for lim in self._token_gates:
            cost = lim.settled_cost()
            if cost:
                rate = min(rate, lim.live_rate(h) / cost)
        return rate

    def can_send(self, now: float) -> bool:
        """Not paused, not blocked and no closed gate: the key counts toward capacity now."""
        return not (self.paused or self.blocked) and self.gate_open_at() <= now

    # -- the loop
    async def run(self) -> None:
        host = self.host
        queues = host.queues
        woken_for_work = False
        while not host.stopping:
            now = host.clock()
            # What stops this key from sending right now, if anything: one slot
            # computation per turn, since this loop runs for every send.
            until = None
            if self.paused or self.blocked:
                blocked = True
            elif (gate_at := self.gate_open_at()) > now:
                blocked, until = True, gate_at
            elif self.in_flight >= self.max_in_flight or self._probe_out:
                blocked = True
            elif (slot_at := self.next_free(now)) > now:
                blocked, until = True, slot_at
            elif (
                self.leases is not None
                and self.budgets is None
                and (lease_at := self.leases.next_at(now)) > now + LEASE_EARLY_S
            ):
                if lease_at < math.inf:
                    blocked, until = True, lease_at
                elif not len(queues):
                    await self._wait_for_work()  # no lease is asked for while there is no work
                    woken_for_work = True
                    continue
                else:
                    assert self.want_leases is not None
                    self.want_leases(self, now, self.leases)  # pokes this worker when the grant comes
                    retry_at = self.leases.retry_at
                    blocked, until = True, (retry_at if retry_at > now else None)
            else:
                blocked = False
            if blocked:
                if woken_for_work:
                    queues.pass_on()  # the work we were woken for goes to another key
                    woken_for_work = False
                await self._wait(until)
                continue
            if self.budgets is None:
                req = queues.pop_ready(now, host.pool_ok_req, self.label)
            else:
                self._plan_now, self._wake_at, self._asked = now, math.inf, False
                req = queues.pop_ready(now, self._admit, self.label)
            if req is None:
                if self._wake_at < math.inf:  # work is there, its budgets have no room yet
                    queues.pass_on()
                    await self._wait(self._wake_at)
                    self._wake_at = math.inf
                    continue
                await self._wait_for_work()
                woken_for_work = True
                continue
            woken_for_work = False
            if req.deadline <= now:
                host.expire(req)
                continue
            if req.cancelled:
                host.shed(req)
                continue
            stamps: tuple[Stamp, ...]
            if self.budgets is not None:
                first, cost = self._plan[0]
                stamp = first.record(now, cost)
                for lim, cost in self._plan[1:]:
                    lim.record(now, cost, stamp)
                stamps = (stamp,)
            elif len(self.limiters) == 1:
                stamps = (self.limiter.record(now),)
            else:
                stamp = self.limiter.record(now)
                for lim in self.limiters[1:]:
                    lim.record(now, 1, stamp)
                stamps = (stamp,)
            if self.leases is not None:
                slots = self.leases if self.budgets is None else self._plan_slots
                assert slots is not None
                stamps[0].ticket = slots.take()
                if len(slots) <= 1 and not slots.single and len(queues) and self.want_leases is not None:
                    self.want_leases(self, now, slots)  # the next grant comes before these run out
            self.in_flight += 1
            self.sent += 1
            self._sends.append(now)
            est = self.estimate
            if est is not None and est.value > est.confirmed:
                count = self._count_in_window(now)
                if count > est.confirmed:  # sends beyond the level that held go one at a time
                    self._probe_out, self._probe_at, self._probe_level = True, now, count
            host.launch(self, req, self.next_nonce() if self.use_nonce else None, stamps)

    def _count_in_window(self, now: float) -> int:
        """Our sends in the estimate's window up to `now`, widened by the headroom as the
        limiter's meter counts them (the server sees at most these in its window)."""
        assert self.estimate is not None
        start = now - self.estimate.window_s - self.limiter.headroom_s()
        count = 0
        for t in reversed(self._sends):
            if t <= start:
                break
            count += 1
        return count

    def spend_plan(self, req: Request) -> list[tuple[WindowLimiter, int]]:
        """Every limiter `req` spends from with this key, and how much of each."""
        assert self.budgets is not None
        route = self.budgets.route(req)
        plan = []
        if not any(spec.exclusive for spec in route.budgets):
            plan.append((self.limiter, route.weight if self.key_weighted else 1))
        plan.extend((lim, 1) for lim in self.limiters[1:])
        tokens = False
        for spec in route.budgets:
            plan.append((self.budgets.limiter_for(spec, self.key_budgets), route.cost(spec)))
            tokens = tokens or spec.tokens
        self._route_tokens = tokens
        return plan

    def _slots_for(self, plan: list[tuple[WindowLimiter, int]]) -> LeasedSlots:
        """The leases held for `plan` (a new, empty holder the first time)."""
        names = self.store_names
        sig = tuple((names.get(lim, "?"), cost) for lim, cost in plan)
        slots = self.plan_leases.get(sig)
        if slots is None:
            if len(self.plan_leases) > 64:  # plans of one request each (tokens): forget the spent ones
                for k in [k for k, s in self.plan_leases.items() if not len(s) and not s.fetching]:
                    del self.plan_leases[k]
            from ratedeck.engine.limits.leases import LeasedSlots

            slots = self.plan_leases[sig] = LeasedSlots(plan, single=self._route_tokens)
            slots.valid_until = self.leases.valid_until if self.leases is not None else math.inf
        return slots

    def _admit(self, req: Request) -> bool | None:
        """Whether `req` can go now with this key (its pool has room, all its budgets do);
        None when a token budget every request spends from holds it back: the requests
        behind it wait too (a smaller prompt would only overtake it, and a big one could
        starve while small ones keep the bucket from filling)."""
        pool_ok = self.host.pool_ok
        if pool_ok is not None and not pool_ok(req.pool):
            return False
        plan = self.spend_plan(req)
        now = self._plan_now
        ready, holder = now, None
        for lim, cost in plan:
            free = lim.next_free(now, cost)
            if free > ready:
                ready, holder = free, lim
        if ready <= now and self.leases is not None:
            # A shared store grants the plan's budgets together: a lease for this plan, or none
            slots = self._slots_for(plan)
            lease_at = slots.next_at(now)
            if lease_at > now + LEASE_EARLY_S:
                if lease_at == math.inf:
                    if not self._asked and not self.fetching and self.want_leases is not None:
                        self._asked = True  # one fetch a turn: the first request without a lease
                        self.want_leases(self, now, slots)
                    lease_at = slots.retry_at if slots.retry_at > now else math.inf
                if lease_at < self._wake_at:
                    self._wake_at = lease_at
                # a token budget every request spends from: the ones behind wait for this lease too
                return None if any(lim in self._token_gates for lim, _ in plan) else False
            self._plan_slots = slots
        if ready <= now:
            self._plan = plan
            return True
        if ready < self._wake_at:
            self._wake_at = ready
        if holder is not None and holder in self._token_gates:
            return None
        return False

    async def _wait_for_work(self) -> None:
        # The waiter doubles as the queue's getter: a put wakes it, and so
        # does poke() (pause, stop), with no extra task per wait.
        await self._waker.wait(self.host.loop, None, register=self.host.queues.add_getter)

    # -- answers
    def answered(self, outcome: Outcome) -> None:
        """An attempt of this key came back (or failed to)."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._probe_out = False  # nothing in flight: nothing to wait for
        if outcome.status is not None:
            ms = self.last_latency_ms = outcome.latency_s * 1000.0
            self.last_status = outcome.status
            if outcome.kind is OutcomeKind.OK:  # a success (settle.decide), as the run's histogram counts
                self.latency.add(ms)
        if outcome.kind is not OutcomeKind.OK:
            self.errors += 1
            what = str(outcome.status) if outcome.status is not None else str(outcome.kind)
            self.last_error = f"{what}: {outcome.error}" if outcome.error else what

    def tally(self, tally: Tally, sent_at: float | None = None) -> None:
        if sent_at is not None and sent_at == self._probe_at:
            self._probe_out, self._probe_at = False, -1.0  # the send beyond the confirmed level is answered
            if tally is Tally.SUCCEEDED and self.estimate is not None:
                self.estimate.confirm(self._probe_level)
        if tally is Tally.SUCCEEDED:
            self.succeeded += 1
        elif tally is Tally.REJECTED_429:
            self.rejected_429 += 1
        if tally is not Tally.SUCCEEDED and sent_at is not None:
            self._failed_sends.append(sent_at)

    @property
    def learned_limit(self) -> Policy | None:
        """The estimate as a policy while it is below the limit told (None otherwise)."""
        est, told = self.estimate, self._estimated
        if est is None or told is None or est.value >= told.limit:
            return None
        return Policy(est.value, told.window_s)

    def _retune(self) -> None:
        if self.estimate is not None and self._estimated is not None:
            self.limiter.retune(self._estimated, self.estimate.value)

    def learn_from_rejection(self, sent_at: float, h: float, now: float) -> tuple[bool, bool]:
        """A 429 for a send at `sent_at`: evidence for the estimate. Returns (moved, explained).

        A rate limit at `sent_at` means the server had, in the window before
        it, as many accepted requests as it allows: count ours that succeeded
        in that window (widened by the headroom, for their arrival times). The
        estimate falls to that count (by at most half), or back to the level
        that held when a probe above it drew the 429 (engine/limits/estimate.py).
        """
        est = self.estimate
        if est is None:
            return False, False
        # Our sends in the window before it, less those answered with anything but a success:
        # a 429 is answered at once, and overtakes successes still being served.
        start = sent_at - est.window_s
        accepted = sum(1 for t in self._sends if start < t < sent_at)
        accepted -= sum(1 for t in self._failed_sends if start < t < sent_at)
        moved, explained = est.rejected(sent_at, accepted, now)
        if moved:
            self._retune()
        return moved, explained

    def adopt_estimate(self, value: int, reason: str, now: float) -> bool:
        """Another member's estimate of this shared key (newer than ours): take it, within the
        ceiling; a level above what held here is unconfirmed (probed one at a time). True if it moved."""
        est = self.estimate
        if est is None:
            return False
        value = max(1, min(int(value), est.ceiling))
        if value == est.value:
            return False
        est.value = value
        est.confirmed = min(est.confirmed, value)
        est.reason, est.moved_at = reason[:80], now
        self._retune()
        return True

    def climb(self, now: float) -> bool:
        """Let the estimate climb (a window without a 429); True when it moved."""
        est = self.estimate
        if est is None or not est.tick(now):
            return False
        self._retune()
        return True

    def block(self, status: int | None = None, message: str = "") -> bool:
        """The server refused this key for good (`status`, its masked `message`); True the first time."""
        first = not self.blocked
        self.blocked = True
        if first:
            self.refused_status, self.refused_message = status, message
        return first

    def adopt_advertised(self, header: str, now: float = 0.0) -> list[Policy]:
        """Adopt advertised limits (RateLimit-Policy) tighter than ours; returns those adopted."""
        if header == self._policy_header:
            return []
        self._policy_header = header
        policies = advertised_policies(header)
        self._advertise(policies, now)
        return [p for p in policies if self.limiter.add_policy(p)]

    def first_answered(self) -> None:
        """The key's first answer came: its limits are known, send as they allow."""
        self.first_pending = False
        if not self.discovering:
            self.max_in_flight = self._max_in_flight

    def discover(self, policies: tuple[Policy, ...], now: float) -> Policy | None:
        """No limit was given: adopt what the server advertises (its tightest window becomes the
        key's estimate) and send as the limits allow from now on; None when it advertises none."""
        if not policies:
            return None
        for policy in policies:
            self.limiter.add_policy(policy, now)
        tightest = min(policies, key=lambda p: p.rate)
        self.discovering = False
        if not self.first_pending:
            self.max_in_flight = self._max_in_flight
        if tightest.kind is PolicyKind.SLIDING:
            self._estimated = tightest
            self.estimate = KeyEstimate(None, tightest.window_s, advertised=tightest.limit)
            self.estimate.moved_at = now
        return tightest

    def _advertise(self, policies: tuple[Policy, ...], now: float = 0.0) -> bool:
        """The estimate's ceiling from what the server advertises in its window; True if it moved."""
        est = self.estimate
        if est is None:
            return False
        same = [p.limit for p in policies if abs(p.window_s - est.window_s) < 1e-6]
        if same and est.advertise(min(same), now):
            self._retune()
            return True
        return False

    def note_shared(self, extra: int, limit: int | None, now: float) -> bool:
        """The server counted `extra` we did not send: the key is shared. True the first time."""
        est = self.estimate
        if est is None:
            return False
        return est.note_shared(extra, limit or est.value, now)

    def note_quota(self, quota: Quota, reset_at: float | None) -> None:
        """Keep what the server says of this key's own budget, for display."""
        if quota.name not in (None, "core", "default", "requests") or quota.weight:
            return
        if quota.remaining is not None:
            self.server_remaining = quota.remaining
        elif quota.used is not None and quota.limit is not None:
            self.server_remaining = max(0, quota.limit - quota.used)
        if quota.limit is not None:
            self.server_limit = quota.limit
        if reset_at is not None:
            self.server_reset_at = reset_at

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
        used, limit = self.limiter.used(now)
        left = max(g.left(now) for g in self.gates)
        return KeyRow(
            self.label,
            self.masked,
            self.state(now),
            round(left, 1),
            self.in_flight,
            self.sent,
            self.succeeded,
            self.rejected_429,
            used,
            limit,
            self.last_latency_ms,
            self.errors,
            self.last_status,
            self.last_error,
            self.server_remaining,
            self.server_limit,
            round(max(0.0, self.server_reset_at - now), 1) if self.server_reset_at is not None else None,
            str(self.learned_limit) if self.learned_limit is not None else None,
            self.told,
            self.fingerprint,
            self.latency.summary(now),
            tuple(self.recent_errors),
            self.refused_status,
            self.refused_message,
            *self._estimate_fields(now),
            self._binding(now),
            self._followed(),
        )

    def _followed(self) -> str:
        """The key's buckets as the server's headers set them, once its refill window is known."""
        if self.window_bound == math.inf:
            return ""
        parts = []
        for name, lim in (("requests", self.limiter), *self.key_budgets.items()):
            bucket = lim.bucket()
            if bucket is not None:
                parts.append(f"{name} {bucket.limit:,}")
        return f"{', '.join(parts)} per {self.window_bound:.1f} s" if parts else ""

    def _binding(self, now: float) -> str:
        """Of the key's own limit and its budgets, the one nearest full now ("" with no budgets)."""
        if not self.key_budgets:
            return ""
        best, fill = "", -1.0
        for name, lim in (("requests", self.limiter), *self.key_budgets.items()):
            used, limit = lim.used(now)
            if limit > 0 and used / limit > fill:
                best, fill = name, used / limit
        return best

    def _estimate_fields(self, now: float) -> tuple[str | None, str, float | None, str, float | None]:
        """(estimate, reason, moved this many seconds ago, climb, someone else's share) for the row."""
        est = self.estimate
        if est is None or self._estimated is None:
            return None, "", None, "", None
        ago = round(now - est.moved_at, 1) if est.moved_at is not None else None
        return str(Policy(est.value, est.window_s)), est.reason, ago, est.climb, est.shared_share
