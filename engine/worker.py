"""One worker per API key: waits for a slot, takes work, keeps several in flight."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ratedeck.core.secrets import mask_secret

from .config import KeySpec
from .gate import CooldownGate
from .limiter import WindowLimiter
from .waker import Waker

if TYPE_CHECKING:
    from .engine import Engine


class KeyWorker:
    """Sends requests for one key as fast as its limiter allows.

    The loop checks, in order: paused or blocked, cooldown gates, the
    in-flight cap, the limiter's next free slot, and only then takes a
    request, so a request is never held while the key cannot send it. Every
    wait is a single future woken by a timer or by `poke()`; nothing polls.
    """

    def __init__(
        self,
        engine: Engine,
        spec: KeySpec,
        limiter: WindowLimiter,
        gates: tuple[CooldownGate, ...],
        max_in_flight: int,
        use_nonce: bool,
        shared: tuple[WindowLimiter, ...] = (),
    ):
        self.engine = engine
        self.spec = spec
        self.label = spec.label
        self.masked = mask_secret(spec.secret)
        self.limiter = limiter  # this key's own budget
        self.limiters = (limiter,) + shared  # every budget a send spends (key, host)
        self.gates = gates
        self.policy_header: str | None = None  # the last RateLimit-Policy seen, to parse once
        self.max_in_flight = max_in_flight
        self.use_nonce = use_nonce
        self.paused = False
        self.blocked = False
        self.in_flight = 0
        self.sent = self.succeeded = self.rejected_429 = 0
        self.last_latency_ms: float | None = None
        self._nonce = 0
        self._waker = Waker()

    # -- waking
    def poke(self) -> None:
        """Wake the worker from whatever it waits for, so it re-checks its state."""
        self._waker.poke()

    async def _wait(self, until: float | None = None) -> None:
        await self._waker.wait(self.engine.loop, until)

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

    # -- the loop
    async def run(self) -> None:
        engine = self.engine
        queues = engine.queues
        woken_for_work = False
        while not engine.stopping:
            now = engine.clock()
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
            req = queues.pop_ready(now, engine.pool_ok)
            if req is None:
                await self._wait_for_work()
                woken_for_work = True
                continue
            woken_for_work = False
            if req.deadline <= now:
                engine.expire(req)
                continue
            if req.cancelled:
                engine.shed(req)
                continue
            if len(self.limiters) == 1:
                stamps = (self.limiter.record(now),)
            else:
                stamps = tuple(lim.record(now) for lim in self.limiters)
            self.in_flight += 1
            self.sent += 1
            engine.launch(self, req, self.next_nonce() if self.use_nonce else None, stamps)

    async def _wait_for_work(self) -> None:
        # The waiter doubles as the queue's getter: a put wakes it, and so
        # does poke() (pause, stop), with no extra task per wait.
        await self._waker.wait(self.engine.loop, None, register=self.engine.queues.add_getter)

    def window_fill(self, now: float) -> tuple[int, int]:
        return self.limiter.used(now)
