"""Baseline clients, written from the designs they stand for (the study's clients).

- `original`: the study's original client. One worker per key with one request
  in flight; a fixed minimum interval (window / limit, 50 ms at 20/1s) plus a
  ring of `limit` send times, polled with 1 ms sleeps; an unbounded queue;
  nonce = wall time in ms; expired requests are dropped, no retries.
- `improved-async`: the study's improved client. The ring without the fixed
  interval, plus a 30..50 ms buffer from average latency x 1.1; one request in
  flight per key; a soft queue cap (the generator sleeps 0.5 s once 50 are
  queued, or half a second of work at faster rates);
  failures go to a DLQ and are retried up to 5 attempts, then the graveyard.
- `improved-threads`: the same design on threads (one per key, plus generator
  and DLQ threads) with `http.client` keep-alive connections.
- `aiolimiter`: what a user gets from `AsyncLimiter(limit, window)` per key:
  several requests in flight per key, failures retried up to 5 attempts.

Every client is offered the same arrival rate: random gaps averaging
1 / rate (the study's generator shape, 0..21 ms at 95/s), caught up if a sleep
overshoots. All answers are timed the same way (send to answer).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from .limiters import AdaptiveRing, FixedIntervalRing
from .spec import RunSpec
from .tally import FAILED, OK, Tally, classify
from .work import DRAIN_S, MAX_ATTEMPTS, BenchRequest, NonceSource, arrival_gaps, query, soft_queue_cap

# ---------------------------------------------------------------- asyncio clients


class AsyncClient:
    """Shared plumbing of the asyncio baselines: session, generator, stop and drain."""

    def __init__(self, spec: RunSpec, connections: int):
        self.spec = spec
        self.tally = Tally()
        self.loop = asyncio.get_running_loop()
        self.stopping = False
        self.in_flight = 0
        self.queue: asyncio.Queue[BenchRequest] = asyncio.Queue()
        self._next_id = 0
        self._connections = connections
        self.session: aiohttp.ClientSession | None = None

    async def send(self, key: str, req: BenchRequest, nonce: int | None) -> tuple[str, float]:
        """One GET; returns (kind, round trip ms). Never raises for network trouble."""
        self.tally.sent += 1
        self.in_flight += 1
        req.attempts += 1
        loop = self.loop
        start = loop.time()
        session = self.session
        assert session is not None  # open while run() runs
        try:
            async with session.get(f"{self.spec.url}?{query(key, req.id, nonce)}") as resp:
                body = await resp.text()
                kind = classify(resp.status, body)
        except (TimeoutError, aiohttp.ClientError, OSError):
            kind = FAILED
        finally:
            self.in_flight -= 1
        rtt_ms = (loop.time() - start) * 1000.0
        self.tally.answer(kind, rtt_ms)
        return kind, rtt_ms

    def new_request(self) -> BenchRequest:
        self._next_id += 1
        self.tally.generated += 1
        return BenchRequest(self._next_id, self.loop.time() + self.spec.ttl_s)

    async def generate(self, soft_cap: int | None = None, cap_sleep_s: float = 0.5) -> None:
        """New requests at the offered rate until stopped; with `soft_cap`, sleep
        `cap_sleep_s` whenever that many are queued."""
        loop, gap = self.loop, arrival_gaps(self.spec.offered_tps, random.Random(self.spec.seed))
        next_t = loop.time()
        while not self.stopping:
            now = loop.time()
            if next_t > now:
                await asyncio.sleep(next_t - now)
                continue
            if soft_cap is not None and self.queue.qsize() >= soft_cap:
                await asyncio.sleep(cap_sleep_s)
                continue
            self.queue.put_nowait(self.new_request())
            next_t = max(next_t + gap(), now - 0.05)  # after a stall, do not burst to catch up

    def retry_or_bury(self, req: BenchRequest, put: Callable[[BenchRequest], None]) -> None:
        if req.attempts >= MAX_ATTEMPTS:
            self.tally.graveyard += 1
        else:
            put(req)

    async def run(self, tasks: Sequence[Awaitable[Any]]) -> Tally:
        connector = aiohttp.TCPConnector(limit=self._connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
        ) as self.session:
            running = [asyncio.ensure_future(t) for t in tasks]
            await asyncio.sleep(self.spec.duration_s)
            self.stopping = True
            deadline = self.loop.time() + DRAIN_S
            while self.in_flight and self.loop.time() < deadline:
                await asyncio.sleep(0.005)
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        return self.tally


async def run_original(spec: RunSpec) -> Tally:
    """The study's original client design (see the module docstring)."""
    client = AsyncClient(spec, connections=len(spec.keys))
    window_ms = spec.window_s * 1000.0
    interval_ms = window_ms / spec.limit

    async def worker(key: str) -> None:
        loop, tally, q = client.loop, client.tally, client.queue
        limiter = FixedIntervalRing(spec.limit, window_ms, interval_ms)
        while not client.stopping:
            req = await q.get()
            # Acquire with the request's remaining TTL as the timeout, polling every 1 ms.
            expired = False
            while not limiter.ready(loop.time() * 1000.0):
                if loop.time() >= req.deadline:
                    expired = True
                    break
                await asyncio.sleep(0.001)
                if client.stopping:
                    return
            if expired or loop.time() >= req.deadline:
                tally.expired += 1
                continue
            limiter.take(loop.time() * 1000.0)
            nonce = int(time.time() * 1000) if spec.nonce else None
            await client.send(key, req, nonce)  # no retries: a failure is just counted

    return await client.run([client.generate()] + [worker(k) for k in spec.keys])


async def run_improved_async(spec: RunSpec) -> Tally:
    """The study's improved client design on asyncio (see the module docstring)."""
    client = AsyncClient(spec, connections=len(spec.keys))
    dlq: asyncio.Queue[BenchRequest] = asyncio.Queue()
    window_ms = spec.window_s * 1000.0

    async def worker(key: str) -> None:
        loop, tally, q = client.loop, client.tally, client.queue
        limiter = AdaptiveRing(spec.limit, window_ms)
        nonces = NonceSource()
        while not client.stopping:
            req = await q.get()
            if loop.time() >= req.deadline:
                tally.expired += 1
                continue
            expired = False
            while (wait := limiter.wait_ms(loop.time() * 1000.0)) > 0:
                if loop.time() >= req.deadline:
                    expired = True
                    break
                await asyncio.sleep(wait / 1000.0)
                if client.stopping:
                    return
            if expired or loop.time() >= req.deadline:
                tally.expired += 1
                continue
            limiter.take(loop.time() * 1000.0)
            kind, rtt_ms = await client.send(key, req, nonces.next() if spec.nonce else None)
            limiter.record_latency(rtt_ms)
            if kind != OK:
                client.retry_or_bury(req, dlq.put_nowait)

    async def dlq_manager() -> None:
        while True:
            req = await dlq.get()
            client.queue.put_nowait(req)

    tasks = [client.generate(soft_cap=soft_queue_cap(spec.offered_tps)), dlq_manager()]
    return await client.run(tasks + [worker(k) for k in spec.keys])


async def run_aiolimiter(spec: RunSpec) -> Tally:
    """`aiolimiter.AsyncLimiter(limit, window)` per key, `in_flight` senders per key."""
    from aiolimiter import AsyncLimiter

    client = AsyncClient(spec, connections=len(spec.keys) * spec.in_flight)

    async def sender(key: str, limiter: AsyncLimiter, nonces: NonceSource) -> None:
        loop, tally, q = client.loop, client.tally, client.queue
        while not client.stopping:
            req = await q.get()
            if loop.time() >= req.deadline:
                tally.expired += 1
                continue
            async with limiter:
                if client.stopping:
                    return
                if loop.time() >= req.deadline:
                    tally.expired += 1
                    continue
                kind, _ = await client.send(key, req, nonces.next() if spec.nonce else None)
            if kind != OK:
                client.retry_or_bury(req, q.put_nowait)

    tasks: list[Awaitable] = [client.generate(soft_cap=soft_queue_cap(spec.offered_tps), cap_sleep_s=0.005)]
    for key in spec.keys:
        limiter, nonces = AsyncLimiter(spec.limit, spec.window_s), NonceSource()
        tasks.extend(sender(key, limiter, nonces) for _ in range(spec.in_flight))
    return await client.run(tasks)


ASYNC_RUNNERS = {
    "original": run_original,
    "improved-async": run_improved_async,
    "aiolimiter": run_aiolimiter,
}
