"""The loop's lateness as a distribution (recent and the whole run's), the CPU share, and the
verdict that says when the client, not the server, is the limit: pure logic, fed tick by tick
with a fake CPU and wall clock."""

from __future__ import annotations

import pytest

from ratedeck.engine.observe.loop_watch import (
    AT_CAPACITY_PCT,
    BUSY_CORE_SHARE,
    CLIENT_CORE_SHARE,
    LAG_RECENT_TICKS,
    LOOP_LAG_WARN_MS,
    SUSTAINED_LATE_TICKS,
    VERDICT_MIN_TICKS,
    LoopWatch,
    client_limit,
)
from ratedeck.engine.observe.merge import merge_lag


class FakeProcess:
    """A process's CPU and wall clocks that only the test moves; events kept."""

    def __init__(self) -> None:
        self.cpu = 100.0
        self.wall = 5_000.0
        self.events: list[str] = []

    def event(self, kind, text: str) -> None:
        self.events.append(text)

    def watch(self, answered: int = 1000) -> LoopWatch:
        w = LoopWatch(
            self, lambda: answered, cpu=lambda: self.cpu, wall=lambda: self.wall, loop_cpu=lambda: self.cpu
        )
        w.start(0.0, "asyncio")
        return w

    def ticks(self, w: LoopWatch, n: int, late_ms: float, busy: float = 0.1) -> None:
        """`n` ticks 0.1 s apart, each `late_ms` late, the process `busy` (CPU s per wall s)."""
        for _ in range(n):
            self.wall += 0.1
            self.cpu += 0.1 * busy
            w.note_lag(late_ms / 1000.0, self.wall)


def test_the_verdict_rule():
    many, run, busy = VERDICT_MIN_TICKS, SUSTAINED_LATE_TICKS, 0.6
    assert client_limit(2.0, many, busy, streak=run) == ""  # a quiet loop: not the client
    assert client_limit(25.0, many, busy, streak=run) == "loop late p99 25 ms"  # sustained, under load
    assert client_limit(25.0, many - 1, busy, streak=run) == ""  # too few ticks: the p99 is the start's turn
    assert client_limit(25.0, many, busy, streak=run - 1) == ""  # stalls, however late, are not a lag
    assert client_limit(25.0, many, BUSY_CORE_SHARE - 0.01, streak=run) == ""  # late while idle: not ours
    assert client_limit(25.0, many, None, streak=run) == ""  # the CPU not measured long enough
    assert client_limit(LOOP_LAG_WARN_MS, many, busy, streak=run) == ""  # at the line is not over it
    assert client_limit(1.0, many, CLIENT_CORE_SHARE) == "90% of a core busy"
    assert client_limit(1.0, many, None) == ""  # not measured long enough
    assert client_limit(25.0, many, 0.97, streak=run) == "loop late p99 25 ms, 97% of a core busy"
    # a run at the limits has the server's rules as its limit, however busy the client is
    assert client_limit(25.0, many, 0.97, pct_capacity=AT_CAPACITY_PCT, streak=run) == ""
    assert client_limit(25.0, many, 0.97, pct_capacity=AT_CAPACITY_PCT - 1, streak=run) != ""


def test_one_stall_on_a_quiet_loop_is_no_verdict():
    """A gateway at 0.4 requests a second whose loop stalled 14 ms once at the start: with
    fewer than a hundred ticks that one tick is the p99, yet the client is not the limit."""
    fake = FakeProcess()
    w = fake.watch(answered=30)
    fake.ticks(w, 1, 14.0, busy=0.01)  # the start's long turn
    fake.ticks(w, VERDICT_MIN_TICKS + 10, 0.3, busy=0.01)
    view = w.view()
    assert view.p99_ms == 14.0 and view.run.p99 == 14.0  # the figures say what happened...
    assert view.limit == view.run_limit == ""  # ...and no verdict comes of it
    # Stalls on a busy loop, never several in a row (a GC every second): no verdict either.
    busy = FakeProcess()
    w = busy.watch()
    for _ in range(12):
        busy.ticks(w, 1, 30.0, busy=0.8)
        busy.ticks(w, 9, 0.3, busy=0.8)
    assert w.view().p99_ms == 30.0 and w.view().limit == w.view().run_limit == ""
    # Lag sustained under load is the client's limit.
    busy.ticks(w, SUSTAINED_LATE_TICKS, 30.0, busy=0.8)
    assert w.view().limit == w.view().run_limit == "loop late p99 30 ms"


def test_recent_and_run_wide_percentiles_of_the_lag():
    fake = FakeProcess()
    w = fake.watch()
    fake.ticks(w, 90, 0.45, busy=0.6)
    fake.ticks(w, 10, 30.0, busy=0.6)  # a tenth of the ticks 30 ms late, in a row, the loop busy
    view = w.view()
    assert (view.p50_ms, view.p99_ms) == (0.45, 30.0)  # the recent ticks, exact
    assert (view.run.p50, view.run.p99, view.run.max, view.run.count) == (
        0.5,
        30.0,
        30.0,
        100,
    )  # 0.1 ms grain
    assert view.limit == view.run_limit == "loop late p99 30 ms"
    fake.ticks(w, LAG_RECENT_TICKS, 0.45, busy=0.6)  # a quiet minute: the recent window forgets them
    view = w.view()
    assert (view.p50_ms, view.p99_ms) == (0.45, 0.45)
    assert view.limit == ""  # the client is not the limit now...
    assert view.run.p99 == 30.0 and view.run_limit == "loop late p99 30 ms"  # ...but was over the run
    assert view.run.count == 100 + LAG_RECENT_TICKS


def test_a_process_using_a_whole_core_is_the_limit_and_half_a_core_is_not():
    fake = FakeProcess()
    w = fake.watch()
    fake.ticks(w, 20, 0.3, busy=0.97)
    assert w.core_share() is None and w.view().limit == ""  # 2 s: too short to tell
    fake.ticks(w, 40, 0.3, busy=0.97)
    assert w.core_share() == pytest.approx(0.97)
    assert w.run_core_share() == pytest.approx(0.97)
    assert w.view().limit == "97% of a core busy"
    assert w.view(pct_capacity=99.0).limit == ""  # at capacity: the limits hold it, not the client
    fake.ticks(w, LAG_RECENT_TICKS, 0.3, busy=0.5)
    assert w.core_share() == pytest.approx(0.5)
    assert w.view().limit == ""
    assert w.run_core_share() == pytest.approx((6.0 * 0.97 + 60.0 * 0.5) / 66.0)


def test_the_cpu_share_freezes_when_the_engine_stops():
    fake = FakeProcess()
    w = fake.watch()
    fake.ticks(w, 60, 0.3, busy=0.6)
    w.stop()
    fake.wall += 100.0
    fake.cpu += 1.0
    assert w.run_core_share() == pytest.approx(0.6) and w.cpu_s() == pytest.approx(3.6)


def test_the_run_s_percentiles_of_several_processes_are_those_of_one_process():
    """Each process sends its whole lag histogram; the merge adds them (merge.py)."""
    fake = FakeProcess()
    a, b, alone = fake.watch(), fake.watch(), fake.watch()
    fake.ticks(a, 150, 0.45)
    fake.ticks(b, 48, 0.45)
    fake.ticks(b, 2, 40.0)
    for late_ms, n in ((0.45, 198), (40.0, 2)):
        fake.ticks(alone, n, late_ms)
    merged = merge_lag([a.view(whole=True), b.view(whole=True)])
    one = alone.view()
    assert (merged.run.p50, merged.run.p99, merged.run.max, merged.run.count) == (
        one.run.p50,
        one.run.p99,
        one.run.max,
        200,
    )
    assert merged.run.p99 == 0.5  # 2 late ticks in 200 are 1%: not over the p99
    assert merged.p99_ms == 40.0  # the recent figures are the worst process's
    # two late ticks on an idle loop are stalls: no verdict in either process, nor merged
    assert a.view().limit == "" and merged.limit == merged.run_limit == ""
    # the verdict is any process's that says so: c's loop lags, sustained and busy, which holds
    # back c's keys however quiet a's loop is
    c = fake.watch()
    fake.ticks(c, 57, 0.45, busy=0.8)
    fake.ticks(c, SUSTAINED_LATE_TICKS, 40.0, busy=0.8)
    assert merge_lag([a.view(), c.view()]).limit == "loop late p99 40 ms"
    quiet = fake.watch()
    fake.ticks(quiet, 60, 0.45)
    assert merge_lag([a.view(), quiet.view()]).limit == ""


def test_the_snapshot_carries_the_lag_and_stalls_give_no_verdict(tmp_path):
    from tests.support.engine_helpers import seed_engine

    engine, _ = seed_engine(tmp_path)
    for i in range(VERDICT_MIN_TICKS):
        engine.parts.loop.note_lag(0.030 if i % 10 == 0 else 0.001, 1.0 + i / 10)
    lag = engine.snapshot().lag
    assert (lag.p50_ms, lag.p99_ms) == (pytest.approx(1.0), pytest.approx(30.0))
    assert lag.run.count == VERDICT_MIN_TICKS and lag.run.max == pytest.approx(30.0)
    assert lag.limit == lag.run_limit == ""  # one late tick in ten: stalls, not a lag
