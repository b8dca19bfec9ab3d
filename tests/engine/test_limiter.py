"""WindowLimiter: window semantics, several policies, pacing, live headroom."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratedeck.core.policy import Policy, PolicyError, parse_policy
from ratedeck.engine.limits.headroom import HeadroomNow
from ratedeck.engine.limits.limiter import WindowLimiter


def grant_all(lim, start, count):
    """Take `count` slots as early as the limiter allows; return the grant times."""
    t, times = start, []
    for _ in range(count):
        t = lim.next_free(t)
        lim.record(t)
        times.append(t)
    return times


def max_in_window(times, window):
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window + 1e-12:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_burst_pacing_allows_a_full_window_then_waits_window_plus_headroom():
    lim = WindowLimiter((Policy(20, 1.0),), lambda: 0.05, pacing="burst")
    times = grant_all(lim, 0.0, 21)
    assert times[:20] == [0.0] * 20
    assert times[20] == pytest.approx(1.05)


def test_even_pacing_spreads_sends_and_never_exceeds_the_window():
    lim = WindowLimiter((Policy(20, 1.0),), lambda: 0.05, pacing="even")
    times = grant_all(lim, 0.0, 200)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) == pytest.approx(1.05 / 20)
    # as the server counts: at most 20 in any window of 1 s, even in a closed window
    assert max_in_window(times, 1.0) <= 20
    assert times[20] - times[0] >= 1.05 - 1e-9


def test_several_policies_are_all_or_nothing():
    lim = WindowLimiter((Policy(5, 1.0), Policy(8, 10.0)), lambda: 0.0, pacing="burst")
    times = grant_all(lim, 0.0, 9)
    assert times[:5] == [0.0] * 5
    assert times[5:8] == [1.0, 1.0, 1.0]  # the 1 s window frees, the 10 s one still has room
    assert times[8] == pytest.approx(10.0)  # now the 10 s window binds
    assert max_in_window(times, 10.0) <= 8


def test_a_headroom_change_takes_effect_at_the_next_decision():
    headroom = [0.0]
    lim = WindowLimiter((Policy(2, 1.0),), lambda: headroom[0], pacing="burst")
    grant_all(lim, 0.0, 2)
    assert lim.next_free(0.0) == pytest.approx(1.0)
    headroom[0] = 0.3
    assert lim.next_free(0.0) == pytest.approx(1.3)


def test_used_counts_the_current_window():
    lim = WindowLimiter((Policy(10, 1.0),), lambda: 0.0, pacing="burst")
    for t in (0.0, 0.2, 0.9):
        lim.record(t)
    assert lim.used(1.0) == (2, 10)
    assert lim.used(0.95) == (3, 10)


@pytest.mark.parametrize(
    "text,limit,window",
    [
        ("20/1s", 20, 1.0),
        ("600/1m", 600, 60.0),
        ("5/500ms", 5, 0.5),
        ("100/s", 100, 1.0),
        ("1/1h", 1, 3600.0),
    ],
)
def test_parse_policy(text, limit, window):
    p = parse_policy(text)
    assert (p.limit, p.window_s) == (limit, window)
    assert parse_policy(str(p)) == p


@pytest.mark.parametrize("text", ["abc", "20", "0/1s", "20/0s", "20/1x", "-1/1s"])
def test_bad_policies_say_what_is_wrong(text):
    with pytest.raises(PolicyError, match="limit|count|window"):
        parse_policy(text)


def test_an_answered_slot_frees_by_its_own_extra_and_an_open_one_by_the_fallback():
    lim = WindowLimiter((Policy(2, 1.0),), lambda: 0.1, pacing="burst")
    a = lim.record(0.0)
    b = lim.record(0.0)
    assert lim.next_free(0.0) == pytest.approx(1.1)  # neither answered: fallback headroom
    a.extra = 0.002
    b.extra = 0.030
    assert lim.next_free(0.0) == pytest.approx(1.002)  # the head's own extra
    lim.record(1.002)
    assert lim.next_free(1.002) == pytest.approx(1.030)  # then the slow one's


def test_even_gap_may_run_a_little_short_so_late_timers_do_not_accumulate():
    lim = WindowLimiter((Policy(100, 1.0),), lambda: 0.0, pacing="even", min_spacing=0.9)
    t = 0.0
    times = []
    for _ in range(300):
        t = lim.next_free(t) + 0.0005  # every wake-up half a millisecond late
        lim.record(t)
        times.append(t)
    assert max_in_window(times, 1.0) <= 100
    assert times[-1] - times[0] < 3.0 + 0.05  # about 100/s, not 100 per 1.05 s


def test_with_slack_a_send_may_go_early_but_sends_still_average_one_a_gap():
    # 20/1s with no headroom: the even gap is 50 ms. With half a gap of slack a send may go
    # 25 ms after the last, but the pace's anchor moves on a whole gap each time, so a run
    # of sends that all go as early as they may still averages one a gap.
    lim = WindowLimiter((Policy(20, 1.0),), lambda: 0.0, "even", pace_slack=0.5)
    lim.record(0.0)
    assert lim.next_free(0.0) == pytest.approx(0.025)
    t, times = 0.0, [0.0]
    for _ in range(9):
        t = lim.next_free(t)
        lim.record(t)
        times.append(t)
    assert times[1] == pytest.approx(0.025)  # the first early send takes the slack
    assert times[-1] == pytest.approx(9 * 0.050 - 0.025)  # then one a gap: the slack spent once
    # A send that goes late moves the anchor to itself: no credit is kept for a pause.
    lim.record(2.0)
    assert lim.next_free(2.0) == pytest.approx(2.025)
    # Without slack, the gap is whole (as nonce-ordered targets keep it).
    strict = WindowLimiter((Policy(20, 1.0),), lambda: 0.0, "even")
    strict.record(0.0)
    assert strict.next_free(0.0) == pytest.approx(0.050)


def test_slack_lets_a_slot_that_frees_soon_after_another_be_reused_at_once():
    # 2 per 100 ms, no headroom: the even gap is 50 ms. Two answered slots whose bounds
    # differ (as per-request extras do) free 140 ms and 180 ms in, 40 ms apart where they
    # were sent 50 ms apart. A strict pace holds the second slot's reuse to a gap after the
    # first one's (190 ms), and every later reuse of that slot with it; with slack it goes
    # when its slot frees.
    def reuse(slack: float) -> float:
        lim = WindowLimiter((Policy(2, 0.1),), lambda: 0.0, "even", pace_slack=slack)
        a, b = lim.record(0.0), lim.record(0.05)
        a.extra, b.extra = 0.040, 0.030
        first = lim.next_free(0.1)
        assert first == pytest.approx(0.140)
        lim.record(first)
        return lim.next_free(first)

    assert reuse(0.0) == pytest.approx(0.190)  # held by the pace
    assert reuse(0.5) == pytest.approx(0.180)  # its slot's own time
    with pytest.raises(ValueError, match="pace_slack"):
        WindowLimiter((Policy(2, 1.0),), lambda: 0.0, "even", pace_slack=1.0)


def test_the_headroom_s_pace_scale_shortens_the_gap_only_where_a_send_may_go_early():
    # 20/1s, no headroom: the even gap is 50 ms, 45 at a spacing of 0.9, and with half a gap
    # of slack a send may go 22.5 ms after the last. While the headroom stands on measurement
    # it scales the gap (`MEASURED_PACE`); a nonce-ordered limiter (no slack) keeps its whole
    # gap whatever the headroom says.
    figures = HeadroomNow(0.0)
    lim = WindowLimiter(
        (Policy(20, 1.0),), lambda: 0.0, "even", min_spacing=0.9, pace_slack=0.5, headroom=figures
    )
    strict = WindowLimiter((Policy(20, 1.0),), lambda: 0.0, "even", headroom=figures)
    lim.record(0.0)
    strict.record(0.0)
    assert lim.next_free(0.0) == pytest.approx(0.0225)
    figures.pace_scale = 0.55
    assert lim.spacing() == pytest.approx(0.495)
    assert lim.next_free(0.0) == pytest.approx(0.5 * 0.495 * 0.050)
    assert lim.pace_due() == lim.next_free(0.0)
    assert strict.spacing() == 1.0 and strict.next_free(0.0) == pytest.approx(0.050)


def test_next_free_says_when_a_slot_comes_so_a_caller_knows_a_deadline_is_missed():
    """What the key workers ask: a full window's next slot comes when its oldest send
    leaves; a request due before then (its TTL) is known to miss it before anything waits."""
    lim = WindowLimiter((Policy(2, 1.0),), lambda: 0.0, pacing="burst")
    assert grant_all(lim, 0.0, 2) == [0.0, 0.0]
    assert lim.next_free(0.0) == pytest.approx(1.0)
    assert lim.next_free(0.5) > 0.5  # a deadline at 0.5 cannot be met: no slot taken
    assert lim.used(0.5)[0] == 2
    assert lim.next_free(1.5) == 1.5  # past the window: free at once
    lim.record(1.5)
    assert lim.used(1.5)[0] == 1


def test_a_heavy_send_waits_for_its_whole_cost_and_is_recorded_at_it():
    lim = WindowLimiter((Policy(4, 1.0),), lambda: 0.0, pacing="burst")
    lim.record(0.0, cost=3)
    assert lim.next_free(0.0, cost=1) == 0.0  # one unit left
    assert lim.next_free(0.0, cost=2) == pytest.approx(1.0)  # two must wait for the window
    lim.record(1.0, cost=2)
    assert lim.used(1.0)[0] == 2 and lim.spent == 5 and lim.sends == 2
    assert lim.next_free(1.0, cost=3) == pytest.approx(2.0)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.05), st.integers(1, 3), st.floats(0.001, 0.3), st.floats(0.0, 0.02)),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([(1.0, 0.0, 1.0), (0.9, 0.0, 0.55), (0.9, 0.5, 1.0), (0.9, 0.5, 0.55)]),
)
def test_the_pace_due_is_a_bound_next_free_never_beats_and_meets_when_the_pace_binds(steps, pace):
    """`pace_due` lets a worker skip the full look after an answer (`KeyWorker.wake_if_sooner`):
    it must never be later than `next_free`, and equal it whenever the pace is what binds."""
    spacing, slack, scale = pace
    figures = HeadroomNow(0.05)
    figures.pace_scale = scale

    def limiter() -> WindowLimiter:
        return WindowLimiter(
            (Policy(20, 1.0),), lambda: 0.05, "even", min_spacing=spacing, pace_slack=slack, headroom=figures
        )

    lim = limiter()
    t = 0.0
    for wait, cost, headroom_s, late in steps:
        figures.headroom_now_s, figures.pace_now_s = headroom_s, headroom_s / 2
        t += wait
        free = lim.next_free(t, cost)
        assert lim.pace_due() <= free
        lim.record(free + late, cost)
        t = free + late
    # the pace binds while the window has room: then the two agree to the bit (the same sum)
    lim = limiter()
    t = lim.next_free(0.0)
    for _ in range(10):
        lim.record(t)
        assert lim.next_free(t) == lim.pace_due() > t
        t = lim.next_free(t)
    # no even pace (bursts, or a fixed window): no bound
    assert WindowLimiter((Policy(20, 1.0),), lambda: 0.05, "burst").pace_due() == -math.inf
    assert WindowLimiter((parse_policy("20/1s fixed"),), lambda: 0.05, "even").pace_due() == -math.inf


def test_with_slack_a_fixed_window_s_anchor_moves_by_the_gap_next_free_saw():
    # A fixed window with quota to spare spreads it over the time left: its gap grows as quota
    # is spent. The anchor moves by the gap seen before a send is counted (the one `next_free`
    # used), not the one after it.
    lim = WindowLimiter((parse_policy("10/1s fixed"),), lambda: 0.0, "even", pace_slack=0.5)
    lim.record(0.5)  # mid-window: 9 left for the 0.5 s to its end, a gap of 0.5/9 s (not 0.1)
    t = lim.next_free(0.5)
    assert t == pytest.approx(0.5 + 0.5 * 0.5 / 9)  # half a gap early
    lim.record(t)
    anchor = 0.5 + (1.0 - t) / 9  # the whole gap at t, with 9 left
    assert lim.next_free(t) == pytest.approx(anchor + 0.5 * (1.0 - t) / 8)


class _Overdue(HeadroomNow):
    """Figures whose requests are overdue after `after` seconds out."""

    __slots__ = ("after",)

    def __init__(self, seconds: float, after: float):
        super().__init__(seconds)
        self.after = after

    def overdue_s(self) -> float:
        return self.after


def test_a_slot_still_out_past_its_time_is_held_until_its_request_ends():
    # 1 per 1 s, 50 ms of headroom. The request is still out at 1.05 s, its fallback time,
    # and overdue (out over 0.4 s): it may not have reached the server yet, so its slot
    # holds until the attempt ends. Answered at 1.2 s with its own bound, it frees by that.
    lim = WindowLimiter((Policy(1, 1.0),), lambda: 0.05, "burst", headroom=_Overdue(0.05, 0.4))
    first = lim.record(0.0)
    first.out = True
    assert lim.next_free(1.0) == pytest.approx(1.05)
    assert lim.next_free(1.1) == math.inf  # still out: held
    first.extra, first.out = 1.15, False  # answered at 1.2 s: it reached the server by then
    assert lim.next_free(1.2) == pytest.approx(2.15)
    # 2 per 1 s: a held slot keeps its place, the slots after it still leave at their time.
    two = WindowLimiter((Policy(2, 1.0),), lambda: 0.05, "burst", headroom=_Overdue(0.05, 0.4))
    held, answered = two.record(0.0), two.record(0.01)
    held.out, answered.extra = True, 0.02
    assert two.next_free(1.1) == 1.1  # the answered one's slot
    two.record(1.1)
    assert two.next_free(1.15) == pytest.approx(2.15)  # the last one's, not the held one's


def test_a_slot_out_but_not_overdue_or_never_sent_by_a_worker_frees_at_its_time():
    # Not overdue (a server whose round trips are long): the fallback holds, as before.
    slow = WindowLimiter((Policy(1, 1.0),), lambda: 0.05, "burst", headroom=_Overdue(0.05, 5.0))
    slow.record(0.0).out = True
    assert slow.next_free(0.5) == pytest.approx(1.05)
    assert slow.next_free(1.1) == 1.1
    # A send another run made (`seed_sends`) is not out: it is never held.
    seeded = WindowLimiter((Policy(1, 1.0),), lambda: 0.05, "burst", headroom=_Overdue(0.05, 0.4))
    seeded.record(0.0)
    assert seeded.next_free(1.1) == 1.1
