"""Measure jobs on the real loopback stubs (wall time): the makespan ratio, and Kraken's share.

    .venv/bin/python -m ratedeck.bench.measure_jobs kraken-burst   # 2 keys, 15@0.33/s, costs 1 and 2, 40 s
    .venv/bin/python -m ratedeck.bench.measure_jobs kraken         # the same counters, a job of 60 s of limit
    .venv/bin/python -m ratedeck.bench.measure_jobs github         # 2 tokens x 20 per 20 s (windows open at a request)
    .venv/bin/python -m ratedeck.bench.measure_jobs binance        # weight 60/5s per IP, clock-aligned, weights 1..20

Each job is a workload file with no --rate (fed as fast as the limits allow), through the
preset as shipped, with the limits a user would state for the scaled-down server. Prints
the engine's makespan (jobs, elapsed, least, ratio) and what the stub's ledger says.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import tempfile
from pathlib import Path

from ratedeck.config import load_config
from ratedeck.engine import Engine
from ratedeck.engine.http.endpoints import run_transport
from ratedeck.server.stubs.binance import start_binance
from ratedeck.server.stubs.github import start_github
from ratedeck.server.stubs.kraken import start_kraken

KRAKEN_KEYS = {
    f"KRAKENKEY{i}00000000000000000000": base64.b64encode(
        f"kraken-secret-{i}-0123456789abcdef".encode()
    ).decode()
    for i in range(2)
}


async def run_job(preset: str, url: str, lines: list[dict], seconds: float | None, **overrides):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        overrides.setdefault("engine", {})["graveyard_path"] = str(Path(tmp) / "graveyard.jsonl")
        cfg = load_config(
            preset=preset, overrides={"target": {"url": url}, "workload": {"file": str(path)}, **overrides}
        )
        transport = run_transport(cfg.engine_settings, url)
        engine = Engine(cfg, transport)
        try:
            return await engine.run(seconds)
        finally:
            await transport.close()


def kraken_lines(n: int) -> list[dict]:
    return [{"_path": "/0/private/Ledgers" if i % 2 else "/0/private/Balance"} for i in range(n)]


async def kraken(seconds: float | None, jobs: int) -> None:
    async with await start_kraken(keys=KRAKEN_KEYS) as stub:  # starter: 15, draining 0.33/s
        start = stub.now()
        snap = await run_job(
            "kraken",
            stub.url + "/0/private/Balance",
            kraken_lines(jobs),
            seconds,
            keys={"secrets": [f"{k} {s}" for k, s in KRAKEN_KEYS.items()]},
        )
        end = stub.now()
        served = sum(stub.ledger.units(key=k) for k in KRAKEN_KEYS)
        allowed = sum(stub.allowed_capacity(start, end, key=k) for k in KRAKEN_KEYS)
        print(f"kraken: {snap.succeeded} calls, {served:g} of {allowed:g} units the counters allowed", end="")
        print(f" ({served / allowed:.3f}) in {end - start:.1f} s; refused {len(stub.ledger.refused())}")
        print(f"  makespan {snap.makespan}, ratio {snap.makespan.ratio:.4f}")


async def github() -> None:
    tokens = ["ghp_alpha0000000000000000", "ghp_bravo0000000000000000"]
    async with await start_github(tokens=tokens, core_limit=20, core_window=20.0) as stub:
        lines = [{"_path": "/repos/o/r/issues", "page": i} for i in range(2 * 20 * 4)]  # 60 s of limit
        snap = await run_job(
            "github",
            stub.url + "/repos/o/r/issues",
            lines,
            None,
            keys={"secrets": tokens, "limits": ["20/20s fixed"]},
        )
        print(f"github: {snap.succeeded} ok, refused {len(stub.ledger.refused())}, {stub.ledger.counts()}")
        print(f"  makespan {snap.makespan}, ratio {snap.makespan.ratio:.4f}")


async def binance() -> None:
    key, secret = "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zv", "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP"
    async with await start_binance(keys={key: secret}, weight_limits=((60, 5.0),)) as stub:
        mix = [
            {"_path": "/api/v3/depth", "symbol": "BTCUSDT"},  # 5
            {"_path": "/api/v3/ping"},  # 1
            {"_path": "/api/v3/exchangeInfo"},  # 20
            {"_path": "/api/v3/account"},  # 20
            {"_path": "/api/v3/ticker/price", "symbol": "ETHUSDT"},  # 2
        ]
        lines = [mix[i % len(mix)] for i in range(5 * 17)]  # 17 x 48 = 816 weight: 13.6 windows, 65 s
        snap = await run_job(
            "binance",
            stub.url,
            lines,
            None,
            keys={"secrets": [f"{key} {secret}"]},
            budgets=[
                {"name": "weight", "scope": "host", "unit": "weight", "limits": ["60/5s fixed"]},
                {"name": "orders", "limits": ["100/10s fixed"], "paths": ["/api/v3/order"]},
            ],
        )
        print(f"binance: {snap.succeeded} ok, refused {len(stub.ledger.refused())}, {stub.ledger.counts()}")
        print(f"  makespan {snap.makespan}, ratio {snap.makespan.ratio:.4f}")


def main(which: str) -> None:
    if which == "kraken-burst":
        asyncio.run(kraken(40.0, 2000))
    elif which == "kraken":
        asyncio.run(kraken(None, 46))  # 2 x (15 + 0.33 x 60) = 69.6 units: 46 jobs of mean cost 1.5
    elif which == "github":
        asyncio.run(github())
    elif which == "binance":
        asyncio.run(binance())
    else:
        raise SystemExit(f"unknown: {which}; kraken-burst, kraken, github, binance")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "kraken-burst")
