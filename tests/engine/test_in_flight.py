"""In flight as the round trip needs: the size (pure, as a table) and a run on virtual time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratedeck.core.policy import Policy
from ratedeck.engine.limits.in_flight import START, InFlightSizing
from ratedeck.server.settings import standard_settings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine


def _sized(answers: list[tuple[float, bool]], rate: float, ceiling: int = 64, full: bool = True) -> int:
    """The size after `answers`, the ticker looking after each (`full`: work always waits
    with the key's in flight at its size)."""
    sizing = InFlightSizing(ceiling)
    size = sizing.size(rate, full)
    for rtt, ok in answers:
        sizing.answered(rtt, ok)
        size = sizing.size(rate, full)
    return size


STEADY = [(0.1, True)] * 200


@pytest.mark.parametrize(
    ("case", "answers", "rate", "ceiling", "want"),
    [
        ("before any answer: the old default", [], 100.0, 64, START),
        ("before any answer, under a low ceiling", [], 100.0, 4, 4),
        ("100/s at a steady 100 ms: 10 on the wire and the one going", STEADY, 100.0, 64, 11),
        ("20/s at 100 ms", STEADY, 20.0, 64, 3),
        ("1/s at 100 ms: the one on the wire and the next", STEADY, 1.0, 64, 2),
        ("8.3/s at 6 s (completions): 51", [(6.0, True)] * 200, 500 / 60, 256, 51),
        ("the ceiling holds", [(6.0, True)] * 200, 500 / 60, 32, 32),
        ("a rate it cannot know: the old default", STEADY, float("inf"), 64, START),
    ],
)
def test_the_size_is_the_rate_times_the_round_trip(case, answers, rate, ceiling, want):
    assert _sized(answers, rate, ceiling) == want, case


def test_the_spread_of_the_round_trips_is_allowed_for():
    # Round trips of 60..170 ms (mean 115): a fixed 8 would cap 100/s near 70/s; the size
    # covers the mean and its spread, as the 16 a careful user would pin.
    answers = [(0.06 + 0.11 * ((i * 7) % 11) / 10, True) for i in range(400)]
    size = _sized(answers, 100.0)
    assert 14 <= size <= 26, size


def test_it_grows_only_while_the_key_is_full_and_work_waits():
    assert _sized(STEADY, 100.0, full=False) == START  # never held back: no reason to grow
    assert _sized(STEADY, 1.0, full=False) == 2  # but never above what the round trip needs


def test_answers_that_slow_down_shrink_it_and_a_longer_path_within_reason_grows_it():
    usual = _sized(STEADY, 100.0)
    longer = _sized(STEADY + [(0.13, True)] * 40, 100.0)
    queueing = _sized(STEADY + [(0.5, True)] * 30, 100.0)
    assert longer > usual  # a longer round trip within reason: more on the wire, as Little's law says
    assert queueing < usual, (usual, longer, queueing)  # a server that queues: fewer at once


def test_a_slowdown_that_lasts_becomes_the_usual():
    after = _sized(STEADY + [(0.3, True)] * 20_000, 100.0)
    assert after >= 30, after  # 100/s at 300 ms


def test_a_run_of_timeouts_halves_it_and_successes_win_it_back():
    troubled = STEADY + [(0.1, True), (10.0, False)] * 20  # half the answers time out
    cut = _sized(troubled, 100.0)
    assert cut <= 3, cut
    recovered = _sized(troubled + [(0.1, True)] * 300, 100.0)
    assert recovered == 11, recovered


def test_a_stray_server_error_among_many_successes_cuts_nothing():
    stray = [(0.1, i % 50 != 0) for i in range(600)]  # 2% 500s
    assert _sized(STEADY + stray, 100.0) == 11


# -- on virtual time: 2 keys x 100/1s, round trips of 60..170 ms
def _run(in_flight: int | str, seed: int = 1):
    server = replace(
        standard_settings(),
        keys=("k1", "k2"),
        policies=(Policy(100, 1.0),),
        latency_in_ms=(5, 45),
        latency_out_ms=(5, 45),
        processing_ms=(20, 80),
        seed=seed,
    )
    eng, transport = seed_engine(
        server=server,
        transport_kw={"seed": seed},
        keys={"secrets": ["k1", "k2"], "limits": ["100/1s"]},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "in_flight_per_key": in_flight},
        workload={"rate": 250.0},
        run={"seed": seed},
    )
    snap = run_virtual(eng.run(20))
    return snap, transport.rules.stats()


def test_auto_reaches_the_limit_where_a_pinned_8_cannot():
    pinned, _ = _run(8)
    auto, stats = _run("auto")
    allowed = 2 * 100 * 20
    assert pinned.succeeded / allowed < 0.8, pinned.succeeded  # 8 at ~115 ms: ~70/s a key
    assert auto.succeeded / allowed >= 0.9, auto.succeeded
    assert auto.rejected_429 == 0
    assert stats["share"]["sustained"] >= 0.9, stats["share"]
    for row in auto.keys:
        assert row.in_flight_auto
        assert 12 <= row.in_flight_limit <= 30, row.in_flight_limit
    assert all(not row.in_flight_auto and row.in_flight_limit == 8 for row in pinned.keys)


def test_a_full_bucket_s_burst_doubles_it_per_look_and_the_steady_pace_takes_it_back():
    sizing = InFlightSizing(64)
    for _ in range(200):
        sizing.answered(0.2, True)
    sizes = [sizing.size(8.3, full=True, room=True) for _ in range(4)]
    assert sizes == [16, 32, 64, 64], sizes  # the limits let it send now: only the size held it
    assert sizing.size(8.3, full=True, room=False) == 3  # the burst spent: 8.3/s x 0.2 s, +1


@pytest.mark.parametrize(
    ("rtt_s", "most"),
    [
        (0.2, 1.1),  # requests bind: 2,500 at once, then 500 a minute per key
        (3.0, 1.3),  # completions of 3 s: the burst needs ~170 in flight per key
    ],
    ids=["requests-bind", "slow-completions"],
)
def test_an_openai_job_spends_its_burst_at_once(tmp_path, rtt_s, most):
    """3,000 prompts on 5 keys, the OpenAI preset with no --in-flight (its first sizes: one per
    model until the first answer, then 8): the makespan stays near the least time the limits
    allow (pinned 64 took 1.03x and 2.20x; a size that grew by one per look, 3.26x and 4.90x)."""
    from tests.engine.test_progress import STUB_DEFAULT, openai_job, watch_to_end

    engine = openai_job(tmp_path, {"gpt-4o-mini": STUB_DEFAULT}, 16, rtt_s)
    _, snap = watch_to_end(engine)
    assert snap.succeeded == 3000
    assert snap.makespan.ratio is not None and snap.makespan.ratio <= most, snap.makespan
