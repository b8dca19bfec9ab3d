"""Sustained efficiency (issue 44) on hand-made accept stamps: W / the mean gap between
accepted arrivals i and i+N of one key, and the run's mean over keys."""

from __future__ import annotations

import random

import pytest

from ratedeck.bench.sustained import binding_policy, run_sustained, sustained_efficiency
from ratedeck.core.policy import Policy, PolicyKind

N, W = 20, 1.0


def pace(rate_share: float, start: float, end: float) -> list[float]:
    """Arrivals evenly spaced at `rate_share` of N/W from `start` up to (not including) `end`."""
    gap = W / (N * rate_share)
    count = int(round((end - start) / gap))
    return [start + k * gap for k in range(count) if start + k * gap < end]


def accepted_over_capacity(arrivals: list[float], run_s: float) -> float:
    return len(arrivals) / (N * run_s / W)


def test_a_perfect_pace_at_the_limit_is_one():
    assert sustained_efficiency(pace(1.0, 0.0, 20.0), N, W) == pytest.approx(1.0)


def test_a_perfect_pace_below_the_limit_is_its_share():
    assert sustained_efficiency(pace(0.9, 0.0, 20.0), N, W) == pytest.approx(0.9)


def test_a_burst_at_the_start_then_a_pace_gives_the_pace_s_figure_not_more():
    # N at t=0, then 0.9 of the limit from the first instant the window allows.
    burst = [0.0] * N + pace(0.9, W + 1e-6, 20.0)
    paced = pace(0.9, 0.0, 20.0)
    # accepted / capacity rewards the burst ...
    assert accepted_over_capacity(burst, 20.0) > accepted_over_capacity(paced, 20.0)
    # ... sustained efficiency does not: the burst's pairs are a window apart or more.
    assert sustained_efficiency(burst, N, W) <= sustained_efficiency(paced, N, W)


def test_the_free_window_of_a_moving_window_run_is_not_counted():
    # Full windows back to back, each a burst just over a window after the last: 21 windows'
    # worth inside 20 s, the "free burst" accepted / capacity counts as 5% more.
    windows = [j * (W + 1e-6) for j in range(21) for _ in range(N)]
    assert accepted_over_capacity(windows, 20.0) == pytest.approx(1.05)
    assert sustained_efficiency(windows, N, W) == pytest.approx(1.0, abs=1e-5)
    assert sustained_efficiency(windows, N, W) <= 1.0


def test_a_pause_lowers_it_even_with_a_burst_after():
    steady = pace(1.0, 0.0, 25.0)
    paused = pace(1.0, 0.0, 10.0) + pace(1.0, 15.0, 25.0)
    burst_after = pace(1.0, 0.0, 10.0) + [15.0] * N + pace(1.0, 16.0 + 1e-6, 25.0)
    full = sustained_efficiency(steady, N, W)
    assert full == pytest.approx(1.0)
    assert sustained_efficiency(paused, N, W) < 0.9 * full
    assert sustained_efficiency(burst_after, N, W) < 0.9 * full


def test_fewer_than_n_plus_one_arrivals_have_no_figure():
    assert sustained_efficiency([], N, W) is None
    assert sustained_efficiency([0.05 * k for k in range(N)], N, W) is None
    # N+1 arrivals: one pair, the first and the last.
    assert sustained_efficiency([0.05 * k for k in range(N + 1)], N, W) == pytest.approx(1.0)


def test_the_order_of_the_stamps_does_not_matter_and_bad_arguments_are_refused():
    stamps = pace(0.8, 0.0, 10.0)
    shuffled = stamps[:]
    random.Random(1).shuffle(shuffled)
    assert sustained_efficiency(shuffled, N, W) == sustained_efficiency(stamps, N, W)
    with pytest.raises(ValueError):
        sustained_efficiency(stamps, 0, W)
    with pytest.raises(ValueError):
        sustained_efficiency(stamps, N, 0.0)


def test_the_run_s_figure_is_the_mean_over_the_keys_that_have_one():
    run = run_sustained([pace(1.0, 0.0, 10.0), pace(0.8, 0.0, 10.0), [0.0, 0.5]], N, W)
    assert run.by_key[0] == pytest.approx(1.0) and run.by_key[1] == pytest.approx(0.8)
    assert run.by_key[2] is None and run.scored == 2
    assert run.mean == pytest.approx(0.9)
    assert run_sustained([[], []], N, W).mean is None


def test_of_several_policies_the_lowest_rate_binds():
    per_second, per_minute = Policy(20, 1.0), Policy(600, 60.0)
    assert binding_policy([per_second, per_minute]) == per_minute
    assert binding_policy([per_second, Policy(40, 2.0)]) == Policy(40, 2.0)  # same rate: the longer window
    with pytest.raises(ValueError):
        binding_policy([Policy(15, 1.0, PolicyKind.BUCKET, 0.33)])


def test_a_bench_row_scores_the_servers_stamps_and_the_table_shows_it():
    from ratedeck.bench.output import ScenarioResult, make_row, scenario_table

    ms = [[t * 1000.0 for t in pace(1.0, 0.0, 5.0)], [t * 1000.0 for t in pace(0.8, 0.0, 5.0)]]
    server = {"totals": {"ok": 180}, "arrivals_ms": ms, "arrivals_dropped": 0}
    row = make_row("ratedeck", {"succeeded": 180}, server, 5.0, 40.0, policy=(N, W))
    assert row["sustained"] == pytest.approx(0.9) and row["sustained_by_key"] == [1.0, 0.8]
    assert row["sustained_keys"] == 2 and "sustained_stamps_dropped" not in row
    table = scenario_table(ScenarioResult("x", "y", 40.0, [row]), 5.0)
    assert "sustained" in table.splitlines()[2] and "0.900" in table
    # Without stamps (a report saved before) the column is not there.
    old = make_row("ratedeck", {"succeeded": 180}, {"totals": {}}, 5.0, 40.0)
    assert "sustained" not in old
    assert "sustained" not in scenario_table(ScenarioResult("x", "y", 40.0, [old]), 5.0)


def test_the_simulator_keeps_each_keys_accept_stamps_and_says_them_when_asked():
    from dataclasses import replace

    from ratedeck.server.rules import RateRules
    from ratedeck.server.settings import standard_settings

    settings = replace(standard_settings(), keys=("a", "b"), policies=(Policy(2, 1.0),), nonce=False)
    rules = RateRules(settings)
    for at, key in [(0.0, "a"), (10.0, "a"), (20.0, "a"), (30.0, "b"), (1500.0, "a")]:
        rules.decide(key, None, at)
    assert [list(a) for a in rules.arrivals_ms()] == [[0.0, 10.0, 1500.0], [30.0]]  # the 429 is not in
    assert "arrivals_ms" not in rules.stats()
    stats = rules.stats(arrivals=True)
    assert stats["arrivals_ms"] == [[0.0, 10.0, 1500.0], [30.0]] and stats["arrivals_dropped"] == 0
    rules.reset()
    assert [list(a) for a in rules.arrivals_ms()] == [[], []]
