"""A job on the Kraken stub (real loopback, wall time): the counters' burst gets used."""

from __future__ import annotations

import asyncio

import pytest

from ratedeck.bench.measure_jobs import KRAKEN_KEYS, kraken_lines, run_job
from ratedeck.server.stubs.kraken import start_kraken

pytestmark = pytest.mark.slow


def test_a_kraken_job_fed_by_backpressure_gets_what_the_counters_allow():
    """2 keys x 15@0.33/s (starter), calls costing 1 and 2, 18 s: the burst of 15 per key and the
    drain after it. At the drain rate as its arrival rate (before) it got about 0.6 of it."""

    async def main():
        async with await start_kraken(keys=KRAKEN_KEYS) as stub:
            start = stub.now()
            snap = await run_job(
                "kraken",
                stub.url + "/0/private/Balance",
                kraken_lines(500),
                18.0,
                keys={"secrets": [f"{k} {s}" for k, s in KRAKEN_KEYS.items()]},
            )
            end = stub.now()
            served = sum(stub.ledger.units(key=k) for k in KRAKEN_KEYS)
            allowed = sum(stub.allowed_capacity(start, end, key=k) for k in KRAKEN_KEYS)
            return snap, stub, served, allowed

    snap, stub, served, allowed = asyncio.run(main())
    assert stub.ledger.refused() == [], stub.ledger.counts()
    assert served >= 0.90 * allowed, (served, allowed)
    assert snap.makespan is not None and snap.makespan.jobs == snap.succeeded
