"""live-heavy's servers (the simulator and the jitter proxy, each in its own process) and the
engine through a Session, with a line a second of the keys' in-flight sizes, what is in flight,
the p50 round trip and the headroom, then the server's own share.

    PIN=auto|N DUR=20 MAXF=64 .venv/bin/python -m tests.perf.live_in_flight
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

from ratedeck.bench.procs import JitterProxyProcess, Simulator
from ratedeck.bench.scenarios import SCENARIOS
from ratedeck.config import load_config
from ratedeck.host.session import Session

PIN = os.environ.get("PIN", "auto")
DUR = float(os.environ.get("DUR", "20"))
MAXF = int(os.environ.get("MAXF", "64"))


async def run(url: str) -> None:
    scenario = SCENARIOS["live-heavy"]
    in_flight: int | str = int(PIN) if PIN != "auto" else "auto"
    cfg = load_config(
        preset="study",
        overrides={
            "target": {"url": url, "nonce_param": ""},
            "keys": {"secrets": list(scenario.keys), "limits": ["100/1s"]},
            "engine": {"graveyard_path": "", "in_flight_per_key": in_flight, "in_flight_max": MAXF},
            "workload": {"rate": 5000.0},
            "run": {"seed": 1},
        },
    )
    session = Session(cfg)
    await session.start()
    cpu0 = time.process_time()
    for second in range(int(DUR)):
        await asyncio.sleep(1)
        snap = session.snapshot()
        sizes = [k.in_flight_limit for k in snap.keys]
        flying = [k.in_flight for k in snap.keys]
        print(
            f"{second + 1:3d}s ok {snap.succeeded:6d} size med {statistics.median(sizes)} max {max(sizes)}"
            f" in flight med {statistics.median(flying)} all {sum(flying)} p50 {snap.latency.p50}"
            f" headroom {snap.headroom_ms:.0f} ms",
            flush=True,
        )
    snap = await session.stop()
    print(
        f"ok {snap.succeeded} 429 {snap.rejected_429} expired {snap.expired}"
        f" cpu {time.process_time() - cpu0:.2f} s"
    )


def main() -> None:
    scenario = SCENARIOS["live-heavy"]
    with Simulator(scenario.serve_args) as sim:
        assert scenario.jitter_ms is not None
        with JitterProxyProcess(sim.base, scenario.jitter_ms, 1, DUR + 30) as proxy:
            asyncio.run(run(f"{proxy.base}/api/request"))
            print("server's share", sim.stats().get("share"))


if __name__ == "__main__":
    main()
