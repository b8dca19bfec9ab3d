"""The least time a job needs under each policy kind, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from ratedeck.core.policy import parse_policy
from ratedeck.engine.observe.makespan import (
    Limits,
    Makespan,
    least_time,
    merge_makespans,
    policy_allows,
    time_for,
)


def lim(*texts: str, turns: tuple[float | None, ...] = ()) -> Limits:
    return Limits(tuple(parse_policy(t) for t in texts), turns)


def test_a_sliding_window_lets_its_limit_through_at_once_then_a_limit_each_window():
    # 10/1s: 10 at t=0, 20 by t=1, 30 by t=2, 40 by t=3 -> 35 units need t=3.
    assert policy_allows(parse_policy("10/1s"), 0.0) == 10
    assert policy_allows(parse_policy("10/1s"), 0.999) == 10
    assert policy_allows(parse_policy("10/1s"), 1.0) == 20
    assert time_for([lim("10/1s")], 10) == 0.0
    assert time_for([lim("10/1s")], 11) == pytest.approx(1.0)
    assert time_for([lim("10/1s")], 35) == pytest.approx(3.0)
    # plus one round trip for the last answer
    assert least_time([([lim("10/1s")], 35)], rtt_s=0.05) == pytest.approx(3.05)


def test_keys_work_side_by_side():
    # K = 5 keys x 20/1s: the first K*L = 100 go at once; 1200 = 100 + 11 windows of 100 -> t = 11.
    keys = [lim("20/1s")] * 5
    assert time_for(keys, 100) == 0.0
    assert time_for(keys, 1200) == pytest.approx(11.0)
    assert time_for(keys, 1201) == pytest.approx(12.0)


def test_a_fixed_window_turns_at_its_first_turn_then_every_window():
    # 10 per 1 s, first turn 0.3 s after the start: 10 at 0, 20 at 0.3, 30 at 1.3.
    w = lim("10/1s fixed", turns=(0.3,))
    assert time_for([w], 10) == 0.0
    assert time_for([w], 20) == pytest.approx(0.3)
    assert time_for([w], 25) == pytest.approx(1.3)
    # unknown turn: a whole window, like a sliding window
    assert time_for([lim("10/1s fixed")], 25) == pytest.approx(2.0)
    # 20 per 2 s, turn 2 s (a window that opened at the start): 600 units = 20 + 29 turns -> 58 s.
    assert time_for([lim("20/2s fixed", turns=(2.0,))], 600) == pytest.approx(58.0)


def test_a_bucket_lets_its_size_through_at_once_then_drains():
    # 15@0.33/s: 15 at once, then 0.33/s. 2 keys, 100 units: 2 * (15 + 0.33 t) = 100 -> t = 35 / 0.33.
    keys = [lim("15@0.33/s")] * 2
    assert time_for(keys, 30) == 0.0
    assert time_for(keys, 100) == pytest.approx(35 / 0.33, rel=1e-9)
    # 40 s of Kraken starter on 2 keys: 2 * (15 + 0.33 * 40) = 56.4 units at most.
    assert time_for(keys, 56.4) == pytest.approx(40.0, rel=1e-9)


def test_the_tightest_policy_of_a_budget_binds():
    # 10/1s and 30/5s: by t=4, the sliding 10/1s allows 50, the 30/5s only 30; 45 units need t = 5.
    assert time_for([lim("10/1s", "30/5s")], 45) == pytest.approx(5.0)
    # a bucket beside a window: 5@1/s and 100/1s -> the bucket: 5 + t >= 12 -> t = 7.
    assert time_for([lim("5@1/s", "100/1s")], 12) == pytest.approx(7.0)


def test_a_shared_budget_sets_the_pace_when_it_is_tighter_than_the_keys():
    # 5 keys x 20/1s (300 units: t = 2) under a host limit of 50/1s (300: t = 5).
    keys = [lim("20/1s")] * 5
    assert least_time([(keys, 300), ([lim("50/1s")], 300)]) == pytest.approx(5.0)
    # weights: 60 requests of weight 5 spend 300 of a 60/5s fixed weight budget that turns in 5 s:
    # 60 at 0, 120 at 5, ... 300 at 20; the keys (1 per request, 61000/5m) are not the limit.
    weight = lim("60/5s fixed", turns=(5.0,))
    assert least_time([([lim("61000/5m fixed")], 60), ([weight], 300)], rtt_s=0.1) == pytest.approx(20.1)


def test_nothing_to_do_takes_a_round_trip_and_a_cost_that_never_fits_takes_forever():
    assert least_time([([lim("10/1s")], 0)], rtt_s=0.02) == pytest.approx(0.02)
    assert least_time([]) == 0.0
    assert time_for([], 10) == 0.0
    assert math.isinf(time_for([Limits((parse_policy("1/1h"),))], 1e9))


def test_the_ratio_and_merging_parts():
    assert Makespan(600, 61.0, 58.1).ratio == pytest.approx(61.0 / 58.1)
    assert Makespan().ratio is None
    assert merge_makespans([None, None]) is None
    merged = merge_makespans([Makespan(10, 5.0, 4.0), None, Makespan(20, 6.0, 3.0)])
    assert merged == Makespan(30, 6.0, 4.0)


def test_from_where_a_budget_stands_what_is_free_goes_at_once_then_each_policy_s_refill():
    # a bucket of 10 refilling 10/s with 4 free: 4 at once, then 10 a second
    bucket = parse_policy("10@10/s")
    assert policy_allows(bucket, 0.0, None, 4.0) == pytest.approx(4.0)
    assert policy_allows(bucket, 1.0, None, 4.0) == pytest.approx(14.0)
    # a headroom of 0.1 s keeps what the bucket refills in 0.1 s free: one unit fewer
    assert policy_allows(bucket, 1.0, None, 4.0, 0.1) == pytest.approx(13.0)
    # a sliding 10/1s with 4 free, the 6 it counts back in 0.5 s: 4, 10 at 0.5, 14 at 1, 20 at 1.5
    sliding = parse_policy("10/1s")
    assert [policy_allows(sliding, t, 0.5, 4.0) for t in (0.0, 0.5, 1.0, 1.5)] == [4, 10, 14, 20]
    # with a headroom of 0.2 s each slot comes back 1.2 s after it went
    assert [policy_allows(sliding, t, 0.5, 4.0, 0.2) for t in (1.0, 1.2)] == [10, 14]
    # a fixed 10/2s with 3 left in its window, turning in 0.5 s: 3, then 10 at each turn
    fixed = parse_policy("10/2s fixed")
    assert [policy_allows(fixed, t, 0.5, 3.0) for t in (0.4, 0.5, 2.5)] == [3, 13, 23]
    # two keys side by side, 4 and nothing free, 10/s each: 24 units take 1 s
    keys = [Limits((bucket,), (), (4.0,)), Limits((bucket,), (), (0.0,))]
    assert time_for(keys, 24) == pytest.approx(1.0)
    # a fresh start is the whole limit at once, as before
    assert policy_allows(sliding, 0.0) == policy_allows(sliding, 0.0, None, 10.0) == 10


def test_a_limiter_says_where_it_stands_without_moving():
    from ratedeck.engine.limits.limiter import WindowLimiter

    lim = WindowLimiter((parse_policy("10/1s"), parse_policy("10@5/s")), lambda: 0.0, pacing="burst")
    for t in (0.0, 0.2, 0.2):
        lim.record(t)
    # sliding: 7 free, the oldest send back at 1.0; the bucket: 10 - 3 + 5 x 0.4 = 9 free
    (free, back), (level_free, none) = lim.standing(0.4)
    assert free == 7 and back == pytest.approx(0.6)
    assert level_free == pytest.approx(9.0) and none is None
    # with a headroom of 0.1 s the slots come back 0.1 s later
    assert lim.standing(0.4, 0.1)[0] == (7, pytest.approx(0.7))
    # after the window: everything back
    assert lim.standing(1.5)[0] == (10, None) and lim.standing(0.4)[0][0] == 7
