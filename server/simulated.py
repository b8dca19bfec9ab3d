"""The simulator without sockets, on a virtual clock: runs of minutes in a second.

`SimulatedTransport` answers each attempt with the simulator's own pure rules
(`ratedeck.server.rules.RateRules`) at the instant the request would reach the
server, after the same random one-way delays the HTTP simulator adds.
`run_virtual` runs a coroutine on a loop whose clock jumps to the next timer
whenever it would wait, so sleeping costs nothing and runs are repeatable.
Used by `ratedeck sweep` and the engine's tests; nothing here touches the network.

Like the HTTP simulator, a request that spent a slot then takes the
settings' `processing_ms` of server time before the answer leaves, and with
`server_timing` the answer says how long (`Server-Timing: app;dur=X`).
`probe()` is the simulator's `GET /health`: the network's delays only.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import selectors
from collections.abc import Callable

from ratedeck.engine.http.delays import answer_hints, hint_names, read_quotas, response_delay
from ratedeck.engine.http.outcome import TIMEOUT, Outcome, classify
from ratedeck.engine.http.transport import TransportBase
from ratedeck.engine.ports import ProbeGet
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec

from .rules import SPENT, RateRules, server_timing
from .settings import ServerSettings


class SimulatedTransport(TransportBase):
    """A `Transport` that plays `RateRules` on the running loop's clock.

    Tests use the extras: `extra_in_ms` / `extra_out_ms` add uniform random
    network delay to each leg, `fail_every` turns every Nth attempt into a
    timeout, `timing_hint` replaces the Server-Timing text (given the true
    server time in ms; None sends none), so tests can send nonsense hints,
    and `sends` / `cooldowns` log what was sent when and which delays the
    client was told. `read_counts` reads the server's counts (X-RateLimit-*) into
    the outcome as the HTTP transport does (off: the simulator's runs keep their timing). `probes` counts `probe()` calls.
    `timeout_s` gives up on an attempt at that deadline, as the HTTP transport's
    (`target.timeout_s`) does, while the request still reaches the server.
    """

    def __init__(
        self,
        settings: ServerSettings,
        seed: int = 1,
        *,
        extra_in_ms: tuple[float, float] = (0, 0),
        extra_out_ms: tuple[float, float] = (0, 0),
        fail_every: int = 0,
        timing_hint: Callable[[float], str | None] | None = None,
        read_counts: bool = False,
        timeout_s: float | None = None,
    ):
        self.settings = settings
        self.timeout_s = timeout_s  # the client's deadline for an attempt (None: it waits for every answer)
        self._abandoned: set[asyncio.Task[Outcome]] = set()  # given up on, still on their way
        self.rules = RateRules(settings)
        self.rng = random.Random(seed)
        self.extra_in_ms, self.extra_out_ms = extra_in_ms, extra_out_ms
        self.fail_every = fail_every
        self.timing_hint = timing_hint
        self.read_counts = read_counts  # fill Outcome.quotas from X-RateLimit-* as the HTTP client does
        self.probes = 0
        self.attempts = 0
        self.sends: list[tuple[str, float]] = []  # (key, send time)
        self.cooldowns: list[tuple[str, float, float]] = []  # (key, from, until) told to the client
        self._last_stamp = -math.inf  # the last arrival stamped (stamps never go back)

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        """One attempt. With `timeout_s`, the client gives up on it at its deadline (a TIMEOUT, as
        the HTTP transport's), and the request goes on all the same: the network does not know
        the client gave up, so the server counts it when it arrives, however late."""
        if self.timeout_s is None:
            return await self._exchange(key, req, nonce)
        loop = asyncio.get_running_loop()
        start = loop.time()
        task = loop.create_task(self._exchange(key, req, nonce))
        try:
            done, _ = await asyncio.wait((task,), timeout=self.timeout_s)
        except asyncio.CancelledError:  # the run stops: the request is still on its way
            self._abandon(task)
            raise
        if done:
            return task.result()
        self._abandon(task)
        return Outcome(TIMEOUT, latency_s=loop.time() - start, error="timed out")

    def _abandon(self, task: asyncio.Task[Outcome]) -> None:
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    async def _exchange(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.attempts += 1
        self.sends.append((key.secret, start))
        # The server stamps the arrival the network's delay after the send, on its own clock: a
        # stall of this process (the client's) must not make the in-process server count the
        # request later than the network delivered it, as a separate server never would.
        arrival = start + await self._delay(self.settings.latency_in_ms, self.extra_in_ms)
        if self.fail_every and self.attempts % self.fail_every == 0:
            await asyncio.sleep(0.2)
            return Outcome(TIMEOUT, latency_s=loop.time() - start, error="timed out")
        # timers wake in the order of their deadlines, so stamps only go back by a clock's grain
        stamp = self._last_stamp = max(arrival, self._last_stamp)
        decision = self.rules.decide(key.secret, nonce, stamp * 1000.0, req.id)
        headers = decision.headers
        served_s = 0.0  # the server's own time, as drawn (a stall of this process is not the server's)
        if decision.outcome in SPENT and self.settings.processing_ms[1]:
            served_s = await self._delay(self.settings.processing_ms, (0, 0))
        if self.rules.is_known(key.secret):
            served_ms = served_s * 1000.0
            text = self.timing_hint(served_ms) if self.timing_hint is not None else None
            if self.timing_hint is None and self.settings.server_timing:
                text = server_timing(served_ms)
            if text is not None:
                headers = {**headers, "Server-Timing": text}
        await self._delay(self.settings.latency_out_ms, self.extra_out_ms)
        body = json.dumps(decision.body)
        delay = response_delay(decision.status, headers, body) if decision.status >= 400 else None
        if delay is not None:
            self.cooldowns.append((key.secret, loop.time(), loop.time() + delay))
        names = hint_names(headers)  # as the HTTP transport reads an answer
        server_s, remaining = answer_hints(headers, names)
        outcome = Outcome(
            classify(decision.status, body, uses_nonce=nonce is not None),
            decision.status,
            delay,
            loop.time() - start,
            policy_header=headers.get("RateLimit-Policy"),
            server_time_s=server_s,
            remaining=remaining,
        )
        if self.read_counts:
            outcome.quotas = read_quotas(
                headers, None, names
            )  # the server's own counts, as the HTTP client reads them
        return outcome

    def prober(self) -> ProbeGet | None:
        return self.probe

    async def probe(self) -> int:
        """`GET /health`: the network's delays each way, no key, no limit; returns the status."""
        self.probes += 1
        await self._delay(self.settings.latency_in_ms, self.extra_in_ms)
        await self._delay(self.settings.latency_out_ms, self.extra_out_ms)
        return 200 if self.settings.health else 404

    async def _delay(self, bounds: tuple[int, int], extra: tuple[float, float]) -> float:
        """Wait one leg's random delay; returns it in seconds (the timer's own sum, so a virtual
        clock's arrival stamp is the timer's deadline to the bit)."""
        low, high = bounds
        ms: float = low if low == high else self.rng.uniform(low, high)
        if extra[1]:
            ms += self.rng.uniform(*extra)
        if not ms:
            return 0.0
        await asyncio.sleep(ms / 1000.0)
        return ms / 1000.0

    async def close(self) -> None:
        for task in list(self._abandoned):  # the run is over: what was still on its way goes nowhere
            task.cancel()


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
