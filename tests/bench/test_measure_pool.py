"""bench/measure_pool.py's failover case, scaled down: one Azure resource of a three-endpoint pool
refuses connections a third of the way into a Batch file, through the real CLI."""

import asyncio

import pytest

from ratedeck.bench.measure_pool import Endpoint, PoolSpec, batch_lines, run_batch

# Small told limits (real minutes): the pool's full buckets are 30,000 tokens, the 150 lines
# 37,500, so the run is a burst and then ~15 s of refill.
SPEC = PoolSpec(
    endpoints=(
        Endpoint("east", "azure", 6_000, rpm=600, tell_rpm=True),
        Endpoint("west", "azure", 12_000, rpm=600, tell_rpm=True),
        Endpoint("openai", "openai", 12_000, rpm=600),
    ),
    latency=0.2,
)


@pytest.mark.slow
def test_a_resource_that_goes_dark_a_third_in_loses_and_repeats_nothing(tmp_path):
    lines = batch_lines(150, prompt_chars=600, max_tokens=100)
    r = asyncio.run(run_batch(SPEC, lines, tmp_path, dark=("east", "refuse")))
    assert r["dark"]["at_lines"] is not None, r["log_tail"]  # it went dark while the run was going
    assert r["exit"] == 0, r["log_tail"]
    assert r["exactly_once"] and r["lines"] == 150, (r["missing"], r["twice"])
    assert r["statuses"] == {"200": 150}, r["statuses"]
