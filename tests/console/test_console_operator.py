"""Pilot tests of what an operator presses: charts' span, the keys table (sort, filter,
paging), key detail, errors, the header's status, presses that must never be lost,
folded events, where notifications go, the help at 80x24 and saving a profile."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
from textual import events

from ratedeck.console.screens.confirm import ConfirmScreen
from ratedeck.console.screens.errors import ErrorsScreen
from ratedeck.console.screens.help import HelpScreen
from ratedeck.console.screens.key_detail import KeyDetailScreen
from ratedeck.console.widgets.chart import Chart
from ratedeck.console.widgets.keys_table import KeysTable
from ratedeck.console.widgets.throughput import ThroughputPanel
from ratedeck.engine.commands import PauseKey, ResumeKey, SetArrivalRate
from ratedeck.engine.snapshot import Event
from tests.support.console_fixtures import (
    SECRETS,
    FakeHost,
    async_test,
    main_snapshot,
    make_app,
    many_keys_snapshot,
    message_snapshot,
    reported_snapshot,
    screen_text,
)

SIZE = (120, 40)


def notices(app) -> list[str]:
    return [notification.message for notification in app._notifications]


def table(app) -> KeysTable:
    return app.query_one(KeysTable)


class LaggyHost(FakeHost):
    """A host whose snapshots lag behind its commands, as a child process's do:
    `snapshot()` returns what was last `publish()`ed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.published = FakeHost.snapshot(self)

    def snapshot(self):
        return self.published

    def publish(self) -> None:
        self.published = FakeHost.snapshot(self)


# ---------------------------------------------------------------- presses are never lost


@async_test
async def test_quick_rate_presses_all_count_while_snapshots_lag():
    host = LaggyHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right_square_bracket", "right_square_bracket")
        app._tick()  # a refresh that still shows the old rate
        await pilot.press("right_square_bracket")
        rates = [command.rate for command in host.commands]
        assert rates == pytest.approx([137.5, 151.25, 166.375])
        await pilot.press(*["left_square_bracket"] * 3)
        assert host.arrival_rate == 125.0  # exactly back where it started
        host.publish()
        app._tick()
        await pilot.press("right_square_bracket")
        assert host.commands[-1] == SetArrivalRate(137.5)


@async_test
async def test_space_twice_before_the_snapshot_catches_up_pauses_then_resumes():
    host = LaggyHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "space")
        assert host.commands == [PauseKey("k1"), ResumeKey("k1")]


# ---------------------------------------------------------------- header and capacity


@async_test
async def test_header_tells_paused_blocked_and_live_capacity():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        first_line = screen_text(app).splitlines()[0]
        assert "● running" in first_line and "of 120 live" in first_line
        await pilot.press("down", "space")  # pause k2: one key less can send
        assert "of 100 live" in screen_text(app).splitlines()[0]
        assert "1 paused" in screen_text(app).splitlines()[0]
        await pilot.press("P")
        first_line = screen_text(app).splitlines()[0]
        assert "‖ paused (every key paused by the operator)" in first_line and "of 0.0 live" in first_line
        assert "no key can send" in screen_text(app)
        host.base = dataclasses.replace(
            host.base,
            keys=tuple(dataclasses.replace(row, state="blocked") for row in host.base.keys),
        )
        host.paused.clear()
        app.pull_snapshot()
        await pilot.pause()
        text = screen_text(app)
        assert "✖ all blocked (the server refused every key)" in text.splitlines()[0]
        assert "✖ blocked" in str(table(app).get_cell("k3", "state"))


@async_test
async def test_80x24_header_keeps_429s_and_failures():
    app = make_app()
    async with app.run_test(size=(80, 24)):
        first_line = screen_text(app).splitlines()[0]
        assert "429s 3" in first_line and "failed 9" in first_line and "4xx 0" in first_line


# ---------------------------------------------------------------- charts


@async_test
async def test_z_cycles_the_chart_span():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(ThroughputPanel)
        chart = app.query_one("#tps-chart", Chart)
        assert app.span[0] == "1m" and "last 1m" in str(panel.border_subtitle)
        assert chart.spec.span_s == 60 and "-1m" in screen_text(app)
        await pilot.press("z")
        assert app.span[0] == "5m" and chart.spec.span_s == 300 and "last 5m" in str(panel.border_subtitle)
        await pilot.press("z")
        assert app.span[0] == "run" and chart.spec.span_s == 180  # the 180 s the fixture has
        assert "run 3m00s" in str(panel.border_subtitle)
        await pilot.press("z")
        assert app.span[0] == "1m"


@async_test
async def test_throughput_axis_starts_at_zero_and_draws_capacity():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        chart = app.query_one("#tps-chart", Chart)
        lines = [line for line in screen_text(app).splitlines()[3:12]]
        assert any("150┤" in line for line in lines) and any("0└" in line for line in lines)
        assert chart.scale_text == "0..150 linear"
        assert app.query_one("#latency-chart", Chart).scale_text == "10 ms..1 s log"
        assert "─" * 10 in screen_text(app)  # the capacity line


# ---------------------------------------------------------------- keys table


@async_test
async def test_o_sorts_by_the_next_column_and_shift_o_reverses():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        await pilot.press("o")
        assert keys.sort_column == "state"
        for _ in range(4):  # state -> in flight -> sent -> ok -> 429s
            await pilot.press("o")
        assert keys.sort_column == "r429" and keys.sort_descending
        assert keys.shown_labels == ["k2", "k4", "k6", "k1", "k3", "k5"]
        assert keys.cursor_row == 0
        await pilot.press("O")
        assert keys.shown_labels == ["k1", "k3", "k5", "k2", "k4", "k6"]
        assert "sort 429s ▲" in str(keys.border_subtitle)


@async_test
async def test_clicking_a_header_sorts_by_it_and_again_reverses():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        x = 1 + sum(column.get_render_width(keys) for column in list(keys.columns.values())[:6]) + 2
        await pilot.click(KeysTable, offset=(x, 1))  # the "Err" heading
        assert keys.sort_column == "errors" and keys.sort_descending
        assert keys.shown_labels[:3] == ["k6", "k4", "k2"]
        await pilot.click(KeysTable, offset=(x, 1))
        assert not keys.sort_descending and keys.shown_labels[-1] == "k6"


@async_test
async def test_slash_filters_enter_keeps_escape_clears():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        await pilot.press("slash", "k", "2")
        assert keys.shown_labels == ["k2"]
        await pilot.press("enter")
        assert app.focused is keys and app.query_one("#filter-bar").display
        assert "1 of 6 keys" in str(keys.border_subtitle)
        await pilot.press("slash", "backspace", "backspace", "4", "2", "9")  # words of the last error
        assert keys.shown_labels == ["k4"]
        await pilot.press("g")  # typed into the filter, not the throttle key
        assert not any("message runs only" in text for text in notices(app))
        await pilot.press("escape")
        assert keys.shown_labels == ["k1", "k2", "k3", "k4", "k5", "k6"]
        assert not app.query_one("#filter-bar").display and app.focused is keys


@async_test
async def test_home_end_and_pages_move_through_500_keys():
    app = make_app(many_keys_snapshot(500))
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        assert keys.row_count == 500
        await pilot.press("end")
        assert keys.cursor_row == 499 and keys.selected_key == "k500"
        await pilot.press("home")
        assert keys.cursor_row == 0
        await pilot.press("pagedown")
        page = keys.cursor_row
        assert page > 5
        await pilot.press("pagedown", "pageup")
        assert keys.cursor_row == page
        await pilot.press("j", "j", "k")
        assert keys.cursor_row == page + 1


@async_test
async def test_500_keys_refresh_in_place_and_keep_the_cursor_on_its_key():
    host = FakeHost(many_keys_snapshot(500))
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        for _ in range(3):  # sort by sent, descending
            await pilot.press("o")
        await pilot.press("down", "down")
        chosen = keys.selected_key
        rows = host.base.keys
        # the chosen key suddenly sends the most: it moves to the top, the cursor with it
        host.base = dataclasses.replace(
            host.base,
            keys=tuple(dataclasses.replace(r, sent=99_999) if r.label == chosen else r for r in rows),
        )
        app.pull_snapshot()
        await pilot.pause()
        assert keys.shown_labels[0] == chosen and keys.selected_key == chosen


# ---------------------------------------------------------------- key detail


@async_test
async def test_enter_opens_key_detail_n_p_step_and_space_pauses_that_key():
    host = FakeHost(reported_snapshot())
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        assert isinstance(app.screen, KeyDetailScreen) and app.screen.label == "k1"
        text = screen_text(app)
        assert "fingerprint" in text and "k1 …Ye5G" in text
        assert "2 remaining of 20 · resets in 0.4s" in text
        assert "18/20 (90%)" in text and "p99 110 ms" in text
        await pilot.press("n", "n")
        assert app.screen.label == "k3"
        await pilot.press("n", "p", "p", "p")
        assert app.screen.label == "k1"
        await pilot.press("space")
        assert host.commands[-1] == PauseKey("k1")
        assert "‖ paused" in screen_text(app)  # the open screen follows new snapshots
        await pilot.press("escape")
        assert not isinstance(app.screen, KeyDetailScreen)


@async_test
async def test_key_detail_says_what_is_not_known_yet():
    app = make_app(main_snapshot())  # rows with no fingerprint (a short secret), no success timed
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "down", "enter")  # k4: got the 429s
        text = screen_text(app)
        assert "no fingerprint (short secret)" in text and "Server says  unknown" in text
        assert "This key     no successes yet" in text and "not reported" not in text
        assert "429 rate limited ×3" in text and '{"error":"rate limit exceeded","key":"…Ye5G"' in text
        assert "k4 got 429 with Retry-After 5s" in text  # its gate history from the events


# ---------------------------------------------------------------- errors


@async_test
async def test_e_lists_errors_by_status_and_cause_and_enter_opens_the_key():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
        assert isinstance(app.screen, ErrorsScreen)
        text = screen_text(app)
        assert "12 failed attempts · 3 kinds" in text
        assert "timeout" in text and "503" in text and "rate limited" in text
        assert "no answer within 10.0s" in text
        await pilot.press("down")
        assert "<html><body>Service Unavailable</body></html>" in screen_text(app)
        await pilot.press("enter")
        assert isinstance(app.screen, KeyDetailScreen) and app.screen.label == "k2"
        await pilot.press("escape")
        assert isinstance(app.screen, ErrorsScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, ErrorsScreen)


@async_test
async def test_wide_terminals_show_errors_beside_the_keys():
    app = make_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        assert app.has_class("-wide") and app.query_one("#errors-panel").display
        assert "×6   — timeout" in screen_text(app)
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not app.has_class("-wide") and not app.query_one("#errors-panel").display


# ---------------------------------------------------------------- events and notifications


@async_test
async def test_repeated_events_are_folded_in_the_log():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        host.events.extend(
            Event(150.0 + i * 0.5, "cooldown", f"k3 cooling down {1 + i % 2}.0s: 429") for i in range(12)
        )
        app.pull_snapshot()
        await pilot.pause()
        text = screen_text(app)
        assert "k3 cooling down 2.0s: 429 ×12 in 5.5s" in text
        assert text.count("k3 cooling down") == 1


@async_test
async def test_notifications_stay_on_the_footer_line_and_show_the_newest():
    app = make_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        await pilot.pause()
        shown = [toast for toast in app.screen.query("Toast") if toast.parent.display]
        assert len(shown) == 1
        assert "Arrival rate 137.5/s" in str(shown[0].render())
        width, height = app.size
        assert shown[0].region.y >= height - 2 and shown[0].region.bottom <= height


# ---------------------------------------------------------------- help and save


@async_test
async def test_help_scrolls_to_every_key_at_80x24():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "(quit_interrupt)" not in screen_text(app)  # more than fits
        await pilot.press("end")
        text = screen_text(app)
        assert "(save_profile)" in text and "(quit_interrupt)" in text and "^c" in text
        await pilot.press("home")
        assert "(filter_keys)" in screen_text(app)


@async_test
async def test_s_asks_before_overwriting_and_says_where_it_saved(tmp_path: Path):
    host = FakeHost()
    path = tmp_path / "profile.toml"
    path.write_text("# mine\n")
    app = make_app(host=host, profile_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        assert str(path.resolve()) in app.screen.question and "Overwrite" in screen_text(app)
        await pilot.press("n")
        assert path.read_text() == "# mine\n"
        assert any("Not saved" in text and str(path.resolve()) in text for text in notices(app))
        await pilot.press("b", "s", "y")
        assert tomllib.loads(path.read_text())["queue"]["backpressure"] is False
        assert any(f"Settings saved to {path.resolve()}" in text for text in notices(app))


@async_test
async def test_table_figures_follow_at_most_once_a_second_but_states_at_once():
    host = FakeHost()
    app = make_app(host=host, keys_refresh_s=3600.0)
    async with app.run_test(size=SIZE) as pilot:
        keys = table(app)
        host.base = dataclasses.replace(
            host.base, keys=tuple(dataclasses.replace(row, sent=row.sent + 1) for row in host.base.keys)
        )
        app.pull_snapshot()
        await pilot.pause()
        assert str(keys.get_cell("k1", "sent")) == "4 210"  # figures wait for the next second
        assert keys.key_row("k1").sent == 4_211  # but controls see the latest
        host.paused.add("k3")
        app.pull_snapshot()
        await pilot.pause()
        assert str(keys.get_cell("k3", "state")) == "‖ paused"  # a state change shows at once
        assert str(keys.get_cell("k1", "sent")) == "4 211"


@async_test
async def test_keys_typed_right_after_slash_reach_the_filter():
    """A terminal delivers "/k3<Enter>" in one read (fast typing, a paste): every key
    lands in the filter, none moves the table's cursor."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for key in ("slash", "k", "3", "enter"):
            app.post_message(events.Key(key, "/" if key == "slash" else key if len(key) == 1 else None))
        await pilot.pause()
        await pilot.pause()
        assert app.query_one("#key-filter").value == "k3"
        assert table(app).shown_labels == ["k3"] and app.focused is table(app)
        await pilot.press("enter")
        assert isinstance(app.screen, KeyDetailScreen) and app.screen.label == "k3"
        # "/" opens the filter with the old text selected (typing replaces it); in
        # the filter "/" is a character, not the filter key again
        await pilot.press("escape", "slash", "slash")
        assert app.query_one("#key-filter").value == "/"


@async_test
async def test_slash_types_into_a_modal_text_field():
    app = make_app(message_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("G", "2", "5", "slash", "s")  # the old value is selected: typing replaces it
        assert app.screen.query_one("#throttle-input").value == "25/s"
        assert not app.query_one("#filter-bar").display


@async_test
async def test_no_secret_reaches_the_new_screens():
    app = make_app(reported_snapshot())
    async with app.run_test(size=(200, 50)) as pilot:
        for keys in ((), ("down", "down", "down", "enter"), ("escape", "e"), ("down", "down")):
            await pilot.press(*keys)
            await pilot.pause()
            text = screen_text(app)
            for secret in SECRETS.values():
                assert secret not in text and secret[-8:] not in text
            assert not re.search(r"[A-Za-z0-9]{32}", text)


@async_test
async def test_a_snapshot_before_the_key_detail_composed_is_no_crash():
    """The live feed hands every open screen each snapshot; one may land between the push of the
    key detail and its compose (seen by hand on a busy box: NoMatches '#detail-fill')."""
    snap = reported_snapshot()
    app = make_app(host=FakeHost(snap))
    async with app.run_test(size=SIZE) as pilot:
        screen = KeyDetailScreen("k1", snap, lambda: ["k1"])
        app.push_screen(screen)
        screen.snapshot = dataclasses.replace(snap, elapsed_s=snap.elapsed_s + 1)  # before compose
        await pilot.pause()
        assert isinstance(app.screen, KeyDetailScreen)
        assert "18/20 (90%)" in screen_text(app)
