"""Micro benchmarks and scaling jobs.

- `limiter_micro`: the cost of one non-blocking acquire on a fake clock, for
  ratedeck's `WindowLimiter`, aiolimiter and pyrate-limiter (in this process).
- child jobs (`JOBS`, run by `child.py` in their own process):
  "bare-aiohttp" and "engine-max" drive an endpoint with no effective limit
  at the same concurrency; "scale-keys" and "scale-queue" show how CPU per
  request and memory grow with the number of keys and the queue's depth.

Every job measures its own CPU (user + system of its process) over its
measuring window, so start-up and imports are left out.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .spec import RunSpec

WARMUP_S = 0.5


def _cpu() -> float:
    from .child import cpu_now

    return cpu_now()


def _rss_mb() -> float:
    """Current resident memory (Linux /proc), else the peak so far."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)
    except (OSError, ValueError, IndexError):
        return _peak_rss_mb()


def _peak_rss_mb() -> float:
    from .child import peak_rss_mb

    return peak_rss_mb()


# ---------------------------------------------------------------- limiter acquire cost


def ratedeck_acquire(ops: int) -> float:
    """`next_free` + `record` on a fake clock that always has a free slot (20/1s, even pacing)."""
    from ratedeck.core.policy import Policy
    from ratedeck.engine.limits.limiter import WindowLimiter

    lim = WindowLimiter((Policy(20, 1.0),), lambda: 0.05, "even")
    t, step = 0.0, 0.06
    start = time.perf_counter()
    for _ in range(ops):
        t += step
        if lim.next_free(t) <= t:
            lim.record(t)
    return time.perf_counter() - start


class _FakeClockLoop(asyncio.SelectorEventLoop):
    """A standard event loop whose `time()` the benchmark sets (aiolimiter reads it)."""

    now = 0.0

    def time(self) -> float:
        return self.now


def aiolimiter_acquire(ops: int) -> float:
    """`await AsyncLimiter(20, 1).acquire()` with the loop clock moved on so it never waits."""
    from aiolimiter import AsyncLimiter

    loop = _FakeClockLoop()

    async def body() -> float:
        lim = AsyncLimiter(20, 1)
        step = 0.06
        start = time.perf_counter()
        for _ in range(ops):
            loop.now += step
            await lim.acquire()
        return time.perf_counter() - start

    try:
        return loop.run_until_complete(body())
    finally:
        loop.close()


def pyrate_acquire(ops: int) -> float:
    """`Limiter.try_acquire(name, blocking=False)` on a 20/1s in-memory bucket, fake clock."""
    from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate, SingleBucketFactory

    class FakeClockBucket(InMemoryBucket):
        fake_ms = 0

        def now(self) -> int:
            return self.fake_ms

    bucket = FakeClockBucket([Rate(20, Duration.SECOND)])
    limiter = Limiter(SingleBucketFactory(bucket, schedule_leak=False))
    step_ms = 60
    start = time.perf_counter()
    for _ in range(ops):
        bucket.fake_ms += step_ms
        limiter.try_acquire("k", blocking=False)
    elapsed = time.perf_counter() - start
    return elapsed


def limiter_micro(ops: int = 200_000, repeats: int = 7) -> list[dict[str, Any]]:
    """µs per non-blocking acquire for each limiter, the best of `repeats` rounds.

    The limiters take turns within each round, so a noisy neighbour on the
    machine hits them alike. A library that is not installed is skipped.
    """
    runs = [("limiter_acquire_ratedeck", ratedeck_acquire)]
    for name, fn, module in (
        ("limiter_acquire_aiolimiter", aiolimiter_acquire, "aiolimiter"),
        ("limiter_acquire_pyrate", pyrate_acquire, "pyrate_limiter"),
    ):
        try:
            __import__(module)
        except ImportError:
            continue
        runs.append((name, fn))
    best = {name: float("inf") for name, _ in runs}
    for _ in range(repeats):
        for name, fn in runs:
            best[name] = min(best[name], fn(ops))
    return [{"name": name, "value": round(best[name] / ops * 1e6, 3), "unit": "us/op"} for name, _ in runs]


# ---------------------------------------------------------------- child jobs


async def bare_aiohttp(spec: RunSpec) -> dict[str, Any]:
    """`keys x in_flight` tasks, each a tight loop of GETs on one keep-alive session.

    Tuned as the engine's own client is (engine/http/client.py), so the comparison is fair:
    no per-request URL parse (a prebuilt `yarl.URL` per key, only the query
    varies), no per-request `ClientTimeout` timer (no timeout at all: the endpoint answers),
    no cookie jar (`DummyCookieJar`), the body read once.
    """
    import aiohttp
    from yarl import URL

    from .work import query

    concurrency = len(spec.keys) * spec.in_flight
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None, sock_read=None)
    base = URL(spec.url)
    parts = (base.scheme, base.raw_authority, base.raw_path)
    counts = {"ok": 0}
    stop = False

    async def one(i: int) -> None:
        key, rid = spec.keys[i % len(spec.keys)], i * 10_000_000
        scheme, authority, path = parts
        get = session.get
        while not stop:
            rid += 1
            url = URL.build(
                scheme=scheme,
                authority=authority,
                path=path,
                query_string=query(key, rid, None),
                encoded=True,
            )
            try:
                resp = await get(url)
                await resp.read()
                if resp.status == 200:
                    counts["ok"] += 1
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass

    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    ) as session:
        tasks = [asyncio.ensure_future(one(i)) for i in range(concurrency)]
        result = await _measure(spec.duration_s, lambda: counts["ok"])
        stop = True
        for task in tasks:  # the endpoint may hold answers: no timeout would end them
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


async def _measure(duration_s: float, succeeded: Callable[[], int]) -> dict[str, Any]:
    """Successes and CPU between the end of a short warm-up and `duration_s`."""
    await asyncio.sleep(WARMUP_S)
    ok0, cpu0, t0 = succeeded(), _cpu(), time.monotonic()
    await asyncio.sleep(max(0.1, duration_s - WARMUP_S))
    ok, cpu, wall = succeeded() - ok0, _cpu() - cpu0, time.monotonic() - t0
    return {
        "succeeded": ok,
        "wall_s": wall,
        "cpu_s": cpu,
        "ok_per_s": ok / wall,
        "cpu_us_per_req": cpu / ok * 1e6 if ok else 0.0,
        "peak_rss_mb": _peak_rss_mb(),
    }


def engine_config(spec: RunSpec, **engine: Any):
    """The engine's config for a micro run (`spec.extra["workload"]` adds to the workload)."""
    from ratedeck.config import load_config

    from .engine_run import engine_overrides

    # keys x in_flight at once, as the peers: the endpoint's limit never binds here
    overrides = engine_overrides(spec, **{"in_flight_per_key": spec.in_flight, **engine})
    workload = spec.extra.get("workload")
    if workload:
        overrides["workload"] = {**overrides["workload"], **workload}
    return load_config(preset="study", overrides=overrides)


def _engine_session(spec: RunSpec, **engine: Any):
    from ratedeck.host.session import Session

    return Session(engine_config(spec, **engine))


async def engine_max(spec: RunSpec) -> dict[str, Any]:
    """The engine against an endpoint whose limit never binds, at `keys x in_flight`."""
    session = _engine_session(spec, **spec.extra.get("engine", {}))
    engine = await session.start()
    try:
        result = await _measure(spec.duration_s, lambda: engine.parts.metrics.succeeded)
    finally:
        snap = await session.stop()
    result["rejected_429"] = snap.rejected_429
    return result


async def scale_keys(spec: RunSpec) -> dict[str, Any]:
    """The engine with `len(keys)` keys sharing a fixed total rate: CPU per request, memory."""
    session = _engine_session(spec)
    engine = await session.start()
    try:
        result = await _measure(spec.duration_s, lambda: engine.parts.metrics.succeeded)
    finally:
        await session.stop()
    result["keys"] = len(spec.keys)
    return result


async def scale_queue(spec: RunSpec) -> dict[str, Any]:
    """The engine with `extra["depth"]` requests queued at once (no backpressure, long TTL).

    Reports the time to queue them, resident memory once queued (and per queued
    request), and CPU per request sent while the queue is that deep.
    """
    depth = int(spec.extra["depth"])
    rss0 = _rss_mb()
    session = _engine_session(spec, backpressure=False, ttl_s=3600.0, queue_max=1)
    t0, cpu0 = time.monotonic(), _cpu()
    engine = await session.start()
    try:
        while engine.parts.metrics.generated < depth:
            await asyncio.sleep(0.01)
        fill_s, fill_cpu = time.monotonic() - t0, _cpu() - cpu0
        rss_full = _rss_mb()
        result = await _measure(spec.duration_s, lambda: engine.parts.metrics.succeeded)
    finally:
        await session.stop()
    result.update(
        {
            "depth": depth,
            "fill_s": fill_s,
            "fill_us_per_req": fill_cpu / depth * 1e6,
            "rss_full_mb": rss_full,
            "bytes_per_queued": (rss_full - rss0) * 1024 * 1024 / depth,
        }
    )
    return result


JOBS: dict[str, Callable[[RunSpec], Coroutine[Any, Any, dict[str, Any]]]] = {
    "bare-aiohttp": bare_aiohttp,
    "engine-max": engine_max,
    "scale-keys": scale_keys,
    "scale-queue": scale_queue,
}
