"""The per-key table: one row per API key, sortable, filterable, updated cell by cell.

Built for 50-500 keys: a refresh compares each `KeyRow` with the last one and
updates only the cells that changed; the rows are reordered (not rebuilt)
when the sort column's values change the order; the cursor stays on the same
key through refreshes, sorting and filtering.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.events import Resize
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ratedeck.engine.snapshot import KeyRow

from . import numbers

_STATE_ORDER = {"active": 0, "cooling": 1, "paused": 2, "blocked": 3}
_STATE_COLOUR = {"active": "success", "paused": "warning", "cooling": "accent", "blocked": "error"}
_STATE_ICON = {"active": "●", "paused": "‖", "cooling": "◔", "blocked": "✖"}
LAST_ERROR_MIN = 16


def _plain(cell: object) -> str:
    """A cell's text without its styles."""
    return cell.plain if isinstance(cell, Text) else str(cell)


def natural(label: str) -> tuple:
    """Sort key that puts k2 before k10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label))


def out_of_quota(row: KeyRow) -> bool:
    """A key refused for good by a 429 (or a message about its quota): out of what it may spend
    (OpenAI's insufficient_quota), not of its rate. The same test as the headless summary's."""
    return row.state == "blocked" and (row.refused_status == 429 or "quota" in row.refused_message.lower())


def binds_text(row: KeyRow) -> str:
    """The Binds cell: the unit nearest full now ("tokens", "requests"), "out" for a key
    refused for good, "—" when the engine named none."""
    if row.state == "blocked":
        return "out"
    return row.binding or "—"


def state_text(row: KeyRow) -> str:
    """The words of the state cell: "cooling 3.2s" shows the seconds left."""
    if row.state == "cooling":
        # At least 0.1s: a gate a few ms from opening is still closed, not "0.0s".
        left = max(row.cooldown_left_s, 0.1)
        return f"{_STATE_ICON['cooling']} cooling {left:.1f}s" if left < 10 else f"◔ cooling {left:.0f}s"
    if out_of_quota(row):
        return f"{_STATE_ICON['blocked']} out of quota"  # refused by a 429: waiting will not help
    if row.state == "blocked" and row.refused_status is not None:
        return f"{_STATE_ICON['blocked']} refused {row.refused_status}"  # the status that refused it
    return f"{_STATE_ICON.get(row.state, '?')} {row.state}"


def key_text(row: KeyRow) -> str:
    """Label, masked secret and fingerprint when known; the only parts of a key ever shown."""
    fp = row.fingerprint
    return f"{row.label} {row.masked} {fp}" if fp else f"{row.label} {row.masked}"


def _window_fill(row: KeyRow) -> float:
    return row.window_used / row.window_limit if row.window_limit else -1.0


@dataclass(frozen=True)
class Column:
    """A table column: heading, width, and how it sorts (descending first for figures)."""

    key: str
    heading: str
    width: int
    sort_key: Callable[[KeyRow], Any]
    descending: bool = True
    left: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("key", "Key", 13, lambda row: natural(row.label), descending=False, left=True),
    Column(
        "state", "State", 14, lambda row: (_STATE_ORDER.get(row.state, 9), row.cooldown_left_s), False, True
    ),
    Column("in_flight", "Infl", 5, lambda row: row.in_flight),
    Column("sent", "Sent", 8, lambda row: row.sent),
    Column("ok", "OK", 8, lambda row: row.succeeded),
    Column("r429", "429s", 5, lambda row: row.rejected_429),
    Column("errors", "Err", 5, lambda row: row.errors),
    Column("window", "Window", 7, _window_fill),
    Column("last", "Latency", 8, lambda row: -1.0 if row.last_latency_ms is None else row.last_latency_ms),
    Column("status", "HTTP", 5, lambda row: row.last_status or 0),
    Column("last_error", "Last error", LAST_ERROR_MIN, lambda row: row.last_error, False, True),
)
# Only in a run with budgets (a key names the unit that binds it): after Window.
BINDS = Column("binds", "Binds", 5, lambda row: binds_text(row), descending=False, left=True)
COLUMN_BY_KEY = {column.key: column for column in (*COLUMNS, BINDS)}


def has_budgets(rows: tuple[KeyRow, ...] | list[KeyRow]) -> bool:
    """Whether the run has key budgets: some key names the unit that binds it."""
    return any(row.binding for row in rows)


def matches(row: KeyRow, terms: list[str]) -> bool:
    """True when every term is in the key's label, masked form, fingerprint, state, status or last error."""
    if not terms:
        return True
    status = "" if row.last_status is None else str(row.last_status)
    haystack = " ".join(
        (row.label, row.masked, row.fingerprint, str(row.state), status, row.last_error)
    ).lower()
    return all(term in haystack for term in terms)


class KeysTable(DataTable):
    """Keys with state, in flight, sent, ok, 429s, errors, window fill, latency,
    last HTTP status and last error.

    `show_keys` adds, updates (with `update_cell`, only cells that changed) and
    removes rows keyed by label. `sort_by` picks the sort column (a header
    click does too; clicking it again reverses), `filter_text` keeps the keys
    whose text has every word of it. `selected_key` is the label under the
    cursor. Home/End go to the first/last key.
    """

    _subtitle: str | None = None  # the border subtitle last set

    BINDINGS = [
        Binding("home", "scroll_top", "First key", show=False),
        Binding("end", "scroll_bottom", "Last key", show=False),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]

    DEFAULT_CSS = """
    KeysTable {
        height: 1fr;
    }
    """

    compact: reactive[bool] = reactive(False)
    """No cell padding, so the figures up to the HTTP status fit in 80 columns."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._all: dict[str, KeyRow] = {}  # every key the engine reports, in its order
        self._rows: dict[str, KeyRow] = {}  # the keys shown
        self._cells: dict[str, dict[str, object]] = {}
        self._order: list[str] = []  # labels as shown, top first
        self._palette_for: str | None = None
        self._palette: dict[str, str] = {}
        self.sort_column = "key"
        self.sort_descending = False
        self.filter_text = ""
        self._key_width = COLUMN_BY_KEY["key"].width
        self._last_error_width = LAST_ERROR_MIN
        self.binds = False  # the Binds column is shown (a run with budgets)
        self._binds_width = BINDS.width  # widens to the longest unit name seen ("output-tokens")

    def on_mount(self) -> None:
        self._add_columns()
        # Cell colours are real colours (DataTable renders Rich text), so a theme
        # change has to repaint every state cell.
        self.watch(self.app, "theme", self._restyle, init=False)

    # ---------------------------------------------------------------- columns

    def _heading(self, column: Column) -> Text:
        heading = column.heading
        if column.key == self.sort_column:
            arrow = "▼" if self.sort_descending else "▲"
            heading = f"{heading} {arrow}" if column.left else f"{arrow}{heading}"
        return Text(
            heading,
            justify="left" if column.left else "right",
            style="bold" if column.key == self.sort_column else "",
        )

    @property
    def shown_columns(self) -> tuple[Column, ...]:
        """The columns in order: COLUMNS, with Binds after Window in a run with budgets."""
        if not self.binds:
            return COLUMNS
        at = [column.key for column in COLUMNS].index("window") + 1
        return (*COLUMNS[:at], BINDS, *COLUMNS[at:])

    def _width(self, column: Column) -> int:
        if column.key == "key":
            return self._key_width
        if column.key == "last_error":
            return self._last_error_width
        if column.key == "binds":
            return self._binds_width
        return column.width

    def _add_columns(self) -> None:
        for column in self.shown_columns:
            self.add_column(self._heading(column), key=column.key, width=self._width(column))

    def _rebuild(self) -> None:
        """Columns changed (width or heading): lay the table out again, keeping the cursor."""
        selected = self.selected_key
        self.clear(columns=True)
        self._add_columns()
        for label in self._order:
            self.add_row(*self._cells[label].values(), key=label)
        self._restore_cursor(selected)

    def watch_compact(self, compact: bool) -> None:
        self.cell_padding = 0 if compact else 1
        self._fit_last_error()

    def on_resize(self, event: Resize) -> None:
        self._fit_last_error()

    def _fit_last_error(self) -> None:
        """Give the last-error column what the terminal has left (at least LAST_ERROR_MIN)."""
        if not self.is_mounted or not self.columns:
            return
        padding = 2 * self.cell_padding
        used = sum(
            self._width(column) + padding for column in self.shown_columns if column.key != "last_error"
        )
        width = max(LAST_ERROR_MIN, self.scrollable_content_region.width - used - padding - 1)
        if width != self._last_error_width:
            self._last_error_width = width
            self._rebuild()

    # ---------------------------------------------------------------- selection

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:  # cursor outside the table while rows change
            return None
        return row_key.value

    def key_row(self, label: str) -> KeyRow | None:
        return self._all.get(label)

    @property
    def shown_labels(self) -> list[str]:
        """Labels in the order shown, top first."""
        return list(self._order)

    def select(self, label: str) -> None:
        """Put the cursor on `label` if it is shown."""
        self._restore_cursor(label)

    def _restore_cursor(self, label: str | None) -> None:
        if label is not None and label in self._rows:
            index = self._order.index(label)
            if index != self.cursor_row:
                self.move_cursor(row=index, animate=False)

    # ---------------------------------------------------------------- sort and filter

    def sort_by(self, column: str, descending: bool | None = None) -> None:
        """Sort by `column` (a column key); `descending` None means the column's natural order."""
        if column not in [spec.key for spec in self.shown_columns]:
            raise ValueError(f"no column {column!r}")
        self.sort_column = column
        self.sort_descending = COLUMN_BY_KEY[column].descending if descending is None else descending
        # New headings in place (the arrow moves); the reorder below repaints them.
        for spec in self.shown_columns:
            if spec.key in self.columns:
                self.columns[ColumnKey(spec.key)].label = self._heading(spec)
        self._arrange(force=True)
        self._update_subtitle()
        # A new sort is read from the top: the worst (or best) keys first.
        if self.row_count:
            self.move_cursor(row=0, animate=False)

    def next_sort(self) -> str:
        """Sort by the next column to the right (wrapping); returns its heading."""
        keys = [column.key for column in self.shown_columns]
        column = keys[(keys.index(self.sort_column) + 1) % len(keys)]
        self.sort_by(column)
        return COLUMN_BY_KEY[column].heading

    def reverse_sort(self) -> None:
        self.sort_by(self.sort_column, not self.sort_descending)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        column = str(event.column_key.value)
        if column == self.sort_column:
            self.reverse_sort()
        else:
            self.sort_by(column)

    def set_filter(self, text: str) -> None:
        """Show only the keys whose text has every word of `text` (case-insensitive)."""
        selected = self.selected_key
        self.filter_text = text.strip()
        self.show_keys(tuple(self._all.values()))
        if selected not in self._rows and self.row_count:
            self.move_cursor(row=0, animate=False)  # the first match

    def sort_description(self) -> str:
        column = COLUMN_BY_KEY[self.sort_column]
        return f"{column.heading} {'▼' if self.sort_descending else '▲'}"

    # ---------------------------------------------------------------- data

    def _colour(self, name: str) -> str:
        if self._palette_for is None:
            self._load_palette()
        return self._palette[name]

    def _load_palette(self) -> None:
        """Look the theme's colours up once per theme (not once per cell)."""
        theme = self.app.current_theme
        if self._palette_for != theme.name:
            variables = theme.to_color_system().generate()
            self._palette = {
                "success": variables.get("text-success", "green"),
                "warning": variables.get("text-warning", "yellow"),
                "error": variables.get("text-error", "red"),
                "accent": variables.get("text-accent", variables.get("accent", "magenta")),
                "muted": variables.get("text-muted", "grey50"),
            }
            self._palette_for = theme.name

    def _cells_for(self, row: KeyRow) -> dict[str, object]:
        colour = self._colour(_STATE_COLOUR.get(row.state, "error"))
        window_text = f"{row.window_used}/{row.window_limit}" if row.window_limit else "—"
        full = row.window_limit and row.window_used >= row.window_limit
        status = "—" if row.last_status is None else str(row.last_status)
        bad_status = row.last_status is not None and row.last_status >= 400
        blocked = row.state == "blocked"
        cells: dict[str, object] = {
            # Text, not str: a label is never markup
            "key": Text(key_text(row), style=f"strike {self._colour('muted')}" if blocked else ""),
            "state": Text(state_text(row), style=f"bold {colour}"),
            "in_flight": Text(numbers.count(row.in_flight), justify="right"),
            "sent": Text(numbers.compact_count(row.sent), justify="right"),
            "ok": Text(numbers.compact_count(row.succeeded), justify="right"),
            "r429": Text(
                numbers.compact_count(row.rejected_429),
                justify="right",
                style=self._colour("warning") if row.rejected_429 else "",
            ),
            "errors": Text(
                numbers.compact_count(row.errors),
                justify="right",
                style=self._colour("error") if row.errors else "",
            ),
            "window": Text(window_text, justify="right", style=self._colour("accent") if full else ""),
            "last": Text(numbers.millis(row.last_latency_ms), justify="right"),
            "status": Text(status, justify="right", style=self._colour("error") if bad_status else ""),
            "last_error": Text(
                row.last_error or "", style=self._colour("muted"), no_wrap=True, overflow="ellipsis"
            ),
        }
        if self.binds:
            binds = Text(binds_text(row), style=self._colour("error") if blocked else "")
            cells = {column.key: cells.get(column.key, binds) for column in self.shown_columns}
        return cells

    def remember(self, rows: tuple[KeyRow, ...]) -> None:
        """Keep the latest rows for `key_row` without redrawing (the table is not in view)."""
        self._all = {row.label: row for row in rows}

    def show_keys(self, rows: tuple[KeyRow, ...]) -> None:
        """Bring the table in line with `rows` (filtered and sorted), touching only what changed."""
        self._all = {row.label: row for row in rows}
        if has_budgets(rows):  # the column shows from the first snapshot with budgets
            width = max(self._binds_width, *(len(binds_text(row)) for row in rows))
            if not self.binds or width != self._binds_width:
                self.binds, self._binds_width = True, width
                self._cells = {label: self._cells_for(row) for label, row in self._rows.items()}
                self._fit_last_error()
                self._rebuild()
        terms = self.filter_text.lower().split()
        shown = [row for row in rows if matches(row, terms)]
        width = max((len(key_text(row)) + 1 for row in rows), default=0)
        if width > self._key_width:
            self._key_width = width
            self._fit_last_error()
            self._rebuild()
        wanted = {row.label for row in shown}
        selected = self.selected_key
        for label in [label for label in self._rows if label not in wanted]:
            self.remove_row(label)
            del self._rows[label]
            del self._cells[label]
            self._order.remove(label)
        for row in shown:
            if self._rows.get(row.label) == row:
                continue
            cells = self._cells_for(row)
            if row.label not in self._rows:
                self.add_row(*cells.values(), key=row.label)
                self._order.append(row.label)
            else:
                old = self._cells[row.label]
                for column, value in cells.items():
                    if old.get(column) != value:
                        self.update_cell(row.label, column, value)
            self._rows[row.label] = row
            self._cells[row.label] = cells
        self._arrange(selected)
        self._update_subtitle()

    def _arrange(self, selected: str | None = None, force: bool = False) -> None:
        """Reorder the rows if the sort says so (`force`: and repaint even if the
        order stands); the cursor follows its key."""
        if selected is None:
            selected = self.selected_key
        column = COLUMN_BY_KEY[self.sort_column]
        rows = list(self._rows.values())
        # natural label order first, so equal values keep a stable, readable order
        rows.sort(key=lambda row: natural(row.label))
        rows.sort(key=lambda row: column.sort_key(row), reverse=self.sort_descending)
        order = [row.label for row in rows]
        if order == self._order and not force:
            return
        rank = {_plain(self._cells[label]["key"]): index for index, label in enumerate(order)}
        self.sort("key", key=lambda cell: rank[cell.plain])
        self._order = order
        self._restore_cursor(selected)

    def _update_subtitle(self) -> None:
        shown, total = len(self._rows), len(self._all)
        count = f"{total} keys" if shown == total else f"{shown} of {total} keys"
        states: dict[str, int] = {}
        for row in self._all.values():
            states[row.state] = states.get(row.state, 0) + 1
        state_part = " · ".join(f"{count} {state}" for state, count in states.items() if state != "active")
        parts = [count]
        if state_part:
            parts.append(state_part)
        parts.append(f"sort {self.sort_description()}")
        if self.filter_text:
            parts.append(f"filter “{escape(self.filter_text)}”")
        subtitle = " · ".join(parts)
        if subtitle != self._subtitle:  # the getter gives markup back, not what was set
            self._subtitle = subtitle
            self.border_subtitle = subtitle

    def _restyle(self) -> None:
        self._load_palette()
        for label, row in self._rows.items():
            cells = self._cells_for(row)
            for column, value in cells.items():
                self.update_cell(label, column, value)
            self._cells[label] = cells
