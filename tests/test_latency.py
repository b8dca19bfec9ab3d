"""Honest latency: arrival -> done and queue wait beside send -> answer (virtual time)."""

from __future__ import annotations

import pytest
from engine_helpers import seed_engine

from ratedeck.server.simulated import run_virtual


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
    # The seed server answers in 0..100 ms: send -> answer stays there.
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
