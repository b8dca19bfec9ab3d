"""The console's pure parts: chart scales and drawing, history, steering, event folding,
the header's status, the keys table's sort and filter rules. No app, no terminal."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import pytest

from ratedeck.console.history import RunHistory, new_seconds, resample
from ratedeck.console.steering import Pending, RateSteps
from ratedeck.console.widgets.chart import bar_rows, log_range, log_rows, nice_top, time_ago, time_axis
from ratedeck.console.widgets.event_log import EventDigest, new_events
from ratedeck.console.widgets.keys_table import matches, natural
from ratedeck.console.widgets.run_bar import header_text, run_status
from ratedeck.engine.snapshot import Event, Snapshot
from tests.support.console_fixtures import (
    all_blocked_snapshot,
    cooldown_snapshot,
    gates_snapshot,
    main_snapshot,
    paused_snapshot,
)

# ---------------------------------------------------------------- chart scales


@pytest.mark.parametrize(
    "value, top", [(0, 1.0), (0.7, 0.8), (97, 100), (100, 100), (101, 120), (126, 150), (1_900, 2_000)]
)
def test_nice_top_is_the_next_round_number(value, top):
    assert nice_top(value) == pytest.approx(top)


def test_log_range_spans_whole_decades_at_least_two():
    assert log_range([52.2, 52.6]) == (1, 3)  # 10 ms .. 1 s: a wobble stays a wobble
    assert log_range([44.0, 118.0]) == (1, 3)
    assert log_range([0.5, 5_000]) == (-1, 4)
    assert log_range([None, 0.0]) == (1, 3)  # no data yet


def test_time_labels_read_like_a_clock():
    assert [time_ago(s) for s in (0, 45, 60, 150, 300, 3_900)] == [
        "now",
        "-45s",
        "-1m",
        "-2m30s",
        "-5m",
        "-1h05m",
    ]
    axis = time_axis(30, 60)
    assert axis.startswith("└-1m") and axis.endswith("now") and "-30s" in axis and len(axis) == 31


def plain(rows) -> list[str]:
    return ["".join(text for text, _ in row) for row in rows]


def test_bars_start_at_zero_and_the_capacity_line_is_drawn():
    # top 100, 4 rows of 25 each: 0 draws nothing, 100 fills the column, 50 half of it;
    # the line at 80 is in the top row, over every cell a bar does not fill
    rows = plain(
        bar_rows([0.0, 100.0, 50.0, None], top=100, rows=4, style="s", lines=[([80.0] * 4, "─", "c")])
    )
    assert [row[0] for row in rows] == ["─", " ", " ", " "]
    assert [row[1] for row in rows] == ["─", "█", "█", "█"]  # over a full bar too, on the bar's colour
    styled = bar_rows([100.0], top=100, rows=4, style="s", lines=[([80.0], "─", "c")])
    assert styled[0] == [("─", "c on s")]
    assert [row[2] for row in rows] == ["─", " ", "█", "█"]
    assert rows[0][3] == "─"  # no data: the line still shows where capacity is


def test_a_tiny_non_zero_value_still_shows():
    assert plain(bar_rows([0.1], top=100, rows=4, style="s"))[-1] == "▁"


def braille_rows(value: float) -> list[int]:
    """Rows of a 4-row, 2-decade log chart (10..1000) holding a dot for `value`."""
    rows = log_rows([([value, value], "x")], lo=1, hi=3, rows=4, columns=1)
    return [index for index, row in enumerate(plain(rows)) if row.strip() and ord(row[0]) > 0x2800]


def test_log_scale_keeps_small_wobbles_flat_and_decades_apart():
    assert braille_rows(52.2) == braille_rows(52.6)
    assert braille_rows(50.0) != braille_rows(500.0)
    assert braille_rows(990.0) == [0] and braille_rows(10.0) == [3]


# ---------------------------------------------------------------- history


def test_resample_folds_points_into_columns():
    values = [1.0, 2.0, 3.0, 4.0]
    assert resample(values, 1.0, 4, 2) == [1.5, 3.5]
    assert resample(values, 1.0, 4, 2, "max") == [2.0, 4.0]
    assert resample(values, 1.0, 8, 4) == [None, None, 1.5, 3.5]  # the span is longer than the data
    assert resample(values, 1.0, 4, 8) == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    assert resample([None, 5.0], 1.0, 2, 1) == [5.0]


def engine_run(seconds: int, maxlen: int = 300):
    """Snapshots as the engine makes them: series in deques of `maxlen`, one value per second."""
    tps: deque[float] = deque(maxlen=maxlen)
    p50: deque[float] = deque(maxlen=maxlen)
    p99: deque[float] = deque(maxlen=maxlen)
    for second in range(seconds):
        tps.append(float(second % 17))
        p50.append(40.0 + second % 5)
        p99.append(0.0 if second % 50 == 0 else 100.0 + second % 7)
        yield Snapshot(
            elapsed_s=second + 1.25,
            capacity_tps=100.0,
            live_capacity_tps=80.0,
            tps_series=tuple(tps),
            p50_series=tuple(p50),
            p99_series=tuple(p99),
        )


def test_history_takes_every_second_once_past_the_engine_window():
    history = RunHistory()
    for snap in engine_run(420):
        history.ingest(snap)
        history.ingest(snap)  # a second pull of the same snapshot adds nothing
    assert history.seconds == 420
    points, res = history.view(60)
    assert res == 1.0 and [point.tps for point in points] == [float(s % 17) for s in range(360, 420)]
    assert points[-1].live == 80.0 and points[-1].capacity == 100.0
    assert history.view(None)[0][0].live is None  # the first second was not watched
    whole, res = history.view(None)
    assert res * len(whole) == pytest.approx(420)


def test_history_compacts_to_fixed_buckets_and_keeps_the_worst_p99():
    history = RunHistory(fine_s=50, max_buckets=8)
    for snap in engine_run(100, maxlen=50):
        history.ingest(snap)
    points, res = history.view(None)
    assert res == 16  # 1 -> 2 -> 4 -> 8 -> 16 seconds per bucket as the run grew
    assert len(points) <= 8
    assert sum(1 for _ in points) * res >= 96
    assert max(point.p99 or 0 for point in points) == 106.0  # the worst second survives the merges
    assert all(point.p50 is not None for point in points)
    assert [p.p99 for p in history.view(60)[0] if p.p99 is None]  # a second with no success stays a gap


def test_new_seconds_finds_the_shift_of_a_full_window():
    old = [(float(i), 0.0, 0.0) for i in range(10)]
    assert new_seconds(old, old[3:] + [(99.0, 0, 0)] * 3, expected=3) == 3
    flat = [(5.0, 1.0, 1.0)] * 10
    assert new_seconds(flat, flat, expected=2) == 0  # identical: nothing new
    assert new_seconds(old[:4], old[:6], expected=9) == 2  # still growing: the growth


# ---------------------------------------------------------------- steering


def test_rate_steps_are_multiplicative_and_exactly_reversible():
    steps = RateSteps(1.1)
    rate = 125.0
    for _ in range(7):
        rate = steps.step(rate, +1)
    assert rate == pytest.approx(125.0 * 1.1**7)
    for _ in range(7):
        rate = steps.step(rate, -1)
    assert rate == 125.0
    assert steps.step(rate, -1) == pytest.approx(125.0 / 1.1)


def test_rate_steps_begin_again_from_a_rate_set_elsewhere():
    steps = RateSteps(1.1)
    steps.step(100.0, +1)  # 110
    assert steps.step(50.0, +1) == pytest.approx(55.0)  # the engine says 50 now: build on that
    assert steps.step(55.0, -1) == 50.0
    assert RateSteps().step(0.0, +1) == 1.0 and RateSteps().step(0.0, -1) == 0.0


def test_pending_holds_a_sent_value_until_the_snapshot_shows_it():
    now = [0.0]
    pending = Pending(hold_s=2.0, clock=lambda: now[0])
    pending.set("rate", 110.0)
    assert pending.get("rate", 100.0) == 110.0  # the snapshot is behind
    assert pending.get("rate", 110.0) == 110.0  # caught up: dropped
    assert pending.get("rate", 100.0) == 100.0
    pending.set("rate", 121.0)
    now[0] = 2.5
    assert pending.get("rate", 100.0) == 100.0  # the engine settled elsewhere: believe it


# ---------------------------------------------------------------- events


def test_repeated_events_fold_into_one_line_with_a_count():
    events = tuple(
        Event(100.0 + i * 0.8, "cooldown", f"k3 cooling down {1 + i % 3}.0s: 429") for i in range(12)
    )
    events += (Event(101.0, "cooldown", "k4 cooling down 1.0s: 429"),)
    digest = EventDigest(window_s=10.0)
    digest.feed(tuple(sorted(events, key=lambda e: e.at_s)))
    k3 = [group for group in digest.groups if group.text.startswith("k3")]
    assert len(k3) == 1 and k3[0].count == 12 and k3[0].last_at - k3[0].first_at == pytest.approx(8.8)
    assert digest.groups[-1] is k3[0]  # the latest repeat is the bottom line
    assert any(group.text.startswith("k4") for group in digest.groups)  # k3 and k4 stay apart
    digest.feed(events[-1:] + (Event(130.0, "cooldown", "k3 cooling down 1.0s: 429"),))
    assert [group.count for group in digest.groups if group.text.startswith("k3")] == [12, 1]  # a new window


def test_new_events_are_found_across_a_sliding_window():
    log = [Event(float(i), "info", f"e{i}") for i in range(10)]
    assert new_events((), tuple(log[:3])) == tuple(log[:3])
    assert new_events(tuple(log[:5]), tuple(log[2:8])) == tuple(log[5:8])
    assert new_events(tuple(log[:5]), tuple(log[:5])) == ()
    twice = Event(1.0, "info", "same")
    assert new_events((twice,), (twice, twice)) == (twice,)


# ---------------------------------------------------------------- header


def test_status_says_what_the_run_does_and_why():
    assert run_status(main_snapshot()).word == "running"
    assert run_status(cooldown_snapshot()).reason == "1 cooling"
    paused_all = dataclasses.replace(
        main_snapshot(), keys=tuple(dataclasses.replace(k, state="paused") for k in main_snapshot().keys)
    )
    assert (run_status(paused_all).word, run_status(paused_all).reason) == (
        "paused",
        "every key paused by the operator",
    )
    assert run_status(all_blocked_snapshot()).word == "all blocked"
    waiting = run_status(gates_snapshot())
    assert (waiting.word, waiting.reason) == ("waiting", "gate k1 3.2s")
    assert (
        run_status(main_snapshot(), draining=True, drain_reason="SIGTERM received").reason
        == "SIGTERM received"
    )
    assert run_status(dataclasses.replace(main_snapshot(), phase="stopped")).word == "stopped"
    assert "2 paused" in run_status(paused_snapshot_two()).reason


def paused_snapshot_two() -> Snapshot:
    snap = paused_snapshot()
    return dataclasses.replace(
        snap, keys=tuple(dataclasses.replace(k, state="paused") if k.label == "k3" else k for k in snap.keys)
    )


def test_header_puts_429s_and_failures_before_the_rest():
    text = header_text(main_snapshot())
    assert (
        text.index("429s")
        < text.index("failed")
        < text.index("live")
        < text.index("p99")
        < text.index("generated")
    )
    assert "117.0[/][$text-muted]/s of[/] 120" not in text  # rate() keeps whole numbers above 100
    assert "117[/][$text-muted]/s of[/] 120" in text


# ---------------------------------------------------------------- keys table rules


def test_labels_sort_naturally():
    assert sorted(["k10", "k2", "k1", "k100"], key=natural) == ["k1", "k2", "k10", "k100"]


def test_filter_needs_every_word():
    row = main_snapshot().keys[3]  # k4, last error a 429
    assert matches(row, ["k4"]) and matches(row, ["k4", "429"]) and matches(row, ["active"])
    assert not matches(row, ["k4", "cooling"])
    assert math.isfinite(len(row.masked)) and matches(row, [row.masked.lower()])


def test_the_job_line_says_done_of_total_the_eta_and_the_least_time():
    from ratedeck.console.widgets.job import job_text
    from ratedeck.engine.snapshot import Progress

    assert (
        job_text(Progress(50_000, 20_849, 262.4, 243.0)) == "20 849 of 50 000 (41%) · ETA 4m22s · least 4m03s"
    )
    assert job_text(Progress(10, 3, None, None)) == "3 of 10 (30%) · ETA —"
    assert job_text(Progress(10, 10, 0.0, 0.0)) == "10 of 10 (100%) · done"
