"""An in-memory transport that plays the simulator's rules on the virtual clock.

Each attempt sleeps a random incoming delay, is judged by
`ratedeck.server.rules.RateRules` at that (virtual) instant, then sleeps the
outgoing delay, exactly like the HTTP simulator but without sockets.
"""

from __future__ import annotations

import asyncio
import json
import random

from ratedeck.engine.delays import response_delay
from ratedeck.engine.outcome import Outcome, classify
from ratedeck.server.rules import RateRules


class SimTransport:
    def __init__(self, settings, *, seed: int = 1, extra_in_ms: tuple[float, float] = (0, 0),
                 extra_out_ms: tuple[float, float] = (0, 0), fail_every: int = 0):
        self.rules = RateRules(settings)
        self.settings = settings
        self.rng = random.Random(seed)
        self.extra_in_ms = extra_in_ms
        self.extra_out_ms = extra_out_ms
        self.fail_every = fail_every  # every Nth attempt is lost as a timeout (fault injection)
        self.attempts = 0
        self.sends: list[tuple[str, float]] = []  # (key, virtual send time)
        self.cooldowns: list[tuple[str, float, float]] = []  # (key, from, until) told to the client

    async def send(self, key, req, nonce):
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.attempts += 1
        self.sends.append((key.secret, start))
        lo, hi = self.settings.latency_in_ms
        d_in = self.rng.randint(lo, hi) + self.rng.uniform(*self.extra_in_ms)
        if d_in:
            await asyncio.sleep(d_in / 1000)
        if self.fail_every and self.attempts % self.fail_every == 0:
            await asyncio.sleep(0.2)
            return Outcome("timeout", latency_s=loop.time() - start, error="timed out")
        decision = self.rules.decide(key.secret, nonce, loop.time() * 1000, req.id)
        lo, hi = self.settings.latency_out_ms
        d_out = self.rng.randint(lo, hi) + self.rng.uniform(*self.extra_out_ms)
        if d_out:
            await asyncio.sleep(d_out / 1000)
        body = json.dumps(decision.body)
        retry_after = (response_delay(decision.status, decision.headers, body)
                       if decision.status >= 400 else None)
        if retry_after is not None:
            self.cooldowns.append((key.secret, loop.time(), loop.time() + retry_after))
        return Outcome(classify(decision.status, body), decision.status, retry_after,
                       loop.time() - start, policy_header=decision.headers.get("RateLimit-Policy"))

    async def close(self):
        pass
