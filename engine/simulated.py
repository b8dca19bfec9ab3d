"""The simulator without sockets, on a virtual clock: runs of minutes in a second.

`SimulatedTransport` answers each attempt with the simulator's own pure rules
(`ratedeck.server.rules.RateRules`) at the instant the request would reach the
server, after the same random one-way delays the HTTP simulator adds.
`run_virtual` runs a coroutine on a loop whose clock jumps to the next timer
whenever it would wait, so sleeping costs nothing and runs are repeatable.
Used by `ratedeck sweep`; nothing here touches the network.
"""

from __future__ import annotations

import asyncio
import json
import random
import selectors

from ratedeck.server.rules import RateRules
from ratedeck.server.settings import ServerSettings

from .config import KeySpec
from .outcome import Outcome, classify
from .request import Request


class SimulatedTransport:
    """A `Transport` that plays `RateRules` on the running loop's clock."""

    def __init__(self, settings: ServerSettings, seed: int = 1):
        self.settings = settings
        self.rules = RateRules(settings)
        self.rng = random.Random(seed)
        self.attempts = 0

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.attempts += 1
        await self._delay(self.settings.latency_in_ms)
        decision = self.rules.decide(key.secret, nonce, loop.time() * 1000.0, req.id)
        await self._delay(self.settings.latency_out_ms)
        body = json.dumps(decision.body)
        # The simulator sends Retry-After as whole seconds only.
        retry_after = decision.headers.get("Retry-After")
        return Outcome(classify(decision.status, body), decision.status,
                       float(retry_after) if retry_after is not None else None, loop.time() - start)

    async def _delay(self, bounds: tuple[int, int]) -> None:
        ms = self.rng.randint(*bounds)
        if ms:
            await asyncio.sleep(ms / 1000.0)

    async def close(self) -> None:
        pass


class _JumpingSelector(selectors.DefaultSelector):
    """Polls real I/O without waiting; otherwise moves the clock by the timeout."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def select(self, timeout=None):
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: nothing is scheduled, nothing can happen")
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual and jumps to the next timer."""

    def __init__(self):
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._jumping.now


def run_virtual(coro):
    """Run `coro` to completion on a fresh virtual-time loop and return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
