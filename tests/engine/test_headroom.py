"""HeadroomController: learn from spread, widen at once, narrow slowly, budget rules."""

import random

import pytest

from ratedeck.engine.limits.headroom import (
    MEASURED_PACE,
    PROBE_FEW,
    HeadroomController,
    RangeTracker,
    SecondsRange,
    SpreadEvidence,
)


def feed(h, n, start, rtt, spacing=0.01):
    t = start
    for _ in range(n):
        h.observe_rtt(rtt(), t)
        t += spacing
    return t


def test_learns_from_spread_not_mean():
    rng = random.Random(3)
    # Slow but steady: 400 ms +- 2 ms. The study's rule (mean x 1.1, clamped 30..50)
    # would hold 50 ms; the spread says a few ms are enough.
    h = HeadroomController(initial_ms=100, narrow_ms_per_s=1000)
    feed(h, 600, 0.0, lambda: 0.4 + rng.uniform(-0.002, 0.002))
    assert h.value_ms < 5
    # Jittery: 0..100 ms round trips. Needs about half the spread, with margin.
    h = HeadroomController(initial_ms=10, narrow_ms_per_s=1000)
    feed(h, 600, 0.0, lambda: rng.uniform(0.0, 0.1))
    assert 50 <= h.value_ms <= 75


def test_widens_at_once_on_rejection_and_narrows_slowly():
    rng = random.Random(4)
    h = HeadroomController(initial_ms=60, narrow_ms_per_s=10, rejection_budget=5)
    t = feed(h, 200, 0.0, lambda: rng.uniform(0.0, 0.1))
    before = h.value_ms
    h.observe_rejection(t)
    assert h.value_ms >= before * 1.5 - 1e-9
    widened = h.value_ms
    t2 = feed(h, 100, t, lambda: rng.uniform(0.0, 0.1), spacing=0.01)  # 1 s later
    assert widened - h.value_ms <= 10 * (t2 - t) + 1e-6  # at most 10 ms per second


def test_zero_budget_never_probes_below_the_evidence_or_a_rejection_floor():
    rng = random.Random(5)
    h = HeadroomController(initial_ms=100, narrow_ms_per_s=50, rejection_budget=0)
    t = feed(h, 3000, 0.0, lambda: rng.uniform(0.0, 0.1))
    evidence = h.target_ms
    assert h.value_ms >= evidence - 1e-9
    h.observe_rejection(t)
    floor = h.value_ms
    feed(h, 5000, t, lambda: rng.uniform(0.0, 0.1))  # 50 clean seconds
    assert h.value_ms == pytest.approx(floor)


def test_a_budget_allows_probing_below_the_evidence():
    rng = random.Random(6)
    h = HeadroomController(initial_ms=100, min_ms=0.0, narrow_ms_per_s=50, rejection_budget=3)
    t = feed(h, 6000, 0.0, lambda: rng.uniform(0.0, 0.1))  # 60 clean seconds
    # Answered slots take the prober's cap; the fallback stays with the evidence.
    assert h.budget.cap_ms < h.target_ms <= h.value_ms
    assert h.extra_for(0.1, t) * 1000 <= h.budget.cap_ms + 1e-9
    assert h.source == "budget probing"


def test_fixed_override_and_back_to_adaptive():
    rng = random.Random(7)
    h = HeadroomController(initial_ms=100, narrow_ms_per_s=1000)
    h.set_fixed(12)
    t = feed(h, 300, 0.0, lambda: rng.uniform(0.0, 0.1))
    h.observe_rejection(t)
    assert (h.value_ms, h.adaptive) == (12, False)  # the operator's value holds
    h.set_adaptive()
    feed(h, 50, t, lambda: rng.uniform(0.0, 0.1))
    assert h.adaptive and h.value_ms > 40


def test_bounds_hold():
    h = HeadroomController(initial_ms=900, min_ms=20, max_ms=300)
    assert h.value_ms == 300
    for i in range(10):
        h.observe_rejection(float(i))
    assert h.value_ms == 300


def settled(rtts, rng_seed=1, seconds=6.0):
    """A controller fed `rtts()` for a few seconds of evidence at 100 answers/s."""
    h = HeadroomController(initial_ms=100)
    t, step = 0.0, 0.01
    while t < seconds:
        h.observe_rtt(rtts(), t)
        t += step
    return h, t


def test_per_request_extra_bounds_how_late_the_server_stamped_it():
    rng = random.Random(8)
    # One-sided: 1 ms round trips with rare 15 ms queueing spikes on the way in.
    h, t = settled(lambda: 0.015 if rng.random() < 0.01 else 0.001 + rng.uniform(0, 0.0005))
    assert h.extra_for(0.001, t) * 1000 < 3  # a fast answer frees its slot almost at once
    spike = h.extra_for(0.015, t) * 1000
    assert spike >= 14  # the spike's own slot waits out the whole spike
    assert h.target_ms < 14  # which the symmetric estimate would under-cover


def test_two_sided_jitter_caps_extras_by_the_symmetric_estimate():
    rng = random.Random(9)
    h, t = settled(lambda: rng.uniform(0, 0.05) + rng.uniform(0, 0.05))  # the study's server's legs
    cap = max(h.value_ms, h.target_ms)
    assert h.extra_for(0.090, t) * 1000 <= cap + 1e-9
    assert h.extra_for(0.030, t) * 1000 < cap
    assert h.extra_for(0.0999, t) * 1000 <= cap + 1e-9


def test_unsettled_extras_keep_the_fallback_and_a_fixed_headroom_has_none():
    h = HeadroomController(initial_ms=100)
    for i in range(50):
        h.observe_rtt(0.01, i * 0.01)
    assert h.extra_for(0.01, 0.5) * 1000 >= h.value_ms  # unsettled: at least the fallback in force
    h, t = settled(lambda: 0.01)
    assert h.extra_for(0.01, t) is not None
    h.set_fixed(20)
    assert h.extra_for(0.01, t) is None and h.effective_ms == 20


def test_an_unsettled_slot_takes_a_ready_probe_s_cap_not_the_whole_round_trip():
    # Round trips carry 20..80 ms of server time; the probe sees the network alone (10..90 ms).
    rng = random.Random(3)
    h = HeadroomController(initial_ms=100)
    t = 0.0
    for _ in range(60):
        h.observe_network(rng.uniform(0.005, 0.045) + rng.uniform(0.005, 0.045), t)
        t += 0.02
    for _ in range(150):
        h.observe_rtt(rng.uniform(0.005, 0.045) + rng.uniform(0.02, 0.08) + rng.uniform(0.005, 0.045), t)
        t += 0.02
    first = h.evidence.first_t
    assert first is not None and t - first < h.bound_settle_s  # rtt_min is not trusted yet
    assert h.source == "probe"
    cap = h.value_ms + h.margin_ms
    assert 35 <= h.value_ms <= 50
    assert h.extra_for(0.160, t) * 1000 == pytest.approx(cap)  # its own bound would be ~130 ms
    assert h.extra_for(0.035, t) * 1000 >= h.value_ms  # and never under the fallback


def test_an_unsettled_slot_keeps_its_own_bound_on_few_answers():
    # 40 answers are too few for the symmetric estimate to hold a slot: its own bound stands.
    rng = random.Random(4)
    h = HeadroomController(initial_ms=100)
    t = feed(h, 40, 0.0, lambda: rng.uniform(0.001, 0.005) + rng.uniform(0.001, 0.005), spacing=0.1)
    assert h.value_ms < 10
    assert h.extra_for(0.060, t) * 1000 >= 50


def test_a_hinted_cap_covers_a_legs_whole_spread_from_the_first_seconds():
    # Two continuous legs of 5..45 ms and 20..80 ms of server time, told on every answer at
    # 100 a second: a slot in the body takes the hinted cap, which must cover a leg's whole
    # spread (40 ms: the way in at 45 ms, the next at 5). Cut at the body's 99th percentile
    # it held in about 82 runs of 100 (at 37-39 ms), and at 2.5 s in about 81; at the 99.9th
    # with the mean shortfall's correction alone, at 2.5 s in 91.
    held = {2.5: 0, 10.0: 0}
    for seed in range(100):
        rng = random.Random(seed)
        h = HeadroomController(initial_ms=100)
        t = 0.0
        for until in held:
            while t < until:
                server = rng.uniform(0.02, 0.08)
                h.observe_rtt(rng.uniform(0.005, 0.045) + rng.uniform(0.005, 0.045) + server, t, server)
                t += 0.01
            cap = h._cap_ms(h.evidence.net.spread * 1000)
            held[until] += cap is not None and cap >= 40
    assert held[10.0] == 100
    assert held[2.5] >= 97  # on 150..250 answers: widened as the probe's range on few


def test_whole_round_trips_part_from_the_network_s_once_hints_arrive():
    # Without hints the two are the same samples (one tracker is fed); the first usable hint
    # splits them, and each keeps what it had seen before.
    h = HeadroomController()
    t = 0.0
    for i in range(200):
        t += 0.01
        h.observe_rtt(0.100 + (i % 5) * 0.010, t)
    assert h.rtt_spread_ms == pytest.approx(40.0)
    assert h.network_spread_ms is None
    for i in range(400):
        t += 0.01
        # 120..200 ms round trips, of which 60..100 ms is the server's: the network's 60..100.
        h.observe_rtt(0.120 + (i % 5) * 0.020, t, server_s=0.060 + (i % 5) * 0.010)
    assert h.rtt_spread_ms == pytest.approx(100.0)  # whole round trips, 100 (before the hints) .. 200
    assert h.network_spread_ms == pytest.approx(80.0)  # 60 .. 140 (the hint-less ones still in the window)


def test_whole_round_trips_are_tracked_alike_before_and_after_the_first_usable_hint():
    # Until a hint is used the whole round trips share the network's tracker; from the
    # first one they part, and both hold what a tracker of their own samples would (the
    # whole round trips their range: it is read for display alone, so it keeps no body).
    rng = random.Random(3)
    evidence = SpreadEvidence(1, 0.5, 1.2, 1.1)
    raw, net = RangeTracker(1), RangeTracker(1)
    for i in range(600):
        now = i * 0.005
        rtt = 0.06 + rng.random() * 0.1
        server = 0.02 + rng.random() * 0.03 if i >= 300 else None  # hints from halfway
        evidence.observe(rtt, now, server, None)
        raw.add(rtt, now)
        net.add(rtt - server if server is not None else rtt, now)
        if i == 299:
            assert evidence.raw is evidence.net
    assert evidence.raw is not evidence.net
    for mine, theirs in ((evidence.raw, raw), (evidence.net, net)):
        assert (mine.n, mine.lo, mine.hi, mine.spread) == (theirs.n, theirs.lo, theirs.hi, theirs.spread)
    assert evidence.net.mean == net.mean and evidence.net.body_hi == net.body_hi
    assert isinstance(evidence.raw, SecondsRange)  # its range alone: no body, no mean
    assert evidence.raw.hi != evidence.net.hi


@pytest.mark.parametrize("first", [0, 1, 250])
def test_a_range_alone_holds_what_a_whole_tracker_s_range_does(first):
    # `SecondsRange` goes on from a tracker's samples (none, one, or several seconds of them),
    # through quiet spells of several seconds, and holds the range a tracker fed the same holds.
    rng = random.Random(first)
    start, whole = RangeTracker(2), RangeTracker(2)
    now = 0.0
    for _ in range(first):
        now += rng.expovariate(50.0)
        x = rng.uniform(0.05, 0.2)
        start.add(x, now)
        whole.add(x, now)
    alone = start.range_only()
    for i in range(2_000):
        now += rng.expovariate(50.0) + (3.5 if i % 500 == 499 else 0.0)
        x = rng.uniform(0.05, 0.2) + (0.3 if i % 97 == 0 else 0.0)
        alone.add(x, now)
        whole.add(x, now)
        assert (alone.n, alone.lo, alone.hi, alone.spread) == (whole.n, whole.lo, whole.hi, whole.spread)


def _hinted(rng):
    """A round trip of 5..45 ms each way around 20..80 ms of server time, and that time."""
    server = rng.uniform(0.02, 0.08)
    return rng.uniform(0.005, 0.045) + server + rng.uniform(0.005, 0.045), server


def test_hints_on_every_answer_are_believed_from_the_first_answers():
    # The share of answers with a usable hint is a plain one at first: a moving share from 0
    # took 230 answers (2-3 s at 100/s) to reach HINTED, and the slots meanwhile paid for the
    # whole round trips' spread at the safety for mixed evidence.
    rng = random.Random(5)
    h = HeadroomController(initial_ms=100)
    for i in range(20):
        rtt, server = _hinted(rng)
        h.observe_rtt(rtt, i * 0.01, server_s=server)
    assert h.evidence.hint_share == 1.0
    assert h.evidence.target_source == "hints" and h.evidence.target_direct
    rtt, _ = _hinted(rng)
    h.observe_rtt(rtt, 0.2)  # an answer without a hint: the share falls by one in 21
    assert h.evidence.hint_share == pytest.approx(20 / 21)


def test_the_pace_shortens_while_the_headroom_stands_on_measurement():
    # The server's time, a probe or a rejection budget measure the headroom: the even pace
    # would only hold back sends the windows allow. Round trips alone (a guess), a fixed
    # headroom, or a budget spent to its last rejection keep the whole pace.
    rng = random.Random(5)
    hinted, plain, probed = (HeadroomController(initial_ms=100) for _ in range(3))
    budgeted = HeadroomController(initial_ms=100, rejection_budget=3)
    assert hinted.figures.pace_scale == plain.figures.pace_scale == 1.0
    for i in range(60):
        rtt, server = _hinted(rng)
        probed.observe_network(rng.uniform(0.005, 0.045) + rng.uniform(0.005, 0.045), i * 0.01)
        for h in (hinted, plain, probed, budgeted):
            h.observe_rtt(rtt, i * 0.01, server_s=server if h is hinted else None)
    assert hinted.evidence.target_source == "hints" and hinted.figures.pace_scale == MEASURED_PACE < 1.0
    assert probed.source == "probe" and probed.figures.pace_scale == MEASURED_PACE
    assert budgeted.figures.pace_scale == MEASURED_PACE
    assert plain.source == "round trip" and plain.figures.pace_scale == 1.0
    hinted.set_fixed(30.0)
    assert hinted.figures.pace_scale == 1.0
    hinted.set_adaptive()
    assert hinted.figures.pace_scale == MEASURED_PACE
    for _ in range(2):  # the budget spent to its last rejection: probing ends, the pace is whole
        budgeted.observe_rtt(0.1, 0.7, rejected=True)
    assert not budgeted.budget.active
    budgeted.observe_rtt(0.1, 0.71)
    assert budgeted.figures.pace_scale == 1.0


def test_a_hundred_hinted_answers_settle_the_first_guess_before_settle_s():
    rng = random.Random(6)
    hinted, plain = HeadroomController(initial_ms=100), HeadroomController(initial_ms=100)
    for i in range(120):  # 1.2 s at 100 answers/s
        rtt, server = _hinted(rng)
        hinted.observe_rtt(rtt, i * 0.01, server_s=server)
        plain.observe_rtt(rtt, i * 0.01)
    assert hinted.source == "hints" and hinted.value_ms < 60  # then narrows slowly to the target
    # Whole round trips alone are no direct estimate: their first guess holds for settle_s.
    assert plain.value_ms > 85 and plain.value_ms > plain.target_ms


def test_slots_answered_under_the_first_guess_take_the_settled_bound():
    from ratedeck.engine.limits.limiter import Stamp

    rng = random.Random(7)
    h = HeadroomController(initial_ms=100)
    early = []
    t = 0.0
    for _ in range(99):  # one answer short of settling
        rtt, server = _hinted(rng)
        h.observe_rtt(rtt, t, server_s=server)
        stamp = Stamp(t - rtt)
        h.assign((stamp,), rtt, t, server_s=server)
        early.append((stamp, rtt, server))
        t += 0.01
    assert all(s.extra * 1000 >= 90 for s, _, _ in early)  # the guess, narrowing 10 ms a second
    rtt, server = _hinted(rng)
    h.observe_rtt(rtt, t, server_s=server)  # the 100th: the evidence replaces the guess
    assert h.value_ms < 60
    # Each early slot now holds what an answer arriving now gets, its own bound capped.
    for stamp, rtt, server in early:
        assert stamp.extra == h.extra_for(rtt, t, server)
    assert max(s.extra for s, _, _ in early) * 1000 <= h.value_ms + h.margin_ms + 1e-9
    assert not h._early_slots  # held only until the guess is replaced


def test_a_probe_range_on_few_samples_is_widened_to_a_high_quantile_of_its_shortfall():
    # Legs of 0..40 ms each way: one leg's whole spread, 40 ms, is what the probe's cap
    # (half the range, x1.05, +1 ms) must cover, from the 50 samples that make it ready.
    rng = random.Random(1)
    covered = {0: 0, PROBE_FEW: 0}
    for _ in range(500):
        r = RangeTracker(60)
        for i in range(50):
            r.add(rng.uniform(0, 0.04) + rng.uniform(0, 0.04), i * 0.05)
        for few in covered:
            covered[few] += r.sampled(r.spread, few) * 1000 * 0.5 * 1.05 + 1 >= 40
    assert covered[0] < 0.9 * 500  # the mean shortfall's correction alone: short in 1 run of 6
    assert covered[PROBE_FEW] >= 0.95 * 500
    # From `few` samples on, the mean's correction alone.
    for i in range(PROBE_FEW - 50):
        r.add(rng.uniform(0, 0.04) + rng.uniform(0, 0.04), 2.5 + i * 0.05)
    assert r.in_window == PROBE_FEW and r.sampled(r.spread, PROBE_FEW) == r.sampled(r.spread)


def test_the_budget_prober_refines_from_the_last_clean_cap_a_stretch_a_step():
    from ratedeck.engine.limits.headroom import BudgetProber

    b = BudgetProber(10)
    stretch = 3.0
    b.step(0.0, stretch, 60.0)  # the evidence says 60 ms: the first trial is 48
    assert (b.phase, b.cap_ms) == ("descend", 48.0)
    b.step(3.0, stretch, 60.0)  # clean for a stretch: 48 holds, try 38.4
    assert b.hi == 48.0 and b.cap_ms == pytest.approx(38.4)
    b.spent += 1
    b.rejected(4.0)  # 38.4 drew a rejection: back to 48 itself, not above it
    assert (b.phase, b.cap_ms, b.hi, b.lo) == ("refine", 48.0, 48.0, pytest.approx(38.4))
    b.step(6.9, stretch, 60.0)
    assert b.cap_ms == 48.0  # a stretch is not over yet
    b.step(7.0, stretch, 60.0)  # one stretch at the clean cap: bisect
    assert b.cap_ms == pytest.approx((48.0 * 38.4) ** 0.5)  # 42.9
    b.step(10.0, stretch, 60.0)  # clean: 42.9 / 38.4 is within 20%, hold 5% above it
    assert b.phase == "hold" and b.cap_ms == pytest.approx(1.05 * (48.0 * 38.4) ** 0.5)
    b.spent += 1
    b.rejected(20.0)  # a rejection while holding steps up 10%
    assert b.cap_ms == pytest.approx(1.1 * 1.05 * (48.0 * 38.4) ** 0.5)


def _steady(h: HeadroomController, rtt_s: float, n: int = 300) -> float:
    """`n` answers of about `rtt_s` (+-10%), 10 a second; the time after them."""
    rng, t = random.Random(5), 0.0
    for _ in range(n):
        t += 0.1
        h.observe_rtt(rtt_s * rng.uniform(0.9, 1.1), t)
    return t


def test_a_late_answer_keeps_its_whole_bound_a_slow_one_in_a_long_window_does_not():
    # 100 ms round trips, 1 s windows: an answer back after 1.2 s is late (overdue, and out
    # over half a window: its request may have reached the server a second late, a SYN sent
    # twice): its slot keeps its own bound whole, beyond the most a headroom may be.
    fast = HeadroomController(initial_ms=50, policy_window_s=1.0)
    t = _steady(fast, 0.1)
    assert fast.extra_for(1.2, t) >= 1.05
    # 5 s answers in a minute's window (an LLM's): one of 25 s is slow, not late; it is
    # judged as any other answer, within the most a headroom may be.
    slow = HeadroomController(initial_ms=50, policy_window_s=60.0)
    t = _steady(slow, 5.0)
    assert slow.extra_for(25.0, t) <= slow.max_ms / 1000.0


def test_a_streamed_answer_is_timed_to_its_head_not_to_its_end():
    from ratedeck.engine.http.outcome import OK, Outcome
    from ratedeck.engine.limits.limiter import Stamp
    from ratedeck.engine.path.request_path import time_answer

    def extra(head_s: float | None, end_s: float) -> float | None:
        h = HeadroomController(initial_ms=50, policy_window_s=1.0)
        t = _steady(h, 0.1)
        stamp = Stamp(t)
        out = Outcome(OK, 200, latency_s=end_s)
        out.head_s = head_s
        time_answer(h, out, (stamp,), t + end_s)
        return stamp.extra

    # A stream whose head came in 0.1 s and whose end 20 s later holds its slot as an
    # answer of 0.1 s does, not as one of 20 s.
    assert extra(0.1, 20.0) == pytest.approx(extra(None, 0.1), abs=0.01)
    assert extra(None, 20.0) > 1.0
