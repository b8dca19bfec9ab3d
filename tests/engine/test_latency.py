"""Honest latency: arrival -> done and queue wait beside send -> answer (virtual time)."""

from __future__ import annotations

import pytest

from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine


@pytest.mark.parametrize("backpressure", [False, True])
def test_overload_shows_in_arrival_to_done_while_send_to_answer_stays_near_the_network(
    tmp_path, backpressure
):
    # 5 keys x 20/s = 100/s offered 200/s for 10 s: half the work waits.
    engine, _ = seed_engine(
        tmp_path,
        engine={"backpressure": backpressure, "ttl_s": 120.0},
        workload={"rate": 200.0},
        run={"seed": 3},
    )
    snap = run_virtual(engine.run(10.0))
    assert snap.balance() == 0 and snap.succeeded > 800
    # The study's server answers in 0..100 ms: send -> answer stays there.
    assert snap.latency.p99 < 150
    # From arrival (or the schedule a fixed rate promised), the wait shows: seconds.
    assert snap.latency_total.p99 > 2500 and snap.latency_total.p999 >= snap.latency_total.p99
    assert snap.latency_total.count == snap.succeeded
    if not backpressure:
        # The queue itself held them (with backpressure on, the source waited instead).
        assert snap.queue_wait.p99 > 2500


def test_under_capacity_arrival_to_done_is_about_send_to_answer(tmp_path):
    engine, _ = seed_engine(tmp_path, workload={"rate": 50.0}, run={"seed": 3})
    snap = run_virtual(engine.run(8.0))
    assert snap.balance() == 0
    assert snap.latency_total.p50 < snap.latency.p50 + 60
    assert snap.queue_wait.count == snap.sent - snap.retried


def test_each_key_reports_its_fingerprint_and_its_own_percentiles(tmp_path):
    import hashlib

    engine, _ = seed_engine(tmp_path, workload={"rate": 80.0}, run={"seed": 3})
    secrets = {k.label: k.secret for k in engine.cfg.keys}
    snap = run_virtual(engine.run(8.0))
    assert snap.keys and sum(k.latency.count for k in snap.keys) == snap.latency.count
    for row in snap.keys:
        assert row.fingerprint == hashlib.sha256(secrets[row.label].encode()).hexdigest()[:6]
        lat = row.latency
        assert lat.count == row.succeeded > 0
        assert 0 < lat.p50 <= lat.p90 <= lat.p99 <= lat.max <= snap.latency.max
        # The same server and network for every key: each key's median is near the run's.
        assert abs(lat.p50 - snap.latency.p50) < 0.25 * snap.latency.p50


def test_a_key_s_percentiles_are_the_run_histogram_s_within_two_percent():
    import random

    from ratedeck.engine.observe.metrics import KeyLatency, LatencyHistogram

    rng = random.Random(7)
    key, run = KeyLatency(refresh_s=1.0), LatencyHistogram()
    assert key.summary(0.0).count == 0 and key.bins is None  # nothing allocated before an answer
    for _ in range(20_000):
        ms = rng.lognormvariate(3.5, 0.8)
        key.add(ms)
        run.add(ms)
    mine, whole = key.summary(10.0), run.summary()
    assert mine.count == whole.count and mine.max == whole.max and mine.mean == pytest.approx(whole.mean)
    for q in ("p50", "p90", "p99", "p999"):
        assert getattr(mine, q) == pytest.approx(getattr(whole, q), rel=0.021), q
    assert key.summary(10.5) is mine  # no new answer: the same summary, nothing worked out again
    for _ in range(20_000):
        key.add(1000.0)
    key.add(120_000.0)  # beyond the last bin: counted there, max kept
    soon = key.summary(10.5)  # within refresh_s: count and max current, percentiles not yet
    assert soon.count == whole.count + 20_001 and soon.max == 120_000.0 and soon.p99 == mine.p99
    later = key.summary(11.0)
    assert later.p99 == pytest.approx(1000.0, rel=0.021) and later.p50 > mine.p99
