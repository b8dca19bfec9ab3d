"""A key's limit as an estimate that moves both ways: the pure estimate on a fake clock, and the
issue's three targets on the simulator's virtual clock (5 keys x 20/1s, 60 s, 5-45 ms of jitter
each way, 20-80 ms of server time)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratedeck.bench.sustained import run_sustained
from ratedeck.core.policy import Policy
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.estimate import (
    HOLD_NEVER_HELD_S,
    HOLD_S,
    PROBING,
    RECOVER_PROBES,
    RECOVER_WINDOWS,
    KeyEstimate,
)
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.path.key import COOL_CAP_S, COOL_FIRST_S, KeyLimits, Learning
from ratedeck.engine.path.settle import Tally
from ratedeck.engine.settings import EngineSettings, KeySpec
from ratedeck.server.rules import RateRules
from ratedeck.server.settings import ServerSettings, parse_other_load, standard_settings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

KEYS = tuple(f"key-00{i}" for i in range(5))


# -- the estimate alone (fake clock: every call is told the time)
def test_it_starts_at_the_told_limit_and_with_a_slow_start_probes_above_three_quarters_of_it():
    assert KeyEstimate(20, 1.0).confirmed == 20  # told: nothing to probe above
    est = KeyEstimate(20, 1.0, slow_start=True)
    assert (est.value, est.reason, est.moved_at) == (20, "told", None)
    assert est.confirmed == 15 < est.value  # a slow start: beyond 15 in a window, one at a time
    assert KeyEstimate(25, 1.0, slow_start=True).confirmed == 19  # rounded up
    est.confirm(17, plain=16)  # a slow start counts as the server does: the window alone
    assert est.confirmed == 16 < est.value
    est.confirm(26, plain=25)  # never above the estimate
    assert est.confirmed == est.value == 20
    told = KeyEstimate(20, 1.0)
    told.value, told.reason = 25, "climbing"  # a climb counts with the headroom, as the limiter
    told.confirm(22, plain=21)
    assert told.confirmed == 22


def test_a_slow_start_one_short_of_its_told_limit_for_five_windows_is_done():
    est = KeyEstimate(20, 1.0, slow_start=True)
    est.tick(0.0)
    est.confirm(20, plain=19)  # paced with a headroom, a window as the server counts it holds 19
    assert est.confirmed == 19
    est.tick(4.9)
    assert est.confirmed == 19
    est.tick(5.0)
    assert est.confirmed == est.value == 20
    wrong = KeyEstimate(25, 1.0, slow_start=True)
    wrong.tick(0.0)
    wrong.confirm(21, plain=20)
    wrong.tick(30.0)
    assert wrong.confirmed == 20  # 5 short of what it was told: not done, ever


class _Events:
    def event(self, kind, text) -> None:
        pass


def _slow_start_key() -> KeyLimits:
    """One key told 20/1s with a slow start, its limiter paced evenly, a fixed 5 ms headroom."""
    headroom = HeadroomController(fixed_ms=5.0)

    def make(policies):
        return WindowLimiter(policies, headroom.seconds)

    policies = (Policy(20, 1.0),)
    learning = Learning(budgets=Budgets(EngineSettings(), make), headroom=headroom, events=_Events())
    return KeyLimits(
        KeySpec("k1", "secret-k1", policies), make(policies), learning, max_in_flight=8, slow_start=True
    )


def _send(limits: KeyLimits, now: float) -> float:
    """Send at the first time the key's limits allow from `now` (as the worker does); its time."""
    at = max(now, limits.next_free(now))
    limits.limiter.record(at)
    limits.note_send(at)
    return at


def test_after_a_probe_the_sends_its_wait_held_back_go_at_once_within_the_confirmed_level():
    limits = _slow_start_key()
    est, sends = limits.estimate, limits.sends
    assert est is not None and est.confirmed == 15
    t = 0.0
    for _ in range(15):  # up to the confirmed level at the even pace (about 50 ms apart)
        t = _send(limits, t)
        assert not sends.probe_out
    probe_at = t = _send(limits, t)  # the 16th in the window goes alone
    assert sends.probe_out and round(t, 2) == 0.75
    t += 0.2  # its answer comes back a round trip later; nothing went meanwhile
    limits.judged(Tally.SUCCEEDED, probe_at, t)
    assert not sends.probe_out and est.confirmed == 16
    # The pace held back 4 sends (0.2 s at 20/s): they may go at once, not 50 ms apart, while
    # our count in the window (with the headroom) stays under the confirmed level. Here the
    # window still holds all 16, so the next send is the next probe, and it goes at once.
    assert sends.catch_up == 4 and limits.next_free(t) == t
    probe_at = _send(limits, t)
    assert probe_at == t and sends.probe_out
    t += 0.2
    limits.judged(Tally.SUCCEEDED, probe_at, t)
    assert est.confirmed == 17 and sends.catch_up == 4
    # Three of the first second's sends have left the widened window (14 in it, the two
    # probes among them): three go at once, up to the confirmed 17; the next waits for the
    # even pace again.
    burst = [_send(limits, t) for _ in range(3)]
    assert burst == [t] * 3 and limits._count_in_window(t) == 17 and not sends.probe_out
    assert sends.catch_up == 0 and limits.next_free(t) == pytest.approx(t + 1.005 / 20)


def test_without_a_probe_the_even_pace_holds():
    limits = _slow_start_key()
    t0 = _send(limits, 0.0)
    assert limits.next_free(t0) > t0  # the second send waits its gap
    assert limits.sends.catch_up == 0


def test_a_single_429_never_takes_it_below_half_the_told_limit():
    est = KeyEstimate(20, 1.0)
    est.confirm(20)
    moved, explained = est.rejected(sent_at=5.0, accepted=1, now=5.1)
    assert moved and explained
    assert (est.value, est.reason, est.moved_at) == (10, "lowered by a 429 at 20", 5.1)


def test_a_429_while_we_sent_below_the_estimate_is_timing_not_the_limit():
    est = KeyEstimate(20, 1.0)
    est.confirm(20)
    assert est.rejected(sent_at=5.0, accepted=20, now=5.1) == (False, False)
    assert est.rejected(sent_at=5.0, accepted=0, now=5.1) == (False, False)  # idle: no evidence
    assert est.value == 20


def test_echoes_of_a_lowering_move_nothing():
    est = KeyEstimate(20, 1.0)
    est.confirm(20)
    est.rejected(5.0, 12, 5.1)
    # Sent before the lowering, answered after it: the same evidence again.
    assert est.rejected(5.05, 11, 5.15) == (False, True)
    assert est.value == 12


def test_a_level_that_held_and_failed_is_probed_back_within_a_few_windows():
    est = KeyEstimate(20, 1.0)
    est.tick(0.0)
    est.confirm(20)
    est.rejected(10.0, 12, 10.1)  # 20 held for 10 s: someone else on the key, most likely
    assert (est.value, est.recover_to) == (12, 20)
    assert not est.tick(10.1 + RECOVER_WINDOWS - 0.1)  # still quiet
    t = 10.1 + RECOVER_WINDOWS
    # Straight back to the level that held; beyond the 12 that hold now, one at a time.
    assert est.tick(t) and (est.value, est.confirmed, est.reason) == (20, 12, "climbing back")
    for level in range(13, 21):
        est.confirm(level)  # they left: every probe goes through
    assert est.confirmed == 20 and est.reason == "climbed back"
    assert not est.tick(t + 1.0) and est.recover_to is None  # back: nothing left to recover


def test_a_probing_round_that_finds_them_still_there_goes_back_to_where_it_started():
    est = KeyEstimate(20, 1.0)
    est.tick(0.0)
    est.confirm(20)
    est.rejected(10.0, 12, 10.1)
    t = 10.1 + RECOVER_WINDOWS
    est.tick(t)
    est.confirm(15)  # a few probes went through in slots the other user had not taken yet
    moved, explained = est.rejected(t + 0.5, 15, t + 0.6)  # the next drew a 429
    assert moved and explained and (est.value, est.confirmed) == (12, 12)
    # Probed again every few windows, a window longer every third 429.
    holds = []
    for _ in range(6):
        now = est.quiet_until
        assert not est.tick(now - 0.01) and est.tick(now) and est.value == 20
        est.rejected(now + 0.1, 12, now + 0.2)
        holds.append(round(est.quiet_until - (now + 0.2), 6))
    assert holds == [2.0, 2.0, 3.0, 3.0, 3.0, 4.0]


def test_after_a_minute_of_failed_probes_they_are_held_longer_each_time():
    est = KeyEstimate(20, 1.0)
    est.tick(0.0)
    est.confirm(20)
    est.rejected(10.0, 12, 10.1)
    for _ in range(RECOVER_PROBES):
        now = est.quiet_until
        est.tick(now)
        est.rejected(now + 0.1, 12, now + 0.2)
    holds = []
    for _ in range(3):
        now = est.quiet_until
        assert est.tick(now) and est.value == 20
        est.rejected(now + 0.1, 12, now + 0.2)
        holds.append(round(est.quiet_until - (now + 0.2), 6))
    assert holds == [2 * HOLD_S, 4 * HOLD_S, 8 * HOLD_S]


def test_a_told_limit_that_was_wrong_climbs_one_step_per_window_after_a_long_hold():
    est = KeyEstimate(25, 1.0)
    est.tick(0.0)
    est.rejected(0.9, 20, 1.0)  # the 21st of ours in the first window drew it
    assert est.value == 20 and est.recover_to is None
    t = 1.0 + HOLD_NEVER_HELD_S
    values = []
    for step in range(8):
        est.tick(t + step)
        est.confirm(est.value)  # say the server now accepts every level
        values.append(est.value)
    assert values == [21, 22, 23, 24, 25, 25, 25, 25]
    assert est.reason == "climbed back" and est.moved_at == t + 4


def test_a_probe_that_draws_a_429_goes_back_and_is_held_longer_each_time():
    est = KeyEstimate(25, 1.0)
    est.tick(0.0)
    est.rejected(0.9, 20, 1.0)
    t = 1.0 + HOLD_NEVER_HELD_S
    assert est.tick(t) and est.value == 21 and est.confirmed == 20
    moved, _ = est.rejected(t + 0.5, 20, t + 0.6)  # the probe at 21 drew a 429
    assert moved and est.value == 20 and est.reason == "lowered by a 429 at 21"
    assert not est.tick(t + 0.6 + 2 * HOLD_S - 0.1)  # held twice as long
    assert est.tick(t + 0.6 + 2 * HOLD_S)
    est.rejected(t + 41, 20, t + 41.1)
    assert est.quiet_until == pytest.approx(t + 41.1 + 4 * HOLD_S)


def test_a_failed_probe_never_goes_below_what_a_probe_found_room_beside():
    est = KeyEstimate(25, 1.0, slow_start=True)
    est.tick(0.0)
    for level in range(14, 22):  # the limiter's count (with the headroom) runs ahead of the window's
        est.confirm(level, plain=level - 1)
    assert (est.confirmed, est.top_plain) == (20, 20)
    est.rejected(1.9, 19, 2.0)  # the count before the failed probe came out one short
    assert est.value == 20 and est.reason == "lowered by a 429 at 25"
    climbing = KeyEstimate(25, 1.0)
    climbing.value, climbing.reason, climbing.confirmed = 25, "climbing", 14
    for level in range(14, 22):
        climbing.confirm(level, plain=level - 1)
    assert (climbing.confirmed, climbing.top_plain) == (21, 20)
    climbing.rejected(1.9, 19, 2.0)
    assert climbing.value == 20  # the most a probe found room beside, not the count before it
    other = KeyEstimate(25, 1.0)
    other.value, other.reason, other.confirmed = 25, "climbing", 14
    other.confirm(21, plain=18)  # what a probe found room beside says less than the count here
    other.rejected(1.9, 19, 2.0)
    assert other.value == 19


def test_a_told_limit_that_never_held_is_not_probed_again_for_long():
    est = KeyEstimate(25, 1.0, slow_start=True)
    est.tick(0.0)
    est.confirm(21, plain=20)
    est.rejected(0.9, 20, 1.0)  # the 21st of ours in the first window drew it
    assert est.value == 20 and est.quiet_until == pytest.approx(1.0 + HOLD_NEVER_HELD_S)
    assert not est.tick(60.0)


def test_the_advertised_limit_caps_it_and_climbing_stops_at_the_lower_one():
    est = KeyEstimate(30, 1.0)
    assert est.advertise(20, 0.5)
    assert (est.value, est.reason, est.ceiling, est.confirmed) == (20, "advertised", 20, 20)
    assert not est.tick(5.0)  # at the ceiling: nothing to climb to
    assert KeyEstimate(None, 1.0, advertised=20).describe() == "20/1s (advertised)"


def test_probing_climbs_in_bigger_steps_and_says_so():
    est = KeyEstimate(40, 1.0, climb=PROBING)
    est.tick(0.0)
    est.rejected(0.9, 20, 1.0)  # told 40, never held
    est.tick(1.0 + HOLD_NEVER_HELD_S)
    assert est.value == 24 and est.climb == "probing"


def test_shared_is_a_share_of_the_window_not_a_lower_limit():
    est = KeyEstimate(20, 1.0)
    assert est.note_shared(8, 20, 3.0) and not est.note_shared(4, 20, 4.0)
    assert est.shared_share == 0.2 and est.value == 20


# -- the simulator's other user
def test_the_other_user_takes_slots_in_its_span_only_and_stays_out_of_the_stats():
    settings = replace(standard_settings(), keys=("k",), other_load="8/1s@1s-2s")
    rules = RateRules(settings)
    assert rules.decide("k", None, 0.0).status == 200  # the first request starts the clock
    # From 1 s to 2 s the other user took 8 slots (1000 ms, 1125 ms, ...): 12 more fit by 1.95 s.
    answers = [rules.decide("k", None, 1950.0 + i).status for i in range(13)]
    assert answers.count(200) == 12 and answers[-1] == 429
    keys = rules.stats()["keys"]
    assert keys[0]["other_accepted"] == 8 and keys[0]["accepted"] == 13
    # After its span the other user takes nothing more.
    rules.decide("k", None, 5000.0)
    assert rules.stats()["keys"][0]["other_accepted"] == 8


def test_the_other_user_waits_for_room_and_loses_nothing():
    settings = replace(standard_settings(), keys=("k",), other_load="8/1s@1s-2s")
    rules = RateRules(settings)
    assert rules.decide("k", None, 0.0).status == 200  # the first request starts the clock
    # Ours fill the window just before the other user comes: 19 more at 0.9 s.
    assert [rules.decide("k", None, 900.0).status for _ in range(20)].count(200) == 19
    # Its first (due at 1000 ms) takes the slot our first frees at 1000 ms; the next ones
    # (due 1125 ms, ...) wait for the slots ours at 900 ms free at 1900 ms, and all go then.
    assert rules.decide("k", None, 1899.0).status == 429  # nothing freed yet: full
    assert rules.stats()["keys"][0]["other_accepted"] == 1
    assert rules.decide("k", None, 1999.0).status == 200
    assert rules.stats()["keys"][0]["other_accepted"] == 8
    state = next(iter(rules._states.values()))
    assert state.rings[0].remaining(1999.0) == 20 - 8 - 1  # theirs, and ours at 1999 ms
    # All 8 taken; none after the span.
    rules.decide("k", None, 5000.0)
    assert rules.stats()["keys"][0]["other_accepted"] == 8


def test_a_bad_other_load_names_the_setting():
    with pytest.raises(ValueError, match="other_load"):
        parse_other_load("8/1s")
    with pytest.raises(ValueError, match="ends before it starts"):
        ServerSettings(other_load="8/1s@30s-10s")


# -- the targets, on virtual time
def _run(told: str, seed: int, slow_start: bool = False, **server_kw):
    server = replace(
        standard_settings(),
        keys=KEYS,
        policies=(Policy(20, 1.0),),
        latency_in_ms=(5, 45),
        latency_out_ms=(5, 45),
        processing_ms=(20, 80),
        seed=seed,
        **server_kw,
    )
    eng, transport = seed_engine(
        server=server,
        transport_kw={"seed": seed},
        keys={"secrets": list(KEYS), "limits": [told]},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "max_attempts": 20, "slow_start": slow_start},
        workload={"rate": 125.0},
        run={"seed": seed},
    )
    snap = run_virtual(eng.run(60))
    return snap, transport.rules


def _sustained(rules: RateRules) -> float:
    """The run as an independent server scores it (issue 44): per key, W / the mean gap
    between accepted arrivals i and i+N, from the simulator's own stamps; the mean over keys."""
    run = run_sustained([[t / 1000.0 for t in key] for key in rules.arrivals_ms()], 20, 1.0)
    assert run.mean is not None and run.scored == 5
    return run.mean


@pytest.mark.parametrize(
    ("seed", "slow_start", "least"), [(1, True, 0.908), (2, True, 0.908), (2, False, 0.89)]
)
def test_told_25_where_the_server_allows_20_and_escalates(seed, slow_start, least):
    # The first 429 costs the server's 1 s cooldown; with a slow start (a named target's
    # default) the sends above three quarters of the told limit go one at a time and the 429
    # comes alone; without, the sends in flight with it walk into that cooldown and escalate
    # it. Sustained efficiency at the time of writing, seeds 1-8: 0.910-0.915 with a slow
    # start, 5 429s and no send into a cooldown each (0.909-0.913 from half the told limit,
    # refilled at the even pace; 0.900-0.910 while it counted a window with the headroom),
    # 0.890-0.905 without.
    snap, rules = _run("25/1s", seed, slow_start, ratelimit_headers=False, escalation=True)
    stats = rules.stats()
    assert _sustained(rules) >= least
    assert snap.rejected_429 <= 60, snap.rejected_429
    assert stats["totals"]["requests_during_cooldown"] <= (1 if slow_start else 40), stats["totals"]
    assert {k.limit_estimate for k in snap.keys} <= {"19/1s", "20/1s"}


@pytest.mark.parametrize("seed", [1, 2])
def test_someone_else_takes_8_of_20_for_20_seconds_and_the_keys_recover(seed):
    snap, rules = _run("20/1s", seed, ratelimit_headers=False, retry_after=False, other_load="8/1s@10s-30s")
    stats = rules.stats()
    theirs = sum(k["other_accepted"] for k in stats["keys"])
    # They keep to the limit and lose nothing: a request of theirs that finds the windows
    # full waits for the next free slot ("left" counts what they got).
    assert theirs == 5 * 8 * 20, theirs
    left = 5 * 20 * 60 - theirs
    share = snap.succeeded / left
    # 0.900..0.905 at the time of writing (0.882..0.889 when the keys climbed one a window
    # after 20 s); sustained over our own stamps 0.777..0.781 (the slots they took are gaps).
    assert share >= 0.89, share
    assert _sustained(rules) >= 0.77
    assert snap.rejected_429 <= 150, snap.rejected_429
    # Lowered while they were there, back at once after they had gone: in the last 25 s every
    # key is at 20 again and has as many accepted as a key alone gets (18..19 a window).
    assert any("lowered by a 429 at 20" in e.text for e in snap.events)
    assert all(k.limit_estimate == "20/1s" for k in snap.keys), [k.limit_estimate for k in snap.keys]
    for key in rules.arrivals_ms():
        late = [t for t in key if t >= key[0] + 33_000]
        assert len(late) >= 18 * 25, len(late)


@pytest.mark.parametrize("seed", [1, 2])
def test_told_30_where_the_server_allows_20_and_says_so(seed):
    snap, rules = _run("30/1s", seed, ratelimit_headers=True)
    assert _sustained(rules) >= 0.92
    assert snap.rejected_429 <= 5, snap.rejected_429
    assert all(k.limit_estimate == "20/1s" and k.estimate_reason == "advertised" for k in snap.keys)


def test_a_shared_key_is_seen_in_the_servers_counts_and_said_everywhere():
    from ratedeck.runner.prometheus import families
    from ratedeck.runner.report import build_report

    server = replace(
        standard_settings(),
        keys=KEYS[:2],
        latency_in_ms=(5, 45),
        latency_out_ms=(5, 45),
        seed=3,
        other_load="8/1s@2s-8s",
    )
    eng, transport = seed_engine(
        server=server,
        transport_kw={"seed": 3, "read_counts": True},
        keys={"secrets": list(KEYS[:2])},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "max_attempts": 20},
        workload={"rate": 40.0},
    )
    snap = run_virtual(eng.run(30))
    assert any("shared: someone else used" in e.text for e in snap.events), [e.text for e in snap.events]
    assert all(k.shared_share is not None and 0 < k.shared_share <= 0.6 for k in snap.keys)
    # What is left is used, and the limit is not lowered for good (a 429 before the counts
    # showed the other user may lower it for a while; it climbs back).
    assert all(k.limit_estimate == "20/1s" for k in snap.keys), [k.limit_estimate for k in snap.keys]
    report = build_report(snap)
    k1 = report["keys"][0]
    assert k1["shared"].startswith("k1: someone else used ") and k1["shared"].endswith("% of this window")
    assert k1["limit_estimate"] == "20/1s" and k1["estimate_climb"] == "additive"
    names = {m.name: m for m in families(snap)}
    shared = names["ratedeck_key_shared_ratio"].samples
    assert {s.labels["key"] for s in shared} == {"k1", "k2"}
    estimate = names["ratedeck_key_limit_estimate"].samples
    assert [(s.labels["key"], s.value) for s in estimate] == [("k1", 20.0), ("k2", 20.0)]


# -- 429s in a row: the key cools off (fake clock)
def test_a_429_for_a_send_made_after_the_last_429_came_back_cools_the_key_off():
    limits = _slow_start_key()
    sends = limits.sends
    r429 = Tally.REJECTED_429
    assert limits.cool_off(r429, 1.0, 1.1, False) == 0.0  # the first: a count the window frees
    assert sends.lone_next  # the next send goes alone
    limits.note_send(1.2)
    assert sends.probe_out and sends.probe_at == 1.2 and not sends.lone_next
    assert limits.cool_off(r429, 1.05, 1.3, False) == 0.0  # sent before the 429 came back: its echo
    # Sent after the last 429 came back, with no success between: two windows, then 4x each.
    assert limits.cool_off(r429, 1.35, 1.5, False) == 2.0
    assert limits.cool_off(r429, 3.6, 3.7, False) == 8.0
    assert limits.cool_off(r429, 11.8, 11.9, False) == 32.0
    # A success sent after the last 429 ends the run of them: the next 429 is a first again.
    assert limits.cool_off(Tally.SUCCEEDED, 44.0, 44.1, False) == 0.0
    assert limits.cool_off(r429, 44.2, 44.3, False) == 0.0
    assert limits.cool_off(r429, 44.4, 44.5, False) == 2.0


def test_a_429_that_says_how_long_to_wait_is_the_servers_to_time():
    limits = _slow_start_key()
    r429 = Tally.REJECTED_429
    assert limits.cool_off(r429, 1.0, 1.1, True) == 0.0
    assert not limits.sends.lone_next  # the Retry-After's wait is the whole of it
    assert limits.cool_off(r429, 1.2, 1.3, True) == 0.0  # in a row, but the server says how long
    assert limits.cool_off(Tally.FAILED, 1.4, 1.5, False) == 0.0  # a timeout is no 429


def test_cooling_off_stops_at_its_cap():
    limits = _slow_start_key()
    t, last = 0.0, 0.0
    for _ in range(10):
        last = limits.cool_off(Tally.REJECTED_429, t, t + 0.1, False)
        t += 0.2 + last
    assert last == COOL_CAP_S


def test_a_minutes_window_cools_off_two_seconds_at_first_not_two_minutes():
    headroom = HeadroomController(fixed_ms=5.0)

    def make(policies):
        return WindowLimiter(policies, headroom.seconds)

    policies = (Policy(500, 60.0),)
    learning = Learning(budgets=Budgets(EngineSettings(), make), headroom=headroom, events=_Events())
    limits = KeyLimits(KeySpec("k1", "secret-k1", policies), make(policies), learning, max_in_flight=8)
    r429 = Tally.REJECTED_429
    assert limits.cool_off(r429, 1.0, 1.1, False) == 0.0
    assert limits.cool_off(r429, 1.2, 1.3, False) == COOL_FIRST_S == 2.0
    assert limits.cool_off(r429, 3.4, 3.5, False) == 8.0
