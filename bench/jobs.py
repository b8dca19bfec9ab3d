"""`ratedeck bench --scenarios jobs`: N jobs under a sliding window, a bucket, fixed windows.

Each strategy works the same N jobs against a fresh in-process server of the
scenario's policy kind (`server/policy_transport.py`: the HTTP simulator knows
sliding windows only), on the wall clock, one after another. The row's
makespan ratio is the time from its start to its last success over the least
time the scenario's limits allow for the same jobs (`engine/observe/makespan.py`:
bursts counted, plus one mean round trip): 1.0 is as fast as the rules allow.

Strategies: `ratedeck` (the job fed by backpressure, as a workload file with
no `--rate` is), `ratedeck+rate` (the same with `--rate` at the keys'
capacity: a fixed arrival rate instead of backpressure, a bucket's drain
rate), `aiolimiter` (`AsyncLimiter(limit, limit / rate)` per key: a bucket of
the limit draining the long-run rate; 8 senders per key, each waiting out a
429's Retry-After before trying again).
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratedeck.core.loops import new_loop
from ratedeck.core.policy import Policy, parse_policy
from ratedeck.core.vocab import PolicyKind
from ratedeck.engine.observe.makespan import Limits, least_time
from ratedeck.server.policy_transport import PolicyTransport

from .scenarios import JOB_SCENARIOS, JobScenario

#: A strategy that has not finished in this many times the least time (plus a margin) is cut off.
CUTOFF_FACTOR = 3.0
IN_FLIGHT = 8


def costs_of(s: JobScenario) -> list[int]:
    return [s.costs[i % len(s.costs)] for i in range(s.jobs)]


def least_for(s: JobScenario, started_wall: float) -> float:
    """The least time the scenario's limits allow for all its jobs, started at `started_wall` (Unix)."""
    policy = parse_policy(s.policy)
    turn = None
    if policy.kind is PolicyKind.FIXED:  # windows aligned to the clock, as the server's are
        turn = policy.window_s - math.fmod(started_wall, policy.window_s)
    units = sum(costs_of(s)) if s.weighted else s.jobs
    keys = [Limits((policy,), (turn,))] * s.keys
    return least_time([(keys, units)], rtt_s=sum(s.latency_ms) / 1000.0)


async def _ratedeck(s: JobScenario, server: PolicyTransport, rate: float | None) -> tuple[int, float]:
    from ratedeck.config import load_config
    from ratedeck.engine import Engine

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text(
            "".join(json.dumps({"i": i, "_weight": c}) + "\n" for i, c in enumerate(costs_of(s))),
            encoding="utf-8",
        )
        keys: dict[str, Any] = {"secrets": list(_keys(s)), "limits": [s.policy]}
        if s.weighted:
            keys["unit"] = "weight"
        workload: dict[str, Any] = {"file": str(path)}
        if rate is not None:
            workload["rate"] = rate
        cfg = load_config(
            overrides={
                "target": {"url": "http://policy-server/jobs"},
                "keys": keys,
                "engine": {"graveyard_path": "", "ttl_s": 36000.0, "in_flight_per_key": IN_FLIGHT},
                "workload": workload,
            }
        )
        engine = Engine(cfg, server)
        snap = await engine.run(_cutoff(s))
    m = snap.makespan
    return snap.succeeded, m.elapsed_s if m is not None else 0.0


async def _aiolimiter(s: JobScenario, server: PolicyTransport) -> tuple[int, float]:
    from aiolimiter import AsyncLimiter

    policy = parse_policy(s.policy)
    loop = asyncio.get_running_loop()
    start = loop.time()
    work = deque(costs_of(s))
    done, last = 0, start

    async def sender(key: str, limiter: AsyncLimiter) -> None:
        nonlocal done, last
        while work:
            cost = work.popleft()
            while True:
                await limiter.acquire(cost)
                status, retry = await server.call(key, cost)
                if status == 200:
                    break
                await asyncio.sleep(retry or 1.0)
            done += 1
            last = loop.time()

    tasks = []
    for key in _keys(s):
        limiter = AsyncLimiter(policy.limit, policy.limit / policy.rate)
        tasks += [sender(key, limiter) for _ in range(IN_FLIGHT)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), _cutoff(s))
    except TimeoutError:
        pass
    return done, last - start


STRATEGIES: dict[str, Callable[[JobScenario, PolicyTransport], Any]] = {
    "ratedeck": lambda s, server: _ratedeck(s, server, None),
    "ratedeck+rate": lambda s, server: _ratedeck(s, server, s.capacity_tps),
    "aiolimiter": _aiolimiter,
}


def _keys(s: JobScenario) -> list[str]:
    return [f"job-key-{i:02d}-00000000000000" for i in range(s.keys)]


def _cutoff(s: JobScenario) -> float:
    return CUTOFF_FACTOR * least_for(s, time.time()) + 30.0


def run_strategy(s: JobScenario, strategy: str, loop_name: str = "uvloop", seed: int = 1) -> dict[str, Any]:
    """One strategy's row: jobs done, elapsed to the last success, the least time, their ratio, 429s."""
    policy: Policy = parse_policy(s.policy)
    server = PolicyTransport((policy,), latency_ms=s.latency_ms, seed=seed)
    loop = new_loop(loop_name)  # type: ignore[arg-type]
    try:
        started_wall = time.time()
        done, elapsed = loop.run_until_complete(STRATEGIES[strategy](s, server))
    finally:
        loop.close()
    least = least_for(s, started_wall)
    return {
        "strategy": strategy,
        "jobs": done,
        "elapsed_s": round(elapsed, 3),
        "least_s": round(least, 3),
        "ratio": round(elapsed / least, 4) if done == s.jobs and least > 0 else None,
        "rejected_429": server.refused,
        "units": sum(c for _, _, c in server.accepted),
        # for the bench's common charts
        "ok_per_s": round(done / elapsed, 2) if elapsed > 0 else 0.0,
    }


def run_jobs(name: str, strategies: list[str], loop_name: str, seed: int, progress: Callable[[str], None]):
    """One jobs scenario, every strategy in turn: a `ScenarioResult` of makespan rows."""
    from .output import ScenarioResult

    s = JOB_SCENARIOS[name]
    result = ScenarioResult(name, s.summary, s.capacity_tps)
    for strategy in strategies:
        progress(f"{name}: {strategy}, {s.jobs} jobs")
        result.rows.append(run_strategy(s, strategy, loop_name, seed))
    return result
