"""How many grant calls one Redis (one shard of a cluster) answers a second: a short, bounded loop.

    .venv/bin/python -m ratedeck.bench.measure_grants --seconds 3 --clients 8 --count 5

Starts its own redis-server (loopback, no persistence), then `clients` connections ask
for leases of `count` slots each, as fast as they can, on 64 budgets of one host (one
slot of a cluster) whose limits never bind; prints calls/s and slots/s. Redis runs
one script at a time: the shard's ceiling is 1 s / its own time per call (INFO commandstats),
whatever the clients (on a small box the Python clients bind first).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from ratedeck.bench.cluster import RedisProcess
from ratedeck.core.policy import parse_policy
from ratedeck.engine.ports import Ask
from ratedeck.store.redis_shared import RedisShared


async def _client(url: str, i: int, count: int, stop_at: float, budgets: int) -> tuple[int, int]:
    shared = RedisShared(url, namespace="measure")
    shared.bind(time.monotonic)
    policies = (parse_policy("1000000/1s"),)
    calls = slots = 0
    try:
        while time.monotonic() < stop_at:
            ask = Ask(f"host0/k{(i * 7 + calls) % budgets}", policies)
            grant = await shared.lease([ask], count, 0.01, 0.015, 0.0, 0.0, 1.0, 0.0)
            calls += 1
            slots += len(grant.times)
    finally:
        await shared.close()
    return calls, slots


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--budgets", type=int, default=64)
    args = p.parse_args()

    server = RedisProcess()
    try:

        async def run() -> tuple[list[tuple[int, int]], float]:
            stop_at = time.monotonic() + args.seconds
            results = await asyncio.gather(
                *(_client(server.url, i, args.count, stop_at, args.budgets) for i in range(args.clients))
            )
            shared = RedisShared(server.url)
            stats = await shared.client.info("commandstats")
            await shared.close()
            return results, float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))

        t0 = time.monotonic()
        results, usec = asyncio.run(run())
        took = time.monotonic() - t0
    finally:
        server.close()
    calls = sum(c for c, _s in results)
    slots = sum(s for _c, s in results)
    print(
        f"{args.clients} clients, count {args.count}, {took:.1f}s: "
        f"{calls / took:,.0f} grant calls/s, {slots / took:,.0f} slots/s; Redis's own time per call"
        f" {usec:.1f} us: at most {1e6 / usec if usec else 0:,.0f} calls/s on one core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
