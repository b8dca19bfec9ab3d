"""A rate-limited server of any policy kind, in process, on the loop's clock (virtual or real).

For job tests and the bench's jobs group (`ratedeck bench --scenarios jobs`): the
HTTP simulator (`ratedeck serve`) knows sliding windows only.

`PolicyTransport` answers each attempt as a server enforcing `policies` per key
would, at the instant the request arrives (after a random way in), with costs
(a request's `_weight`): sliding windows (at most L units in any window of W),
fixed windows (at most L per window, windows aligned to the Unix clock as the
engine assumes) and buckets (a counter of at most C draining r per second;
over it, refused, Kraken's rule). Refusals are 429 with a Retry-After of the
wait. `accepted` keeps (arrival, key, cost) of every request served: the truth
a test measures against.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque

from ratedeck.core.policy import Policy
from ratedeck.core.vocab import PolicyKind
from ratedeck.engine.http.outcome import Outcome, classify
from ratedeck.engine.http.transport import TransportBase
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec


class _Meter:
    def __init__(self, policy: Policy, wall_offset: float):
        self.p = policy
        self.wall_offset = wall_offset
        self.sends: deque[tuple[float, int]] = deque()  # sliding: (arrival, cost)
        self.window = -1  # fixed: the window's index
        self.used = 0
        self.level, self.at = 0.0, 0.0  # bucket

    def wait(self, now: float, cost: int) -> float:
        """0 when `cost` fits now, else how long until it might."""
        p = self.p
        if p.kind is PolicyKind.BUCKET:
            level = max(0.0, self.level - p.rate * (now - self.at))
            return 0.0 if level + cost <= p.limit else (level + cost - p.limit) / p.rate
        if p.kind is PolicyKind.FIXED:
            index = math.floor((now + self.wall_offset) / p.window_s)
            used = self.used if index == self.window else 0
            if used + cost <= p.limit:
                return 0.0
            return (index + 1) * p.window_s - self.wall_offset - now
        while self.sends and self.sends[0][0] <= now - p.window_s:
            self.sends.popleft()
        total = sum(c for _, c in self.sends)
        if total + cost <= p.limit:
            return 0.0
        return self.sends[0][0] + p.window_s - now

    def take(self, now: float, cost: int) -> None:
        p = self.p
        if p.kind is PolicyKind.BUCKET:
            self.level = max(0.0, self.level - p.rate * (now - self.at)) + cost
            self.at = now
        elif p.kind is PolicyKind.FIXED:
            index = math.floor((now + self.wall_offset) / p.window_s)
            if index != self.window:
                self.window, self.used = index, 0
            self.used += cost
        else:
            self.sends.append((now, cost))


class PolicyTransport(TransportBase):
    """Answers as a server of `policies` per key would; `latency_ms` each way, uniform."""

    def __init__(self, policies: tuple[Policy, ...], latency_ms: tuple[float, float] = (1, 5), seed: int = 1):
        self.policies = policies
        self.latency_ms = latency_ms
        self.rng = random.Random(seed)
        self.meters: dict[str, list[_Meter]] = {}
        self.accepted: list[tuple[float, str, int]] = []
        self.refused = 0
        self.started: float | None = None

    def _meters(self, key: str, now: float) -> list[_Meter]:
        if key not in self.meters:
            offset = time.time() - now  # the engine's own wall offset, to well under a millisecond
            self.meters[key] = [_Meter(p, offset) for p in self.policies]
        return self.meters[key]

    async def _way(self) -> None:
        await asyncio.sleep(self.rng.uniform(*self.latency_ms) / 1000.0)

    async def call(self, key: str, cost: int = 1) -> tuple[int, float | None]:
        """One request of `cost` with `key`, there and back: (200, None) or (429, Retry-After s)."""
        loop = asyncio.get_running_loop()
        if self.started is None:
            self.started = loop.time()
        await self._way()
        now = loop.time()
        meters = self._meters(key, now)
        wait = max(m.wait(now, cost) for m in meters)
        if wait <= 0:
            for m in meters:
                m.take(now, cost)
            self.accepted.append((now, key, cost))
            status, retry = 200, None
        else:
            self.refused += 1
            status, retry = 429, max(0.001, wait)
        await self._way()
        return status, retry

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        start = asyncio.get_running_loop().time()
        status, retry = await self.call(key.secret, req.shape.weight if req.shape is not None else 1)
        body = "{}" if status == 200 else '{"error": "rate limited"}'
        return Outcome(classify(status, body), status, retry, asyncio.get_running_loop().time() - start)

    async def close(self) -> None:
        pass
