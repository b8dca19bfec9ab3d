"""Weighted sliding windows, fixed windows and leaky buckets, exact to the server's own rule.

Each test plays a client that sends whenever the limiter allows against a
model of the server that counts arrivals, which reach it after a random
one-way delay in [0, d]. With headroom d the server must refuse nothing, and
the client must get nearly everything the server allows.
"""

from __future__ import annotations

import math
import random

import pytest

from ratedeck.core.policy import parse_policy
from ratedeck.engine.limits.limiter import WindowLimiter


def server_sliding(limit, window):
    arrivals = []

    def admit(t, cost):
        used = sum(c for a, c in arrivals if a > t - window)
        if used + cost > limit:
            return False
        arrivals.append((t, cost))
        return True

    return admit


def server_fixed(limit, window):
    used = {}

    def admit(t, cost):
        k = math.floor(t / window)
        if used.get(k, 0) + cost > limit:
            return False
        used[k] = used.get(k, 0) + cost
        return True

    return admit


def server_bucket(limit, rate):
    state = {"level": 0.0, "at": 0.0}

    def admit(t, cost):
        level = max(0.0, state["level"] - rate * (t - state["at"]))
        if level + cost > limit + 1e-9:  # float noise at the exact edge is not a refusal
            return False
        state["level"], state["at"] = level + cost, t
        return True

    return admit


def play(limiter, admit, *, delay, duration, costs, seed=1, delays=None):
    """Send as fast as the limiter allows; deliver each send in arrival order to `admit`.

    Each send reaches the server after a random delay in [0, delay], or after
    `delays(i)` when given (an adversarial network).
    """
    rng = random.Random(seed)
    t, i, sends = 0.0, 0, []
    while True:
        cost = costs[i % len(costs)]
        t = limiter.next_free(t, cost)
        if t >= duration:
            break
        limiter.record(t, cost)
        sends.append((t + (delays(i) if delays else rng.uniform(0, delay)), cost))
        i += 1
    sends.sort()
    refused = [s for s in sends if not admit(*s)]
    return sum(c for _, c in sends), len(refused)


@pytest.mark.parametrize("costs", [[1], [1, 5, 2, 20, 1, 1]])
def test_a_weighted_sliding_window_never_overruns_and_fills_the_window(costs):
    lim = WindowLimiter((parse_policy("120/10s"),), lambda: 0.05, pacing="burst")
    spent, refused = play(lim, server_sliding(120, 10.0), delay=0.05, duration=60.0, costs=costs)
    assert refused == 0
    assert spent >= 0.97 * 120 * 6  # six windows, less the headroom at each turn


def test_a_fixed_window_turns_at_the_clock_and_charges_a_send_that_may_cross_the_boundary():
    lim = WindowLimiter((parse_policy("100/10s fixed"),), lambda: 0.2, pacing="burst")
    spent, refused = play(lim, server_fixed(100, 10.0), delay=0.2, duration=60.0, costs=[1, 3])
    assert refused == 0
    assert spent >= 0.95 * 100 * 6


def test_fixed_windows_follow_the_wall_clock_not_the_loop_clock():
    # The loop clock starts at 0 at Unix time 1_000_003: the first window ends 7 s in.
    lim = WindowLimiter((parse_policy("5/10s fixed"),), lambda: 0.0, pacing="burst", wall_offset=1_000_003.0)
    for _ in range(5):
        lim.record(lim.next_free(0.0))
    assert lim.next_free(0.0) == pytest.approx(7.0)


def test_a_leaky_bucket_allows_its_burst_then_its_drain_rate():
    lim = WindowLimiter((parse_policy("15@0.33/s"),), lambda: 0.1)  # never paced: the burst is allowed
    spent, refused = play(lim, server_bucket(15, 0.33), delay=0.1, duration=60.0, costs=[1, 1, 2])
    assert refused == 0
    allowed = 15 + 0.33 * 60
    assert spent >= allowed - 3


def test_headroom_too_small_for_the_network_is_caught_by_the_server_model():
    # The worst network for a bucket: the opening burst is held up for 1 s while the
    # sends after it arrive at once, so they all land together. Without headroom for
    # that spread the server refuses some; with it, none. (So the model can fail.)
    def burst_late(i):
        return 1.0 if i < 15 else 0.0

    lim = WindowLimiter((parse_policy("15@3/s"),), lambda: 0.0)
    _, refused = play(lim, server_bucket(15, 3.0), delay=1.0, duration=10.0, costs=[1], delays=burst_late)
    assert refused > 0
    safe = WindowLimiter((parse_policy("15@3/s"),), lambda: 1.0)
    assert play(safe, server_bucket(15, 3.0), delay=1.0, duration=10.0, costs=[1], delays=burst_late)[1] == 0


def test_sync_takes_the_servers_higher_count_and_its_reset():
    lim = WindowLimiter((parse_policy("60/10s fixed"),), lambda: 0.0, pacing="burst")
    # Another client used 36 of 60 (a token 60% used); the window ends at 4.0.
    lim.sync(1.0, remaining=24, limit=60, reset_at=4.0)
    sent = 0
    while lim.next_free(1.0) <= 1.0:
        lim.record(1.0)
        sent += 1
    assert sent == 24 and lim.next_free(1.0) == pytest.approx(4.0)
    # A lower count from the server (an answer from before our sends) changes nothing.
    lim.sync(1.5, remaining=50, limit=60)
    assert lim.next_free(1.5) == pytest.approx(4.0)


def test_sync_on_a_sliding_window_counts_what_someone_else_spent():
    lim = WindowLimiter((parse_policy("10/1s"),), lambda: 0.0, pacing="burst")
    lim.sync(0.0, used=8)
    granted = 0
    while lim.next_free(0.0) <= 0.0:
        lim.record(0.0)
        granted += 1
    assert granted == 2


def test_sends_whose_slots_freed_while_an_answer_was_on_its_way_are_not_someone_else_s():
    # 20/1s, a send every 50 ms from 0, each slot freeing 10 ms after its window (its answer's
    # own bound). The 21st goes at 1.02 and its answer comes back at 1.12 saying the server
    # counted 20 when it arrived: all ours. By then the slots of the sends at 0, 0.05 and 0.1
    # had freed and left our count; they were in the server's, not someone else's.
    lim = WindowLimiter((parse_policy("20/1s"),), lambda: 0.05, pacing="burst")
    for i in range(20):
        lim.record(i * 0.05).extra = 0.01
    assert lim.next_free(1.02) <= 1.02
    lim.record(1.02).extra = 0.01
    assert lim.next_free(1.12) <= 1.12  # three slots freed (and left our count) by then
    assert lim.sync(1.12, used=20, sent_at=1.02) == 0
    # Someone else's sends still show: the server counting 23 is 2 beyond all 21 of ours.
    assert lim.sync(1.12, used=23, sent_at=1.02) == 2


def test_what_a_window_counts_after_a_time_is_its_entries_after_it_with_ghosts_anywhere():
    # `spent_after` stops at the first of our sends after `start`; the ghosts someone else's
    # use left (`absorb`, at the left, out of send order) count whenever they are after it.
    rng = random.Random(7)
    for _ in range(200):
        lim = WindowLimiter((parse_policy("30/1s"),), lambda: 0.02, pacing="burst")
        meter = lim._meters[0]
        t = 0.0
        for _ in range(rng.randrange(1, 80)):
            t += rng.uniform(0.0, 0.08)
            if rng.random() < 0.1:
                meter.absorb(rng.randrange(1, 4), t + rng.uniform(0.0, 1.5))
            elif lim.next_free(t) <= t:
                lim.record(t).extra = rng.uniform(0.0, 0.05)
        for start in (t - 2.0, t - 1.0, t - 0.5, t - 0.05, t):
            plain = sum(spent for stamp, spent in meter.entries if stamp.t > start)
            assert meter.spent_after(start) == plain


def test_a_cost_larger_than_the_limit_never_fits():
    lim = WindowLimiter((parse_policy("10/1s"),), lambda: 0.0)
    assert lim.next_free(0.0, cost=11) == math.inf


def test_policies_of_every_kind_round_trip_as_text():
    from ratedeck.core.policy import format_policy

    for text in ["20/1s", "5000/1h fixed", "15@0.33/s", "6000/1m fixed", "1/1.0005s", "20@0.5/s"]:
        assert format_policy(parse_policy(text)) == text
