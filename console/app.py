"""The ratedeck console: a live view of a running engine, and its controls.

The app pulls an immutable `Snapshot` from the host every `refresh_s` and hands
it down to the panels as attributes; controls go back up as command objects
through `host.send`. Widgets never see the host.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import tomli_w
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from ratedeck.core.files import private_dir, private_write_text
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

from .app_parts import Charts, KeysPacing, MainWidgets, Quitting
from .screens.cluster import ClusterScreen
from .screens.confirm import ConfirmScreen
from .screens.errors import ErrorsScreen
from .screens.headroom import HeadroomScreen
from .screens.help import HelpScreen, HelpSections
from .screens.key_detail import KeyDetailScreen
from .screens.palette import ControlsProvider
from .screens.throttle import ThrottleScreen
from .steering import Pending, RateSteps
from .themes import DEFAULT_THEME, load_themes
from .widgets import numbers
from .widgets.clients import ClientsPanel
from .widgets.endpoints import EndpointsPanel
from .widgets.errors import ErrorsPanel
from .widgets.event_log import EventLog
from .widgets.gates import GatesPanel, has_history
from .widgets.goodput import GoodputPanel, is_message_run
from .widgets.job import JobBar
from .widgets.keys_table import KeysTable
from .widgets.latency import LatencyPanel
from .widgets.limiter import LimiterPanel
from .widgets.queues import QueuesPanel
from .widgets.run_bar import RunBar
from .widgets.throughput import ThroughputPanel

HEADROOM_STEP_MS = 5.0
ARRIVAL_FACTOR = 1.1
# Below either size the secondary panels are hidden (see ratedeck.tcss).
COMPACT_WIDTH = 100
COMPACT_HEIGHT = 32
# From this size up the errors panel sits beside the keys and the charts grow.
WIDE_WIDTH = 160
WIDE_HEIGHT = 45
# The keys table's figures are brought up to date at most this often (every
# changed cell repaints the whole table); a key's state change shows at once,
# and the header, charts and gauges keep the pull rate.
KEYS_REFRESH_S = 1.0
# Views, not controls: they still make sense while the engine drains.
_VIEW_ACTIONS = {"chart_span", "show_errors", "show_cluster", "filter_keys", "sort_next", "sort_reverse"}
# Views of the main screen's keys table and charts: hidden on other screens.
_MAIN_ONLY = {"chart_span", "filter_keys", "sort_next", "sort_reverse"}
_ALWAYS_AVAILABLE = {"show_help", "quit", "next_theme", "command_palette"} | _VIEW_ACTIONS

_HEADROOM = Binding.Group("headroom", compact=True)
_ARRIVAL = Binding.Group("arrival", compact=True)
_THROTTLE = Binding.Group("throttle", compact=True)
# Controls of the entry throttle: only a message workload has one.
_THROTTLE_ACTIONS = {"throttle_cycle", "throttle_set"}
_SECTIONS = (
    (
        "Keys and view",
        (
            "filter_keys",
            "sort_next",
            "sort_reverse",
            "show_errors",
            "show_cluster",
            "chart_span",
            "next_theme",
        ),
    ),
    ("Traffic", ("pause_key", "pause_all", "rate_up", "rate_down", "toggle_backpressure")),
    (
        "Headroom and throttle",
        (
            "headroom_up",
            "headroom_down",
            "headroom_set",
            "headroom_adaptive",
            "throttle_cycle",
            "throttle_set",
        ),
    ),
    ("Run", ("save_profile", "show_help", "quit", "quit_interrupt")),
)
# Keys of the table and the screens, not remappable: listed in help as they are.
_FIXED_KEYS = (
    ("↑ ↓ / j k", "move between keys"),
    ("PgUp PgDn", "a page of keys up / down"),
    ("Home End", "first / last key"),
    ("Enter", "open the key under the cursor (window, latency, errors, gates); n / p next / previous"),
    ("click header", "sort by that column; click again to reverse"),
    ("Esc", "close a screen or clear the filter"),
)


class MainScreen(Screen):
    """The console's main screen (the app composes into it)."""


class FilterInput(Input):
    """The keys filter: typing filters at once; Enter keeps it, Esc clears it."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Submitted(self, ""))


class RatedeckApp(App[Snapshot]):
    """The live console over an `EngineHost`.

    `run()` returns the engine's final `Snapshot` (from `host.stop()`) when
    the operator quits with q or Ctrl+C, or when a snapshot's `elapsed_s`
    reaches `duration_s` (the same graceful drain). `keymap` maps binding
    ids (see `BINDINGS`) to keys; `theme` names a theme from the themes folder.
    Snapshots are pulled every `refresh_s`; the keys table's figures follow at
    most every `keys_refresh_s` (state changes at once).
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
            "h",
            "headroom_set",
            "Headroom…",
            id="headroom_set",
            show=False,
            tooltip="Type an exact fixed headroom in ms",
        ),
        Binding(
            "a",
            "headroom_adaptive",
            "Adaptive",
            id="headroom_adaptive",
            show=False,
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
            "Arrival ×1.1",
            id="rate_up",
            group=_ARRIVAL,
            tooltip="Raise the arrival rate ×1.1 (] then [ returns exactly to the start)",
        ),
        Binding(
            "left_square_bracket",
            "rate_down",
            "Arrival ÷1.1",
            id="rate_down",
            group=_ARRIVAL,
            tooltip="Lower the arrival rate ÷1.1 (undoes one ])",
        ),
        # A priority binding: it acts before the keys typed right after it are
        # handed on, so "/k3" typed (or pasted) at once all lands in the filter.
        # check_action lets "/" through to any text field.
        Binding(
            "slash",
            "filter_keys",
            "Filter",
            id="filter_keys",
            priority=True,
            tooltip="Filter the keys table (words in label, state, status, error)",
        ),
        Binding(
            "e",
            "show_errors",
            "Errors",
            id="show_errors",
            tooltip="Errors by status and cause, with the last masked body",
        ),
        Binding(
            "m",
            "show_cluster",
            "Cluster",
            id="show_cluster",
            tooltip="Cluster members and the shared queues (--store redis://...)",
        ),
        Binding(
            "z", "chart_span", "Span", id="chart_span", tooltip="Chart time span: 1 m → 5 m → the whole run"
        ),
        Binding("o", "sort_next", "Sort", id="sort_next", tooltip="Sort the keys by the next column"),
        Binding(
            "O",
            "sort_reverse",
            "Reverse",
            id="sort_reverse",
            show=False,
            tooltip="Reverse the keys' sort order",
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
            tooltip="Save the current settings as a TOML profile (asks before overwriting)",
        ),
        Binding("t", "next_theme", "Theme", id="next_theme", show=False, tooltip="Switch to the next theme"),
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
        profile_path: str = "ratedeck-profile.toml",  # the runner passes core.paths.profile_save_path
        refresh_s: float = 0.25,
        title: str = "ratedeck",
        themes_dir: str | Path | None = None,
        duration_s: float | None = None,
        keys_refresh_s: float = KEYS_REFRESH_S,
        on_hangup: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.host = host
        # SIGHUP: the terminal may be gone, and then Textual's own shutdown waits
        # on writes to it forever: the runner's callback is a watchdog that, if
        # the ordinary quit has not finished in time, drains the engine, writes
        # the report and ends the process (from its own thread).
        self.on_hangup = on_hangup
        self.profile_path = profile_path
        self.refresh_s = refresh_s
        self.title = title
        self.duration_s = duration_s
        self.snapshot: Snapshot | None = None
        self._requested_theme = theme
        self._requested_keymap = dict(keymap or {})
        self._startup_notices: list[tuple[str, str]] = []
        self._quit = Quitting()
        self._snapshot_failed = False
        self._keymap_in_force: dict[str, str] = {}  # binding id -> keys, as given to set_keymap
        # Held once mounted (a Resize may come first).
        self._main: MainWidgets | None = None
        # Values sent but maybe not yet visible in a snapshot, so that fast
        # repeated +/+, ]/] or space/space presses build on each other.
        self.pending = Pending()
        self.rate_steps = RateSteps(ARRIVAL_FACTOR)
        self._binding_state: tuple[bool, bool, bool, bool] | None = None
        self._charts = Charts()
        self._keys_pacing = KeysPacing(keys_refresh_s)
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
        yield JobBar(id="job")  # a job of known size only (App.-job)
        with Horizontal(id="top"):
            yield ThroughputPanel(id="throughput", classes="panel")
            yield GoodputPanel(id="goodput", classes="panel")
            yield LatencyPanel(id="latency", classes="panel")
            yield QueuesPanel(id="queues", classes="panel")
        with Horizontal(id="middle"):
            with Vertical(id="keys-box"):
                with Horizontal(id="filter-bar"):
                    yield Static("[b $text-accent]/[/] filter", id="filter-label")
                    yield FilterInput(
                        placeholder="words of label, state, status or error · Enter keep · Esc clear",
                        id="key-filter",
                    )
                yield KeysTable(id="keys")
            yield ErrorsPanel(id="errors-panel", classes="panel")
        yield GatesPanel(id="gates", classes="panel")
        yield EndpointsPanel(id="endpoints", classes="panel")  # a pool of endpoints only (App.-endpoints)
        yield ClientsPanel(id="clients", classes="panel")  # a gateway's only (App.-clients)
        with Horizontal(id="bottom"):
            yield EventLog(id="events", classes="panel")
            yield LimiterPanel(id="limiter", classes="panel")
        yield Footer(compact=True, show_command_palette=False)

    def get_default_screen(self) -> Screen:
        return MainScreen(id="_default")

    def on_mount(self) -> None:
        self._main = MainWidgets.find(self, FilterInput)
        self.main.filter_bar.display = False
        self._apply_theme_choice()
        self._apply_keymap()
        for message, severity in self._startup_notices:
            self.notify(message, severity=severity, timeout=10)  # type: ignore[arg-type]
        self._set_compact(self.size.width, self.size.height)
        self.main.keys_table.border_title = "Keys · Enter details · / filter · o sort"
        self.main.keys_table.focus()
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
            self._quit.signals.append(sig)

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGHUP and self.on_hangup is not None and not self._quit.draining:
            # Quit as for q; if the terminal is gone and that never finishes, the
            # runner's watchdog writes the report and ends the process.
            threading.Thread(target=self.on_hangup, name="ratedeck-hangup", daemon=True).start()
        if self._quit.draining:
            self._stop_at_once()
        else:
            self._begin_quit(f"{signal.Signals(sig).name} received")

    def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._quit.signals:
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        self._quit.signals.clear()

    def on_resize(self, event: events.Resize) -> None:
        self._set_compact(event.size.width, event.size.height)

    def _set_compact(self, width: int, height: int) -> None:
        compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
        self.set_class(compact, "-compact")
        self.set_class(not compact and width >= WIDE_WIDTH and height >= WIDE_HEIGHT, "-wide")
        # The first Resize arrives before on_mount has found the table, which
        # then applies the layout itself. (Not `query`: while a modal is open
        # it searches the modal, and the table would miss the resize.)
        if self._main is not None:
            self._main.set_compact(compact)

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
        known = {binding.id for binding in self._control_bindings() if binding.id}
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
        self.pull_snapshot()

    def exit(self, *args: Any, **kwargs: Any) -> None:
        """Exit as Textual does, remembering it so late timer ticks pull nothing."""
        self._quit.exiting = True
        super().exit(*args, **kwargs)

    def pull_snapshot(self) -> None:
        """Fetch a snapshot from the host and hand it to every panel."""
        if self._quit.exiting:  # a last timer tick while the app shuts down
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
        """Pass `snap` down to the panels (attributes down).

        A host that has published nothing new hands back the same object:
        then nothing is redrawn.
        """
        if snap is self.snapshot:
            return
        self.snapshot = snap
        # Panels that only apply to some runs are shown by class (see ratedeck.tcss).
        self.set_class(is_message_run(snap), "-messages")
        self.set_class(has_history(snap.gates), "-gates")
        self.set_class(snap.clients is not None, "-clients")
        self.set_class(snap.progress is not None, "-job")
        self.set_class(bool(snap.endpoints), "-endpoints")
        self.main.run_bar.snapshot = snap
        self.main.job_bar.snapshot = snap
        for panel in self.main.panels:
            panel.snapshot = snap
        self._charts.history.ingest(snap)
        self._show_charts(snap)
        self._show_keys(snap)
        self.main.event_log.show(snap.events)
        for screen in self.screen_stack[1:]:
            if isinstance(screen, KeyDetailScreen | ErrorsScreen | ClusterScreen):
                screen.snapshot = snap
        state = (bool(snap.keys), snap.headroom_adaptive, is_message_run(snap), snap.cluster is not None)
        if state != self._binding_state:
            self._binding_state = state
            self.refresh_bindings()
        if self.duration_s is not None and snap.elapsed_s >= self.duration_s and not self._quit.draining:
            self._begin_quit(f"{numbers.duration(self.duration_s)} run over")

    @property
    def main(self) -> MainWidgets:
        """The main screen's widgets (found on mount)."""
        assert self._main is not None, "the app has not mounted"
        return self._main

    def _show_keys(self, snap: Snapshot) -> None:
        """Update the keys table as `KeysPacing` says, and not at all while a full
        screen covers it."""
        table = self.main.keys_table
        pacing = self._keys_pacing
        now = time.monotonic()
        states = tuple((row.label, row.state) for row in snap.keys)
        due = pacing.due(states, now)
        if self._on_other_screen():
            table.remember(snap.keys)
            pacing.now = True  # up to date the moment the table is back in view
            return
        if not due:
            table.remember(snap.keys)
            return
        pacing.shown(states, now)
        table.show_keys(snap.keys)

    @property
    def span(self) -> tuple[str, int | None]:
        """The charts' time span: (name, seconds or None for the whole run)."""
        return self._charts.span

    def _show_charts(self, snap: Snapshot) -> None:
        charts, main = self._charts, self.main
        label = charts.update(snap)
        main.throughput.show(snap, charts.tps, f"{label} · z")
        main.latency.show(snap, charts.latency, label)
        if is_message_run(snap):
            main.goodput.show_chart(charts.goodput, label)

    # ---------------------------------------------------------------- controls

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Dim controls that cannot apply now, so the footer tells the truth."""
        if action in _MAIN_ONLY and self._on_other_screen():
            return False  # the keys table and charts are not on this screen
        if action == "filter_keys" and (
            self.screen is not self.screen_stack[0] or isinstance(self.focused, Input)
        ):
            return False  # "/" is a character in a text field or a modal
        if action == "pause_key" and isinstance(self.screen, ErrorsScreen | ClusterScreen):
            return False  # no key under the cursor here (Enter opens one)
        if action == "show_cluster" and (self.snapshot is None or self.snapshot.cluster is None):
            return False  # hidden: no shared store, no cluster
        if action in _ALWAYS_AVAILABLE or action not in self._control_actions():
            return True
        if self._quit.draining:
            return None
        snap = self.snapshot
        if action == "pause_key" and (snap is None or not snap.keys):
            return None
        if action == "headroom_adaptive" and snap is not None and snap.headroom_adaptive:
            return None
        if action in _THROTTLE_ACTIONS and not is_message_run(snap):
            return False  # hidden: a plain request run has no entry throttle
        return True

    def _on_other_screen(self) -> bool:
        """True when a full screen (key detail, errors, cluster) covers the main one."""
        return any(
            isinstance(screen, KeyDetailScreen | ErrorsScreen | ClusterScreen)
            for screen in self.screen_stack[1:]
        )

    def unavailable_reason(self, action: str) -> str | None:
        """Why control `action` cannot run now, or None if it can."""
        if self.check_action(action, ()):
            return None
        if action in _MAIN_ONLY:
            return "Only on the main screen (Esc goes back to it)"
        if self._quit.draining:
            return "Draining: controls are off until the engine stops"
        if action in _THROTTLE_ACTIONS:
            return (
                "The entry throttle applies to message runs only "
                "(messages of several calls, set in the config's messages table)"
            )
        if action == "pause_key":
            return "No keys to pause yet"
        if action == "show_cluster":
            return "The cluster view needs a shared store (--store redis://host:port/db)"
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
        if self.screen is not self.screen_stack[0] or self._quit.draining:
            return
        for binding in self._control_bindings():
            if (
                binding.action in _THROTTLE_ACTIONS or binding.action == "show_cluster"
            ) and event.key in self._keys_for(binding):
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
                description = "Quit like q (drain, then exit); pressed again while draining, stop at once"
            rows.append((shown, binding.id, description, binding.action))
        return rows

    def help_sections(self) -> HelpSections:
        """The help screen's sections: every control by purpose, then the fixed keys."""
        by_id = {
            binding_id: (keys, binding_id, description)
            for keys, binding_id, description, _ in self.control_rows()
        }
        sections: HelpSections = []
        listed: set[str] = set()
        for title, ids in _SECTIONS:
            rows = [by_id[binding_id] for binding_id in ids if binding_id in by_id]
            listed.update(ids)
            sections.append((title, rows))
        rest = [row for binding_id, row in by_id.items() if binding_id not in listed]
        if rest:
            sections.append(("Other", rest))
        sections.append(("Table and screens", [(keys, "", description) for keys, description in _FIXED_KEYS]))
        return sections

    def _send(self, command: Command, message: str) -> bool:
        try:
            self.host.send(command)
        except Exception as error:  # a refused command must not take the console down
            self.notify(f"{message} failed: {error}", severity="error")
            return False
        self.notify(message, timeout=3)
        self._keys_pacing.now = True  # the operator's change shows at once
        self.pull_snapshot()
        return True

    # ---------------------------------------------------------------- keys

    def _paused(self, row) -> bool:
        """Whether `row`'s key is paused, counting a pause or resume just sent."""
        return bool(self.pending.get(f"pause:{row.label}", row.state == "paused"))

    def action_pause_key(self) -> None:
        label = self._detail_label() or self.main.keys_table.selected_key
        row = self.main.keys_table.key_row(label) if label else None
        if row is None:
            self.notify("No key selected", severity="warning")
            return
        if row.state == "blocked":
            self.notify(
                f"{label} is blocked by the server; it cannot be paused or resumed", severity="warning"
            )
            return
        if self._paused(row):
            if self._send(ResumeKey(row.label), f"Resumed {row.label}"):
                self.pending.set(f"pause:{row.label}", False)
        elif self._send(PauseKey(row.label), f"Paused {row.label}"):
            self.pending.set(f"pause:{row.label}", True)

    def _detail_label(self) -> str | None:
        screen = self.screen
        return screen.label if isinstance(screen, KeyDetailScreen) else None

    def action_pause_all(self) -> None:
        keys = [row for row in (self.snapshot.keys if self.snapshot else ()) if row.state != "blocked"]
        if keys and all(self._paused(row) for row in keys):
            if self._send(ResumeAll(), "Resumed all keys"):
                for row in keys:
                    self.pending.set(f"pause:{row.label}", False)
        elif self._send(PauseAll(), "Paused all keys"):
            for row in keys:
                self.pending.set(f"pause:{row.label}", True)

    def open_key_detail(self, label: str) -> None:
        """Show one key's detail screen (Enter on the table, or from the errors screen)."""
        if self.main.keys_table.key_row(label) is None:
            self.notify(f"No key {label} in the latest snapshot", severity="warning")
            return
        self.push_screen(KeyDetailScreen(label, self.snapshot, lambda: self.main.keys_table.shown_labels))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table is self.main.keys_table and event.row_key.value is not None:
            self.open_key_detail(event.row_key.value)

    def action_filter_keys(self) -> None:
        self.main.filter_bar.display = True
        # At once, not after the next refresh (as `focus()` does): keys typed
        # right after the / are already queued and must reach the filter.
        self.main.filter.screen.set_focus(self.main.filter)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input is self.main.filter:
            self.main.keys_table.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is not self.main.filter:
            return
        self.main.keys_table.set_filter(event.value)
        self.main.filter_bar.display = bool(event.value.strip())
        self.main.keys_table.screen.set_focus(self.main.keys_table)  # at once, as above

    def action_sort_next(self) -> None:
        self.main.keys_table.next_sort()
        self.notify(f"Keys sorted by {self.main.keys_table.sort_description()} (O reverses)", timeout=2)

    def action_sort_reverse(self) -> None:
        self.main.keys_table.reverse_sort()
        self.notify(f"Keys sorted by {self.main.keys_table.sort_description()}", timeout=2)

    def action_show_errors(self) -> None:
        if isinstance(self.screen, ErrorsScreen):
            return
        self.push_screen(ErrorsScreen(self.snapshot))

    def action_show_cluster(self) -> None:
        if isinstance(self.screen, ClusterScreen):
            return
        self.push_screen(ClusterScreen(self.snapshot))

    def action_chart_span(self) -> None:
        self._charts.next_span()
        if self.snapshot is not None:
            self._show_charts(self.snapshot)
        name, span_s = self.span
        self.notify(f"Charts: {'the whole run' if span_s is None else f'last {name}'}", timeout=2)

    # ---------------------------------------------------------------- settings

    def _current_headroom(self) -> float:
        return float(self.pending.get("headroom", self.snapshot.headroom_ms if self.snapshot else 0.0))

    def _set_fixed_headroom(self, value: float) -> None:
        value = max(0.0, round(value, 1))
        if self._send(SetHeadroom(value), f"Headroom fixed at {value:g} ms"):
            self.pending.set("headroom", value)

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
            self.pending.clear("headroom")

    def action_toggle_backpressure(self) -> None:
        now = self.pending.get("backpressure", self.snapshot.backpressure if self.snapshot else True)
        on = not now
        if self._send(SetBackpressure(on), f"Backpressure {'on' if on else 'off'}"):
            self.pending.set("backpressure", on)

    def _change_rate(self, direction: int) -> None:
        current = float(self.pending.get("rate", self.snapshot.arrival_rate if self.snapshot else 0.0))
        rate = self.rate_steps.step(current, direction)
        if self._send(SetArrivalRate(rate), f"Arrival rate {rate:g}/s"):
            self.pending.set("rate", rate)

    def action_rate_up(self) -> None:
        self._change_rate(+1)

    def action_rate_down(self) -> None:
        self._change_rate(-1)

    def _current_throttle(self) -> tuple[str, float]:
        snap = self.snapshot
        truth = (
            ("off", 0.0)
            if snap is None or snap.messages is None
            else (
                snap.messages.throttle_mode,
                snap.messages.throttle_rate,
            )
        )
        # "auto" is caught up as soon as the mode is; its rate comes from the engine.
        held = self.pending.get(
            "throttle",
            truth,
            lambda sent, seen: sent[0] == seen[0] and (sent[0] != "fixed" or sent[1] == seen[1]),
        )
        return held

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
            self.pending.set("throttle", pending)

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
        if not path.exists():
            self._write_profile(path, text)
            return

        def answered(overwrite: bool | None) -> None:
            if overwrite:
                self._write_profile(path, text)
            else:
                self.notify(f"Not saved; {path.resolve()} left as it was", title="Not saved", timeout=5)

        self.push_screen(
            ConfirmScreen(
                f"{path.resolve()} already exists. Overwrite it with the current settings?", "Save profile"
            ),
            answered,
        )

    def _write_profile(self, path: Path, text: str) -> None:
        try:
            private_dir(path.parent)  # the user's config directory may not exist yet (0700)
            private_write_text(path, text)  # 0600, as every file ratedeck creates
        except OSError as error:
            self.notify(
                f"Could not save settings to {path}: {error.strerror or error}",
                title="Not saved",
                severity="error",
                timeout=8,
            )
            return
        self.notify(f"Settings saved to {path.resolve()}", title="Saved", timeout=6)

    def use_theme(self, name: str) -> None:
        """Switch to theme `name` and say so."""
        self.theme = name
        self.notify(f"Theme {name}", timeout=2)

    def action_next_theme(self) -> None:
        names = self.ratedeck_themes or [self.theme]
        index = names.index(self.theme) if self.theme in names else -1
        self.use_theme(names[(index + 1) % len(names)])

    def action_show_help(self) -> None:
        self.push_screen(HelpScreen(self.help_sections()))

    async def action_quit(self, how: str = "key") -> None:
        """Drain gracefully: stop the engine, then exit with its final snapshot.

        During the drain, Ctrl+C (`how == "interrupt"`) stops at once; q only says so.
        """
        if self._quit.draining:
            if how == "interrupt":
                self._stop_at_once()
            else:
                self.notify("Still draining… (Ctrl+C stops at once)", timeout=2)
            return
        self._begin_quit("quit by operator")

    def _stop_at_once(self) -> None:
        """Cut the drain short: what is left is reported as queued or in flight."""
        if self._quit.stopping_at_once:
            return
        self._quit.stopping_at_once = True
        self.notify("stopping at once…", timeout=30)
        self.run_worker(self._abort(), name="abort", group="abort")

    async def _abort(self) -> None:
        try:
            final = await asyncio.get_running_loop().run_in_executor(None, self.host.abort)
        except Exception as error:
            self.exit(self.snapshot, return_code=1, message=f"ratedeck: stopping the engine failed: {error}")
            return
        self.exit(final)

    def _begin_quit(self, reason: str) -> None:
        self._quit.draining = True
        self.main.run_bar.drain_reason = reason
        self.main.run_bar.draining = True
        self.refresh_bindings()
        self.notify(
            "draining… waiting for in-flight requests", title=reason[:1].upper() + reason[1:], timeout=30
        )
        self.run_worker(self._drain(), name="drain", exclusive=True)

    async def _drain(self) -> None:
        try:
            final = await self.host.stop()
        except Exception as error:  # still leave, and say why, with what we last saw
            self.exit(self.snapshot, return_code=1, message=f"ratedeck: stopping the engine failed: {error}")
            return
        self.exit(final)
