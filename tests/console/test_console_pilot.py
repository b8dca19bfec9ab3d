"""Pilot tests: press each control and check the engine host saw it."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

from ratedeck.console.screens.cluster import ClusterScreen
from ratedeck.console.screens.headroom import HeadroomScreen, parse_headroom
from ratedeck.console.screens.help import HelpScreen
from ratedeck.console.screens.palette import ControlsProvider
from ratedeck.console.screens.throttle import ThrottleScreen, parse_throttle
from ratedeck.console.themes import ThemeFileError, load_themes, theme_from_toml
from ratedeck.console.widgets.gates import GatesPanel
from ratedeck.console.widgets.goodput import GoodputPanel
from ratedeck.console.widgets.keys_table import KeysTable
from ratedeck.console.widgets.queues import QueuesPanel
from ratedeck.console.widgets.run_bar import RunBar
from ratedeck.engine.commands import PauseAll, PauseKey, ResumeAll, ResumeKey, SetHeadroom, SetThrottle
from tests.support.console_fixtures import (
    SECRETS,
    FakeHost,
    async_test,
    cluster_snapshot,
    gates_snapshot,
    job_snapshot,
    main_snapshot,
    make_app,
    message_snapshot,
    open_gates,
    screen_text,
)

SIZE = (120, 40)


def notices(app) -> list[str]:
    return [notification.message for notification in app._notifications]


def state_cell(app, label: str) -> str:
    table = app.query_one(KeysTable)
    return str(table.get_cell(label, "state"))


@async_test
async def test_space_pauses_and_resumes_the_selected_key():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down")  # cursor on k2
        await pilot.press("space")
        assert host.commands[-1] == PauseKey("k2")
        assert state_cell(app, "k2") == "‖ paused"
        assert app.query_one(KeysTable).cursor_row == 1  # cursor kept across refresh
        assert "k2 paused by operator" in screen_text(app)
        await pilot.press("space")
        assert host.commands[-1] == ResumeKey("k2")
        assert state_cell(app, "k2") == "● active"


@async_test
async def test_refresh_updates_cells_in_place_and_keeps_cursor():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "down")
        table = app.query_one(KeysTable)
        row_keys_before = list(table.rows)
        host.paused.add("k4")
        app.pull_snapshot()
        await pilot.pause()
        assert list(table.rows) == row_keys_before
        assert table.cursor_row == 3
        assert state_cell(app, "k4") == "‖ paused"


@async_test
async def test_shift_p_pauses_all_then_resumes_all():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("P")
        assert host.commands[-1] == PauseAll()
        assert all(state_cell(app, label) == "‖ paused" for label in SECRETS)
        await pilot.press("P")
        assert host.commands[-1] == ResumeAll()
        assert all(state_cell(app, label) == "● active" for label in SECRETS)


@async_test
async def test_plus_and_minus_step_headroom_from_current_value():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        assert (host.headroom_ms, host.headroom_adaptive) == (35.0, False)
        await pilot.press("plus", "plus")
        assert host.headroom_ms == 45.0
        await pilot.press("minus")
        assert host.headroom_ms == 40.0
        assert "40 ms fixed" in screen_text(app)


@async_test
async def test_h_sets_exact_headroom_through_modal():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        assert isinstance(app.screen, HeadroomScreen)
        app.screen.query_one("#headroom-input").value = "42.5"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, HeadroomScreen)
        assert host.commands[-1] == SetHeadroom(42.5)
        assert (host.headroom_ms, host.headroom_adaptive) == (42.5, False)


@async_test
async def test_bad_headroom_input_gives_notice_and_changes_nothing():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        app.screen.query_one("#headroom-input").value = "fast"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HeadroomScreen)  # still open to correct it
        assert any("'fast' is not a number" in text for text in notices(app))
        assert host.commands == []
        await pilot.press("escape")
        assert not isinstance(app.screen, HeadroomScreen)
        assert host.commands == [] and host.headroom_adaptive


@async_test
async def test_a_returns_headroom_to_adaptive():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        assert not host.headroom_adaptive
        await pilot.press("a")
        assert host.commands[-1] == SetHeadroom(None)
        assert host.headroom_adaptive
        assert "adaptive" in screen_text(app)


@async_test
async def test_b_toggles_backpressure_and_queue_shows_unbounded():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("b")
        assert host.backpressure is False
        await pilot.pause()
        assert "unbounded" in screen_text(app)
        assert app.query_one(QueuesPanel).snapshot.backpressure is False
        await pilot.press("b")
        assert host.backpressure is True


@async_test
async def test_brackets_step_arrival_rate_by_a_factor_and_back_exactly():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right_square_bracket")
        assert host.arrival_rate == pytest.approx(137.5)
        app._tick()  # a refresh in between changes nothing
        await pilot.press("left_square_bracket")
        assert host.arrival_rate == 125.0  # exactly the start
        await pilot.press(*["right_square_bracket"] * 5, *["left_square_bracket"] * 5)
        assert host.arrival_rate == 125.0
        await pilot.press("left_square_bracket")
        assert host.arrival_rate == pytest.approx(125.0 / 1.1)
        assert "114/s" in screen_text(app)


@async_test
async def test_s_saves_effective_config_as_toml(tmp_path: Path):
    host = FakeHost()
    path = tmp_path / "profile.toml"
    app = make_app(host=host, profile_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("b", "s")
        assert tomllib.loads(path.read_text()) == host.effective_config()
        assert tomllib.loads(path.read_text())["queue"]["backpressure"] is False
        assert any(str(path) in text for text in notices(app))


@async_test
async def test_s_makes_the_user_config_directory_it_saves_into(tmp_path: Path):
    path = tmp_path / "config" / "ratedeck" / "config.toml"  # a first save: no directory yet
    app = make_app(profile_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        assert path.is_file() and path.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "config").stat().st_mode & 0o777 == 0o700


@async_test
async def test_save_to_unwritable_path_gives_notice_not_crash(tmp_path: Path):
    (tmp_path / "a-file").write_text("in the way")
    path = tmp_path / "a-file" / "profile.toml"
    app = make_app(profile_path=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        assert not path.exists()
        assert any("Could not save settings" in text and str(path) in text for text in notices(app))
        assert app.is_running


@async_test
async def test_t_cycles_through_the_three_themes():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "ratedeck-dark"
        seen = [app.theme]
        for _ in range(3):
            await pilot.press("t")
            seen.append(app.theme)
        assert seen == ["ratedeck-dark", "ratedeck-high-contrast", "ratedeck-light", "ratedeck-dark"]


@async_test
async def test_question_mark_shows_help_with_every_control():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for binding in app._control_bindings():
            assert f"({binding.id})" in text
        # refreshes keep flowing to the main screen while help is open
        app.host.backpressure = False
        app.pull_snapshot()
        await pilot.press("escape")
        assert "unbounded" in screen_text(app)
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
@async_test
async def test_quit_drains_and_returns_final_snapshot(key: str):
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(key)
        await pilot.pause()
    assert host.stop_calls == 1
    assert app.return_value is not None
    assert app.return_value.phase == "stopped"
    assert app.return_value == host.snapshot()


@async_test
async def test_quit_shows_draining_and_blocks_controls_until_stopped():
    release = asyncio.Event()

    class SlowHost(FakeHost):
        async def stop(self):
            await release.wait()
            return await super().stop()

    host = SlowHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert "◌ draining (quit by operator)" in screen_text(app)
        assert app.query_one(RunBar).draining
        await pilot.press("b", "q")  # controls are off; a second q does not stop twice
        assert host.commands == []
        release.set()
        await pilot.pause()
    assert host.stop_calls == 1
    assert app.return_value.phase == "stopped"


@async_test
async def test_keymap_remaps_and_reports_unknown_ids():
    host = FakeHost()
    app = make_app(host=host, keymap={"pause_key": "x", "no_such_action": "y"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("x")
        assert host.commands[-1] == PauseKey("k1")
        assert any("no_such_action" in text for text in notices(app))
        assert any(row[0] == "x" for row in app.control_rows() if row[1] == "pause_key")


@async_test
async def test_unknown_theme_name_falls_back_to_default_with_notice():
    app = make_app(theme="solarized-neon")
    async with app.run_test(size=SIZE):
        assert app.theme == "ratedeck-dark"
        assert any("solarized-neon" in text for text in notices(app))


@async_test
async def test_broken_theme_files_are_skipped_with_notices(tmp_path: Path):
    for name in ("dark.toml", "light.toml"):
        shutil.copy(Path(str(files("ratedeck.themes") / name)), tmp_path / name)
    (tmp_path / "bad-colour.toml").write_text('name = "x"\nprimary = "blurple"\n')
    (tmp_path / "no-name.toml").write_text('primary = "#ffffff"\n')
    (tmp_path / "not-toml.toml").write_text("name = [oops\n")
    app = make_app(themes_dir=tmp_path, theme="x")
    async with app.run_test(size=SIZE):
        assert app.theme == "ratedeck-dark"
        text = "\n".join(notices(app))
        assert "bad-colour.toml: field 'primary' is not a colour" in text
        assert "no-name.toml: field 'name'" in text
        assert "not-toml.toml: not valid TOML" in text
        assert app.ratedeck_themes == ["ratedeck-dark", "ratedeck-light"]


@async_test
async def test_broken_default_theme_falls_back_to_textual(tmp_path: Path):
    (tmp_path / "dark.toml").write_text('name = "ratedeck-dark"\nprimary = 12\n')
    app = make_app(themes_dir=tmp_path)
    async with app.run_test(size=SIZE):
        assert app.theme == "textual-dark"
        assert any("dark.toml" in text for text in notices(app))


def test_load_themes_ships_three_valid_themes():
    themes, problems = load_themes()
    assert problems == []
    assert {theme.name for theme in themes} == {"ratedeck-dark", "ratedeck-light", "ratedeck-high-contrast"}


def test_theme_file_problems_name_the_field():
    with pytest.raises(ThemeFileError, match=r"t.toml: unknown field\(s\) primry"):
        theme_from_toml('name = "t"\nprimary = "#000000"\nprimry = "#ffffff"\n', "t.toml")
    with pytest.raises(ThemeFileError, match="t.toml: field 'dark'"):
        theme_from_toml('name = "t"\nprimary = "#000000"\ndark = "yes"\n', "t.toml")


@pytest.mark.parametrize("text, expected", [("35", 35.0), (" 12.5ms ", 12.5), ("0", 0.0)])
def test_parse_headroom_accepts_milliseconds(text: str, expected: float):
    assert parse_headroom(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-5", "nan", "inf", "1e9"])
def test_parse_headroom_rejects_bad_values(text: str):
    with pytest.raises(ValueError):
        parse_headroom(text)


@async_test
async def test_resize_to_compact_and_back():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        assert not app.has_class("-compact")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.has_class("-compact")
        assert not app.query_one("#latency").display
        text = screen_text(app)
        assert "k6" in text and "Latency" in text and "HTTP" in text  # all rows and the figures fit
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert not app.has_class("-compact")
        assert app.query_one("#latency").display
        await pilot.press("question_mark")  # resizing under a modal reaches the main screen
        await pilot.resize_terminal(80, 24)
        await pilot.press("escape")
        assert app.query_one(KeysTable).cell_padding == 0
        await pilot.resize_terminal(30, 10)  # absurdly small: must not crash
        await pilot.pause()
        assert app.is_running


@async_test
async def test_no_secret_ever_reaches_the_screen():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for keys in ((), ("question_mark",), ("escape", "h")):
            await pilot.press(*keys)
            await pilot.pause()
            text = screen_text(app)
            for secret in SECRETS.values():
                assert secret not in text and secret[-8:] not in text
            assert not re.search(r"[A-Za-z0-9]{32}", text)


@async_test
async def test_command_palette_lists_every_control_and_theme():
    app = make_app()
    async with app.run_test(size=SIZE):
        provider = ControlsProvider(app.screen)
        names = [hit.text async for hit in provider.discover()]
        for _, _, description, _ in app.control_rows():
            assert description in names
        for theme in ("ratedeck-dark", "ratedeck-light", "ratedeck-high-contrast"):
            assert f"Theme: {theme}" in names


@async_test
async def test_refresh_timer_pulls_new_snapshots():
    host = FakeHost()
    app = make_app(host=host)
    app.refresh_s = 0.05
    async with app.run_test(size=SIZE) as pilot:
        host.backpressure = False
        await pilot.pause(0.2)
        assert app.snapshot.backpressure is False


@async_test
async def test_host_snapshot_failure_is_reported_not_fatal():
    class FlakyHost(FakeHost):
        fail = False

        def snapshot(self):
            if self.fail:
                raise RuntimeError("engine thread gone")
            return super().snapshot()

    host = FlakyHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        host.fail = True
        app.pull_snapshot()
        await pilot.pause()
        assert any("engine thread gone" in text for text in notices(app))
        assert app.snapshot == main_snapshot()


# ---------------------------------------------------------------- gates, goodput, throttle, duration


def throttle_state(host: FakeHost) -> tuple[str, float]:
    return host.throttle_mode, host.throttle_rate()


@async_test
async def test_closed_gates_show_seconds_left_reason_and_escalation():
    host = FakeHost(gates_snapshot())
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one(GatesPanel).display
        text = screen_text(app)
        assert "2 closed" in text and "▲ 1 escalation" in text
        assert "closed   3.2s" in text and "429, asked to wait 5s" in text
        assert "503, asked to wait 4s" in text
        assert "never closed: k2 k3 k5 k6" in text
        # time passes: gates count down; the host gate opens and the keys it held run again
        host.advance(1.5)
        app.pull_snapshot()
        await pilot.pause()
        text = screen_text(app)
        assert "1 closed" in text and "closed   1.7s" in text
        assert "last: 503, asked to wait 4s" in text and "▲ 1 escalation" in text
        assert state_cell(app, "k1") == "◔ cooling 1.7s"
        assert state_cell(app, "k2") == "● active"


@async_test
async def test_gates_panel_waits_until_a_gate_has_closed():
    host = FakeHost(dataclasses.replace(main_snapshot(), gates=open_gates()))
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.query_one(GatesPanel).display
        assert "all 7 open · 0 escalations" in screen_text(app)


@async_test
async def test_compact_layout_keeps_the_gate_summary():
    app = make_app(gates_snapshot())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one(GatesPanel).display
        text = screen_text(app)
        assert "Gates    2 closed · ▲ 1 escalation · k1 3.2s, host 1.0s" in text


@async_test
async def test_goodput_shows_only_for_messages_of_several_calls():
    app = make_app(main_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.query_one(GoodputPanel).display
        assert app.query_one("#latency").display
        assert "Throttle" not in screen_text(app)
    app = make_app(message_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one(GoodputPanel).display
        assert not app.query_one("#latency").display  # p50/p99 stay in the run bar
        text = screen_text(app)
        assert "29.0 msg/s" in text and "27.8 msg/s" in text
        assert "done 5 096 · failed 3 · shed 41" in text
        assert "calls wasted 9" in text
        assert "auto 29.3 msg/s · excess queue" in text


@async_test
async def test_g_cycles_the_throttle_off_auto_fixed_off():
    snap = message_snapshot()
    host = FakeHost(
        dataclasses.replace(
            snap, messages=dataclasses.replace(snap.messages, throttle_mode="off", throttle_rate=0.0)
        )
    )
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        assert "g" in app.screen.active_bindings
        await pilot.press("g")
        assert host.commands[-1] == SetThrottle("auto")
        assert throttle_state(host) == ("auto", 30.0)  # capacity 120/s over 4 calls
        app._tick()  # the auto rate arrives with the next snapshot
        await pilot.press("g")
        assert host.commands[-1] == SetThrottle(30.0)
        assert throttle_state(host) == ("fixed", 30.0)
        assert "fixed 30.0 msg/s" in screen_text(app)
        await pilot.press("g")
        assert host.commands[-1] == SetThrottle("off")
        assert throttle_state(host) == ("off", 0.0)
        assert "off (no limit)" in screen_text(app)


@async_test
async def test_g_fixes_the_throttle_at_its_current_auto_rate():
    host = FakeHost(message_snapshot())  # auto at 29.3 msg/s
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        assert host.commands[-1] == SetThrottle(29.3)
        await pilot.press("g", "g")  # fast presses build on what was just sent
        assert host.commands[-2:] == [SetThrottle("off"), SetThrottle("auto")]


@async_test
async def test_shift_g_sets_an_exact_throttle_through_modal():
    host = FakeHost(message_snapshot())
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("G")
        assert isinstance(app.screen, ThrottleScreen)
        app.screen.query_one("#throttle-input").value = "12.5 msg/s"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ThrottleScreen)
        assert host.commands[-1] == SetThrottle(12.5)
        assert throttle_state(host) == ("fixed", 12.5)
        assert "fixed 12.5 msg/s" in screen_text(app)


@async_test
async def test_bad_throttle_input_gives_notice_and_changes_nothing():
    host = FakeHost(message_snapshot())
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("G")
        app.screen.query_one("#throttle-input").value = "lots"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ThrottleScreen)
        assert any("or messages per second, got 'lots'" in text for text in notices(app))
        app.screen.query_one("#throttle-input").value = "0"
        await pilot.press("enter")
        assert any("must be above 0" in text for text in notices(app))
        await pilot.press("escape")
        assert not isinstance(app.screen, ThrottleScreen)
        assert host.commands == []
        assert throttle_state(host) == ("auto", 29.3)


@async_test
async def test_throttle_keys_on_a_plain_run_give_a_notice_and_send_nothing():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        bindings = app.screen.active_bindings
        assert "g" not in bindings and "G" not in bindings  # hidden from the footer
        for press in ("g", "G", "palette"):
            app.clear_notifications()
            if press == "palette":
                await app.run_control("throttle_cycle")  # as the command palette does
                await pilot.pause()
            else:
                await pilot.press(press)
                await pilot.pause()  # the key's action posts the notice: let the app process it
            assert any("message runs only" in text for text in notices(app)), press
            assert not isinstance(app.screen, ThrottleScreen)
        assert host.commands == []


@async_test
async def test_throttle_ids_take_a_keymap():
    host = FakeHost(message_snapshot())
    app = make_app(host=host, keymap={"throttle_cycle": "y", "throttle_set": "Y"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("y")
        assert host.commands[-1] == SetThrottle(29.3)
        await pilot.press("Y")
        assert isinstance(app.screen, ThrottleScreen)
        assert not any("unknown action" in text for text in notices(app))


@pytest.mark.parametrize(
    "text, expected",
    [("25", 25.0), (" 12.5 msg/s ", 12.5), ("40/s", 40.0), ("AUTO", "auto"), ("off", "off")],
)
def test_parse_throttle_accepts_rates_and_modes(text: str, expected):
    assert parse_throttle(text) == expected


@pytest.mark.parametrize("text", ["", "fast", "0", "-3", "nan", "inf", "1e9"])
def test_parse_throttle_rejects_bad_values(text: str):
    with pytest.raises(ValueError):
        parse_throttle(text)


@async_test
async def test_duration_ends_the_app_like_q_and_returns_the_final_snapshot():
    host = FakeHost()  # 183.4 s into the run
    app = make_app(host=host, duration_s=190)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.is_running and host.stop_calls == 0
        host.advance(6.0)  # 189.4 s
        app.pull_snapshot()
        await pilot.pause()
        assert host.stop_calls == 0
        host.advance(1.0)  # 190.4 s: over
        app.pull_snapshot()
        await pilot.pause()
        app.pull_snapshot()  # a late tick does not stop twice
        await pilot.pause()
    assert host.stop_calls == 1
    assert app.return_value is not None
    assert app.return_value.phase == "stopped"
    assert app.return_value == host.snapshot()


@async_test
async def test_duration_already_passed_quits_at_once():
    host = FakeHost()
    app = make_app(host=host, duration_s=10)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
    assert host.stop_calls == 1
    assert app.return_value.phase == "stopped"


@async_test
async def test_m_opens_the_cluster_and_follows_it_only_on_a_run_with_a_shared_store():
    host = FakeHost()
    app = make_app(host=host)
    async with app.run_test(size=SIZE) as pilot:
        assert "m" not in app.screen.active_bindings  # no shared store: hidden from the footer
        await pilot.press("m")
        assert not isinstance(app.screen, ClusterScreen)
        assert any("shared store" in text for text in notices(app))
        assert "Cluster" not in screen_text(app)
    host = FakeHost(cluster_snapshot())
    app = make_app(host=host)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert re.search(r"Cluster ×3 +1 234 waiting · 12 claimed", screen_text(app))
        assert "Gates" in screen_text(app)  # not pushed out of the panel by the cluster line
        await pilot.press("m")
        assert isinstance(app.screen, ClusterScreen)
        text = screen_text(app)
        assert "deck-b:977:01aa" in text and "unreachable" in text and "1 234 waiting" in text
        view = host.base.cluster
        gone = dataclasses.replace(view, members=view.members[:2], waiting=17)  # deck-c expired
        host.base = dataclasses.replace(host.base, cluster=gone)
        app.pull_snapshot()
        await pilot.pause()
        text = screen_text(app)
        assert "2 members" in text and "deck-c" not in text and "17 waiting" in text
        for secret in SECRETS.values():
            assert secret not in text
        await pilot.press("escape")
        assert not isinstance(app.screen, ClusterScreen)


@async_test
async def test_the_job_line_shows_for_a_job_of_known_size_only():
    """A job's snapshot shows the Job line; the same run as endless work (no size) hides it."""
    job = job_snapshot()
    app = make_app(job)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        bar = app.query_one("#job")
        assert bar.display and "20 849 of 50 000 (41%) · ETA 4m22s · least 4m03s" in screen_text(app)
        app.show_snapshot(dataclasses.replace(job, progress=None, elapsed_s=job.elapsed_s + 1))
        await pilot.pause()
        assert not bar.display and "ETA" not in screen_text(app)
