"""The ratedeck console: a live view of a running engine, and its controls.

The app pulls an immutable `Snapshot` from the host every `refresh_s` and hands
it down to the panels as attributes; controls go back up as command objects
through `host.send`. Widgets never see the host.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any, ClassVar

import tomli_w
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Footer

from ratedeck.engine.commands import (
    Command,
    PauseAll,
    PauseKey,
    ResumeAll,
    ResumeKey,
    SetArrivalRate,
    SetBackpressure,
    SetHeadroom,
    SetThrottle,
)
from ratedeck.engine.snapshot import Snapshot
from ratedeck.host.protocol import EngineHost

from .screens.headroom import HeadroomScreen
from .screens.help import HelpScreen
from .screens.palette import ControlsProvider
from .screens.throttle import ThrottleScreen
from .themes import DEFAULT_THEME, load_themes
from .widgets import numbers
from .widgets.event_log import EventLog
from .widgets.gates import GatesPanel, has_history
from .widgets.goodput import GoodputPanel, is_message_run
from .widgets.keys_table import KeysTable
from .widgets.latency import LatencyPanel
from .widgets.limiter import LimiterPanel
from .widgets.queues import QueuesPanel
from .widgets.run_bar import RunBar
from .widgets.throughput import ThroughputPanel

HEADROOM_STEP_MS = 5.0
ARRIVAL_STEP = 0.10
# Below either size the secondary panels are hidden (see ratedeck.tcss).
COMPACT_WIDTH = 100
COMPACT_HEIGHT = 32
# Controls that still make sense while the engine drains.
_ALWAYS_AVAILABLE = {"show_help", "quit", "next_theme", "command_palette"}

_HEADROOM = Binding.Group("headroom", compact=True)
_ARRIVAL = Binding.Group("arrival", compact=True)
_THROTTLE = Binding.Group("throttle", compact=True)
# Controls of the entry throttle: only a message workload has one.
_THROTTLE_ACTIONS = {"throttle_cycle", "throttle_set"}


class RatedeckApp(App[Snapshot]):
    """The live console over an `EngineHost`.

    `run()` returns the engine's final `Snapshot` (from `host.stop()`) when
    the operator quits with q or Ctrl+C, or when a snapshot's `elapsed_s`
    reaches `duration_s` (the same graceful drain). `keymap` maps binding
    ids (see `BINDINGS`) to keys; `theme` names a theme from the themes folder.
    """

    CSS_PATH = "ratedeck.tcss"
    TITLE = "ratedeck"
    COMMANDS = App.COMMANDS | {ControlsProvider}

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "question_mark", "show_help", "Help", id="show_help", tooltip="List every key and what it does"
        ),
        # Quit comes second so a narrow footer (or a message run's extra
        # controls) never pushes it off the edge.
        Binding("q", "quit", "Quit", id="quit", tooltip="Drain in-flight work, then quit"),
        Binding(
            "space",
            "pause_key",
            "Pause key",
            id="pause_key",
            tooltip="Pause or resume the key under the cursor",
        ),
        Binding(
            "P",
            "pause_all",
            "Pause all",
            id="pause_all",
            tooltip="Pause every key, or resume them all if all are paused",
        ),
        Binding(
            "plus",
            "headroom_up",
            "Headroom +5 ms",
            id="headroom_up",
            group=_HEADROOM,
            tooltip="Raise headroom by 5 ms (switches to a fixed headroom)",
        ),
        Binding(
            "minus",
            "headroom_down",
            "Headroom -5 ms",
            id="headroom_down",
            group=_HEADROOM,
            tooltip="Lower headroom by 5 ms (switches to a fixed headroom)",
        ),
        Binding(
            "h", "headroom_set", "Headroom…", id="headroom_set", tooltip="Type an exact fixed headroom in ms"
        ),
        Binding(
            "a",
            "headroom_adaptive",
            "Adaptive",
            id="headroom_adaptive",
            tooltip="Let the limiter learn the headroom again",
        ),
        Binding(
            "b",
            "toggle_backpressure",
            "Backpressure",
            id="toggle_backpressure",
            tooltip="Turn the main queue's backpressure limit on or off",
        ),
        Binding(
            "right_square_bracket",
            "rate_up",
            "Arrival +10%",
            id="rate_up",
            group=_ARRIVAL,
            tooltip="Raise the arrival rate by 10%",
        ),
        Binding(
            "left_square_bracket",
            "rate_down",
            "Arrival -10%",
            id="rate_down",
            group=_ARRIVAL,
            tooltip="Lower the arrival rate by 10%",
        ),
        Binding(
            "g",
            "throttle_cycle",
            "Throttle mode",
            id="throttle_cycle",
            group=_THROTTLE,
            tooltip="Cycle the throttle off → auto → fixed (message runs)",
        ),
        Binding(
            "G",
            "throttle_set",
            "Throttle…",
            id="throttle_set",
            group=_THROTTLE,
            tooltip="Type an exact entry throttle in messages/s (message runs)",
        ),
        Binding(
            "s",
            "save_profile",
            "Save",
            id="save_profile",
            tooltip="Save the current settings to the profile file",
        ),
        Binding("t", "next_theme", "Theme", id="next_theme", tooltip="Switch to the next theme"),
        # Ctrl+C is what operators press under stress; it must drain like q,
        # from any screen, so it is a priority binding. Pressed again during
        # the drain, it stops at once.
        Binding("ctrl+c", "quit('interrupt')", "Quit", id="quit_interrupt", show=False, priority=True),
    ]

    def __init__(
        self,
        host: EngineHost,
        *,
        theme: str | None = None,
        keymap: dict[str, str] | None = None,
        profile_path: str = "ratedeck-profile.toml",
        refresh_s: float = 0.25,
        title: str = "ratedeck",
        themes_dir: str | Path | None = None,
        duration_s: float | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        self.profile_path = profile_path
        self.refresh_s = refresh_s
        self.title = title
        self.duration_s = duration_s
        self.snapshot: Snapshot | None = None
        self._requested_theme = theme
        self._requested_keymap = dict(keymap or {})
        self._startup_notices: list[tuple[str, str]] = []
        self._draining = False
        self._stopping_at_once = False
        self._signals: list[int] = []
        self._snapshot_failed = False
        self._keymap_in_force: dict[str, str] = {}  # binding id -> keys, as given to set_keymap
        self._exiting = False
        # Values sent but maybe not yet visible in a snapshot, so that fast
        # repeated +/+ or ]/] presses build on each other.
        self._pending_headroom: float | None = None
        self._pending_rate: float | None = None
        self._pending_throttle: tuple[str, float] | None = None
        self._binding_state: tuple[bool, bool, bool] | None = None
        themes, problems = load_themes(themes_dir)
        for problem in problems:
            self._startup_notices.append((f"Theme file skipped: {problem}", "error"))
        self.ratedeck_themes: list[str] = []
        for loaded in themes:
            self.register_theme(loaded)
            self.ratedeck_themes.append(loaded.name)
        if DEFAULT_THEME in self.ratedeck_themes:
            # The default leads the `t` cycle whatever the file order.
            self.ratedeck_themes.remove(DEFAULT_THEME)
            self.ratedeck_themes.insert(0, DEFAULT_THEME)

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield RunBar(id="run-bar")
        with Horizontal(id="top"):
            yield ThroughputPanel(id="throughput", classes="panel")
            yield GoodputPanel(id="goodput", classes="panel")
            yield LatencyPanel(id="latency", classes="panel")
            yield QueuesPanel(id="queues", classes="panel")
        yield KeysTable(id="keys")
        yield GatesPanel(id="gates", classes="panel")
        with Horizontal(id="bottom"):
            yield EventLog(id="events", classes="panel")
            yield LimiterPanel(id="limiter", classes="panel")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Held once: while a modal is open, `query_one` would search the modal.
        self._run_bar = self.query_one(RunBar)
        self._limiter = self.query_one(LimiterPanel)
        self._panels = (
            self.query_one(ThroughputPanel),
            self.query_one(GoodputPanel),
            self.query_one(LatencyPanel),
            self.query_one(QueuesPanel),
            self._limiter,
            self.query_one(GatesPanel),
        )
        self._keys_table = self.query_one(KeysTable)
        self._event_log = self.query_one(EventLog)
        self._apply_theme_choice()
        self._apply_keymap()
        for message, severity in self._startup_notices:
            self.notify(message, severity=severity, timeout=10)  # type: ignore[arg-type]
        self._set_compact(self.size.width, self.size.height)
        self._keys_table.border_title = "Keys"
        self._keys_table.focus()
        self.pull_snapshot()
        self.set_interval(self.refresh_s, self._tick)
        self._catch_signals()

    # ---------------------------------------------------------------- signals

    def _catch_signals(self) -> None:
        """SIGTERM, SIGHUP and SIGINT quit like q (drain, then leave with the terminal
        restored); a second one stops at once. Not under tests' headless runs."""
        if self.is_headless:
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                continue
            self._signals.append(sig)

    def _on_signal(self, sig: int) -> None:
        if self._draining:
            self._stop_at_once()
        else:
            self._begin_quit(f"{signal.Signals(sig).name} received")

    def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        self._signals.clear()

    def on_resize(self, event: events.Resize) -> None:
        self._set_compact(event.size.width, event.size.height)

    def _set_compact(self, width: int, height: int) -> None:
        compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
        self.set_class(compact, "-compact")
        # The first Resize arrives before on_mount has found the table, which
        # then applies the layout itself. (Not `query`: while a modal is open
        # it searches the modal, and the table would miss the resize.)
        table: KeysTable | None = getattr(self, "_keys_table", None)
        if table is not None:
            table.compact = compact
        limiter: LimiterPanel | None = getattr(self, "_limiter", None)
        if limiter is not None:
            limiter.compact = compact

    def _apply_theme_choice(self) -> None:
        wanted = self._requested_theme or DEFAULT_THEME
        if wanted not in self.available_themes:
            if self._requested_theme is not None:
                self.notify(
                    f"Unknown theme {wanted!r}; using {DEFAULT_THEME}. "
                    f"Known: {', '.join(self.ratedeck_themes) or 'none'}",
                    severity="warning",
                    timeout=10,
                )
            wanted = DEFAULT_THEME
        if wanted not in self.available_themes:
            # The default theme file itself is broken: fall back to Textual's.
            wanted = "textual-dark"
        self.theme = wanted

    def _apply_keymap(self) -> None:
        known = {binding.id for binding in self._control_bindings()}
        unknown = sorted(set(self._requested_keymap) - known)
        if unknown:
            self.notify(
                f"Keymap: unknown action id(s) {', '.join(unknown)}; known ids: {', '.join(sorted(known))}",
                severity="warning",
                timeout=10,
            )
        keymap = {key: value for key, value in self._requested_keymap.items() if key in known}
        if keymap:
            self.set_keymap(keymap)
            self._keymap_in_force = keymap

    # ---------------------------------------------------------------- data

    def _tick(self) -> None:
        # After a full refresh interval the snapshot is the truth again.
        self._pending_headroom = None
        self._pending_rate = None
        self._pending_throttle = None
        self.pull_snapshot()

    def exit(self, *args: Any, **kwargs: Any) -> None:
        """Exit as Textual does, remembering it so late timer ticks pull nothing."""
        self._exiting = True
        super().exit(*args, **kwargs)

    def pull_snapshot(self) -> None:
        """Fetch a snapshot from the host and hand it to every panel."""
        if self._exiting:  # a last timer tick while the app shuts down
            return
        try:
            snap = self.host.snapshot()
        except Exception as error:  # the host is someone else's code; keep the console up
            if not self._snapshot_failed:
                self.notify(f"Could not read the engine: {error}", severity="error")
            self._snapshot_failed = True
            return
        self._snapshot_failed = False
        self.show_snapshot(snap)

    def show_snapshot(self, snap: Snapshot) -> None:
        """Pass `snap` down to the panels (attributes down)."""
        self.snapshot = snap
        # Panels that only apply to some runs are shown by class (see ratedeck.tcss).
        self.set_class(is_message_run(snap), "-messages")
        self.set_class(has_history(snap.gates), "-gates")
        self._run_bar.snapshot = snap
        for panel in self._panels:
            panel.snapshot = snap
        self._keys_table.show_keys(snap.keys)
        self._event_log.events = snap.events
        state = (bool(snap.keys), snap.headroom_adaptive, is_message_run(snap))
        if state != self._binding_state:
            self._binding_state = state
            self.refresh_bindings()
        if self.duration_s is not None and snap.elapsed_s >= self.duration_s and not self._draining:
            self._begin_quit(f"{numbers.duration(self.duration_s)} run over")

    # ---------------------------------------------------------------- controls

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Dim controls that cannot apply now, so the footer tells the truth."""
        if action in _ALWAYS_AVAILABLE or action not in self._control_actions():
            return True
        if self._draining:
            return None
        snap = self.snapshot
        if action == "pause_key" and (snap is None or not snap.keys):
            return None
        if action == "headroom_adaptive" and snap is not None and snap.headroom_adaptive:
            return None
        if action in _THROTTLE_ACTIONS and not is_message_run(snap):
            return False  # hidden: a plain request run has no entry throttle
        return True

    def unavailable_reason(self, action: str) -> str | None:
        """Why control `action` cannot run now, or None if it can."""
        if self.check_action(action, ()):
            return None
        if self._draining:
            return "Draining: controls are off until the engine stops"
        if action in _THROTTLE_ACTIONS:
            return (
                "The entry throttle applies to message runs only "
                "(messages of several calls, set in the config's messages table)"
            )
        if action == "pause_key":
            return "No keys to pause yet"
        if action == "headroom_adaptive":
            return "Headroom is already adaptive"
        return "Not available now"

    async def run_control(self, action: str) -> None:
        """Run a control as its key would, or say why it cannot run (command palette)."""
        reason = self.unavailable_reason(action)
        if reason is not None:
            self.notify(reason, severity="warning")
            return
        await self.run_action(action)

    def on_key(self, event: events.Key) -> None:
        # A hidden binding never reaches its action, so a throttle key pressed
        # on a plain run would do nothing silently; say why instead.
        if self.screen is not self.screen_stack[0] or self._draining:
            return
        for binding in self._control_bindings():
            if binding.action in _THROTTLE_ACTIONS and event.key in self._keys_for(binding):
                reason = self.unavailable_reason(binding.action)
                if reason is not None:
                    event.stop()
                    self.notify(reason, severity="warning")
                return

    def _keys_for(self, binding: Binding) -> set[str]:
        assert binding.id is not None
        keys = self._keymap_in_force.get(binding.id, binding.key)
        return {key.strip() for key in keys.split(",")}

    def _control_bindings(self) -> list[Binding]:
        return [binding for binding in Binding.make_bindings(self.BINDINGS) if binding.id]

    def _control_actions(self) -> set[str]:
        return {binding.action for binding in self._control_bindings()}

    def control_rows(self) -> list[tuple[str, str, str, str]]:
        """(keys as mapped now, binding id, description, action) for each control."""
        rows: list[tuple[str, str, str, str]] = []
        keymap = self._keymap_in_force
        for binding in self._control_bindings():
            assert binding.id is not None
            keys = keymap.get(binding.id, binding.key).split(",")
            shown = " / ".join(self.get_key_display(binding.with_key(key.strip())) for key in keys)
            description = binding.tooltip or binding.description
            if binding.id == "quit_interrupt":
                description = "Quit like q (drain, then exit)"
            rows.append((shown, binding.id, description, binding.action))
        return rows

    def _send(self, command: Command, message: str) -> bool:
        try:
            self.host.send(command)
        except Exception as error:  # a refused command must not take the console down
            self.notify(f"{message} failed: {error}", severity="error")
            return False
        self.notify(message, timeout=3)
        self.pull_snapshot()
        return True

    def action_pause_key(self) -> None:
        table = self._keys_table
        label = table.selected_key
        row = table.key_row(label) if label else None
        if row is None:
            self.notify("No key selected", severity="warning")
            return
        if row.state == "blocked":
            self.notify(
                f"{label} is blocked by the server; it cannot be paused or resumed", severity="warning"
            )
            return
        if row.state == "paused":
            self._send(ResumeKey(row.label), f"Resumed {row.label}")
        else:
            self._send(PauseKey(row.label), f"Paused {row.label}")

    def action_pause_all(self) -> None:
        keys = [row for row in (self.snapshot.keys if self.snapshot else ()) if row.state != "blocked"]
        if keys and all(row.state == "paused" for row in keys):
            self._send(ResumeAll(), "Resumed all keys")
        else:
            self._send(PauseAll(), "Paused all keys")

    def _current_headroom(self) -> float:
        if self._pending_headroom is not None:
            return self._pending_headroom
        return self.snapshot.headroom_ms if self.snapshot else 0.0

    def _set_fixed_headroom(self, value: float) -> None:
        value = max(0.0, round(value, 1))
        if self._send(SetHeadroom(value), f"Headroom fixed at {value:g} ms"):
            self._pending_headroom = value

    def action_headroom_up(self) -> None:
        self._set_fixed_headroom(self._current_headroom() + HEADROOM_STEP_MS)

    def action_headroom_down(self) -> None:
        self._set_fixed_headroom(self._current_headroom() - HEADROOM_STEP_MS)

    def action_headroom_set(self) -> None:
        def chosen(value: float | None) -> None:
            if value is not None:
                self._set_fixed_headroom(value)

        self.push_screen(HeadroomScreen(self._current_headroom()), chosen)

    def action_headroom_adaptive(self) -> None:
        if self._send(SetHeadroom(None), "Headroom adaptive"):
            self._pending_headroom = None

    def action_toggle_backpressure(self) -> None:
        on = not (self.snapshot.backpressure if self.snapshot else True)
        self._send(SetBackpressure(on), f"Backpressure {'on' if on else 'off'}")

    def _change_rate(self, factor: float) -> None:
        base = self._pending_rate
        if base is None:
            base = self.snapshot.arrival_rate if self.snapshot else 0.0
        # From zero a percentage goes nowhere; start at 1/s.
        rate = round(base * factor, 2) if base > 0 else (1.0 if factor > 1 else 0.0)
        if self._send(SetArrivalRate(rate), f"Arrival rate {rate:g}/s"):
            self._pending_rate = rate

    def action_rate_up(self) -> None:
        self._change_rate(1 + ARRIVAL_STEP)

    def action_rate_down(self) -> None:
        self._change_rate(1 - ARRIVAL_STEP)

    def _current_throttle(self) -> tuple[str, float]:
        if self._pending_throttle is not None:
            return self._pending_throttle
        snap = self.snapshot
        if snap is None or snap.messages is None:
            return ("off", 0.0)
        return (snap.messages.throttle_mode, snap.messages.throttle_rate)

    def _set_throttle(self, value: str | float) -> None:
        if isinstance(value, str):
            # "auto" follows live capacity; its rate shows with the next snapshot.
            pending = (value, 0.0)
            message = "Entry throttle off" if value == "off" else "Entry throttle auto (capacity / calls)"
        else:
            value = round(value, 2)
            pending = ("fixed", value)
            message = f"Entry throttle fixed at {value:g} msg/s"
        if self._send(SetThrottle(value), message):
            self._pending_throttle = pending

    def action_throttle_cycle(self) -> None:
        mode, rate = self._current_throttle()
        if mode == "off":
            self._set_throttle("auto")
        elif mode == "auto":
            snap = self.snapshot
            if rate <= 0 and snap is not None and snap.messages is not None:
                rate = snap.capacity_tps / snap.messages.calls_per_message
            if rate <= 0:
                self.notify(
                    "No capacity known yet to fix the throttle at; turning it off", severity="warning"
                )
                self._set_throttle("off")
                return
            self._set_throttle(rate)
        else:
            self._set_throttle("off")

    def action_throttle_set(self) -> None:
        def chosen(value: str | float | None) -> None:
            if value is not None:
                self._set_throttle(value)

        mode, rate = self._current_throttle()
        snap = self.snapshot
        if rate <= 0 and snap is not None and snap.messages is not None:
            rate = round(snap.capacity_tps / snap.messages.calls_per_message, 2)
        self.push_screen(ThrottleScreen(mode, rate), chosen)

    def action_save_profile(self) -> None:
        path = Path(self.profile_path)
        try:
            text = tomli_w.dumps(self.host.effective_config())
        except Exception as error:  # bad data from the host: say so, keep running
            self.notify(f"Settings could not be turned into TOML: {error}", severity="error")
            return
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as error:
            self.notify(
                f"Could not save settings to {path}: {error.strerror or error}",
                title="Not saved",
                severity="error",
                timeout=8,
            )
            return
        self.notify(f"Settings saved to {path.resolve()}", title="Saved")

    def use_theme(self, name: str) -> None:
        """Switch to theme `name` and say so."""
        self.theme = name
        self.notify(f"Theme {name}", timeout=2)

    def action_next_theme(self) -> None:
        names = self.ratedeck_themes or [self.theme]
        index = names.index(self.theme) if self.theme in names else -1
        self.use_theme(names[(index + 1) % len(names)])

    def action_show_help(self) -> None:
        rows = [(keys, binding_id, description) for keys, binding_id, description, _ in self.control_rows()]
        self.push_screen(HelpScreen(rows))

    async def action_quit(self, how: str = "key") -> None:
        """Drain gracefully: stop the engine, then exit with its final snapshot.

        During the drain, Ctrl+C (`how == "interrupt"`) stops at once; q only says so.
        """
        if self._draining:
            if how == "interrupt":
                self._stop_at_once()
            else:
                self.notify("Still draining… (Ctrl+C stops at once)", timeout=2)
            return
        self._begin_quit("Quitting")

    def _stop_at_once(self) -> None:
        """Cut the drain short: what is left is reported as queued or in flight."""
        abort = getattr(self.host, "abort", None)
        if abort is None:  # a host that can only drain
            self.notify("Still draining…", timeout=2)
            return
        if self._stopping_at_once:
            return
        self._stopping_at_once = True
        self.notify("stopping at once…", timeout=30)
        self.run_worker(self._abort(abort), name="abort", group="abort")

    async def _abort(self, abort) -> None:
        try:
            final = await asyncio.get_running_loop().run_in_executor(None, abort)
        except Exception as error:
            self.exit(self.snapshot, return_code=1, message=f"ratedeck: stopping the engine failed: {error}")
            return
        self.exit(final)

    def _begin_quit(self, title: str) -> None:
        self._draining = True
        self._run_bar.draining = True
        self.refresh_bindings()
        self.notify("draining… waiting for in-flight requests", title=title, timeout=30)
        self.run_worker(self._drain(), name="drain", exclusive=True)

    async def _drain(self) -> None:
        try:
            final = await self.host.stop()
        except Exception as error:  # still leave, and say why, with what we last saw
            self.exit(self.snapshot, return_code=1, message=f"ratedeck: stopping the engine failed: {error}")
            return
        self.exit(final)
