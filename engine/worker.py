"""One worker per API key: waits for a slot, takes work, keeps several in flight."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ratedeck.core.policy import Policy
from ratedeck.core.secrets import mask_secret
from ratedeck.core.vocab import KeyState, OutcomeKind

from .config import KeySpec
from .delays import advertised_policies
from .gate import CooldownGate
from .limiter import Stamp, WindowLimiter
from .outcome import Outcome
from .settle import Tally
from .snapshot import KeyRow
from .waker import Waker

if TYPE_CHECKING:
    from .ports import WorkerHost


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
        host: WorkerHost,
        spec: KeySpec,
        limiter: WindowLimiter,
        gates: tuple[CooldownGate, ...],
        max_in_flight: int,
        use_nonce: bool,
        shared: tuple[WindowLimiter, ...] = (),
    ):
        self.host = host
        self.spec = spec
        self.label = spec.label
        self.masked = mask_secret(spec.secret)
        self.limiter = limiter  # this key's own budget
        self.limiters = (limiter, *shared)  # every budget a send spends (key, host)
        self.gates = gates
        self.max_in_flight = max_in_flight
        self.use_nonce = use_nonce
        self.paused = False
        self.blocked = False
        self.in_flight = 0
        self.sent = self.succeeded = self.rejected_429 = 0
        self.last_latency_ms: float | None = None
        self.errors = 0
        self.last_status: int | None = None
        self.last_error = ""
        self._policy_header: str | None = None  # the last RateLimit-Policy seen, to parse once
        self._nonce = 0
        self._waker = Waker()

    # -- waking
    def poke(self) -> None:
        """Wake the worker from whatever it waits for, so it re-checks its state."""
        self._waker.poke()

    async def _wait(self, until: float | None = None) -> None:
        await self._waker.wait(self.host.loop, until)

    def next_nonce(self) -> int:
        """Strictly increasing per key, and above any earlier run's (epoch ms based)."""
        self._nonce = max(self._nonce + 1, int(time.time() * 1000))
        return self._nonce

    def gate_open_at(self) -> float:
        gates = self.gates
        if len(gates) == 1:
            return gates[0].open_at
        return max(g.open_at for g in gates)

    def next_free(self, now: float) -> float:
        if len(self.limiters) == 1:
            return self.limiter.next_free(now)
        return max(lim.next_free(now) for lim in self.limiters)

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
            elif self.in_flight >= self.max_in_flight:
                blocked = True
            elif (slot_at := self.next_free(now)) > now:
                blocked, until = True, slot_at
            else:
                blocked = False
            if blocked:
                if woken_for_work:
                    queues.pass_on()  # the work we were woken for goes to another key
                    woken_for_work = False
                await self._wait(until)
                continue
            req = queues.pop_ready(now, host.pool_ok)
            if req is None:
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
            if len(self.limiters) == 1:
                stamps = (self.limiter.record(now),)
            else:
                stamps = tuple(lim.record(now) for lim in self.limiters)
            self.in_flight += 1
            self.sent += 1
            host.launch(self, req, self.next_nonce() if self.use_nonce else None, stamps)

    async def _wait_for_work(self) -> None:
        # The waiter doubles as the queue's getter: a put wakes it, and so
        # does poke() (pause, stop), with no extra task per wait.
        await self._waker.wait(self.host.loop, None, register=self.host.queues.add_getter)

    # -- answers
    def answered(self, outcome: Outcome) -> None:
        """An attempt of this key came back (or failed to)."""
        self.in_flight -= 1
        if outcome.status is not None:
            self.last_latency_ms = outcome.latency_s * 1000.0
            self.last_status = outcome.status
        if outcome.kind is not OutcomeKind.OK:
            self.errors += 1
            what = str(outcome.status) if outcome.status is not None else str(outcome.kind)
            self.last_error = f"{what}: {outcome.error}" if outcome.error else what

    def tally(self, tally: Tally) -> None:
        if tally is Tally.SUCCEEDED:
            self.succeeded += 1
        elif tally is Tally.REJECTED_429:
            self.rejected_429 += 1

    def block(self) -> bool:
        """The server refused this key for good; True the first time."""
        first = not self.blocked
        self.blocked = True
        return first

    def adopt_advertised(self, header: str) -> list[Policy]:
        """Adopt advertised limits (RateLimit-Policy) tighter than ours; returns those adopted."""
        if header == self._policy_header:
            return []
        self._policy_header = header
        return [p for p in advertised_policies(header) if self.limiter.add_policy(p)]

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
        )
