"""Every failed attempt, grouped by HTTP status and cause, with the last masked body.

`e` opens it; the table is sorted by count (most first) and updated in place;
the body of the group under the cursor is shown in full below it. Enter opens
the key that last got that error; Esc or q goes back.
"""

from __future__ import annotations

from typing import Protocol, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.markup import escape
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ratedeck.engine.snapshot import ErrorRow, Snapshot

from ..widgets import numbers
from ..widgets.errors import by_count, errors_summary, one_line, status_text

COLUMNS = (
    ("count", "Count", 7),
    ("share", "Share", 6),
    ("status", "HTTP", 4),
    ("kind", "Kind", 12),
    ("cause", "Cause", 20),
    ("key", "Last key", 8),
    ("at", "Last at", 7),
    ("body", "Last body (masked)", 0),  # what the width leaves, at least BODY_MIN
)
BODY_MIN = 20


def group_key(row: ErrorRow) -> str:
    return f"{status_text(row)}|{row.kind}|{row.cause}"


class OpensKeys(Protocol):
    """What this screen asks of the app: the key detail of a key."""

    def open_key_detail(self, label: str) -> None: ...


class ErrorsScreen(Screen[None]):
    """A table of error groups and the full last body of the selected one."""

    BINDINGS = [
        Binding("escape,q", "close", "Back", id="close_errors"),
        Binding("enter", "open_key", "Open key", id="open_error_key"),
    ]

    snapshot: reactive[Snapshot | None] = reactive(
        None, init=False, repaint=False
    )  # watchers repaint what changed

    def __init__(self, snapshot: Snapshot | None) -> None:
        super().__init__()
        self._initial = snapshot
        self._shown: dict[str, ErrorRow] = {}
        self._order: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(id="errors-head")
        yield DataTable(id="errors-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="errors-body", classes="panel")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.border_title = "Errors by status and cause · Enter opens the key"
        self._body_width = BODY_MIN
        self._add_columns()
        self.query_one("#errors-body").border_title = "Last body"
        table.focus()
        self.snapshot = self._initial

    def _add_columns(self) -> None:
        table = self.query_one(DataTable)
        for key, heading, width in COLUMNS:
            table.add_column(heading, key=key, width=width or self._body_width)

    def on_resize(self, event: Resize) -> None:
        table = self.query_one(DataTable)
        used = sum(width + 2 * table.cell_padding for _, _, width in COLUMNS if width)
        width = max(BODY_MIN, table.scrollable_content_region.width - used - 2 * table.cell_padding - 1)
        if width != self._body_width:
            self._body_width = width
            table.clear(columns=True)
            self._add_columns()
            self._order = []  # refill
            if self.snapshot is not None:
                self.watch_snapshot(self.snapshot)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or not self.query("#errors-head"):
            return  # none yet, or it came before the screen composed (on_mount shows it)
        table = self.query_one(DataTable)
        total = sum(row.count for row in snap.errors)
        self.query_one("#errors-head", Static).update(
            f"[b]{errors_summary(snap.errors)}[/] [$text-muted]· 429s {numbers.count(snap.rejected_429)}"
            f" · other 4xx {numbers.count(snap.rejected_other)} · failed {numbers.count(snap.failed)}"
            f" · of {numbers.count(snap.sent)} attempts[/]",
            layout=False,
        )
        rows = by_count(snap.errors)
        order = [group_key(row) for row in rows]
        selected = self.selected_group
        if order != self._order:
            table.clear()
            for row in rows:
                table.add_row(*self._cells(row, total), key=group_key(row))
            self._order = order
            if selected in order:
                table.move_cursor(row=order.index(selected), animate=False)
        else:
            for row in rows:
                key = group_key(row)
                if self._shown.get(key) != row:
                    for column, value in zip(COLUMNS, self._cells(row, total), strict=True):
                        table.update_cell(key, column[0], value)
        self._shown = {group_key(row): row for row in rows}
        self._show_body()

    def _cells(self, row: ErrorRow, total: int) -> list[object]:
        return [
            Text(numbers.compact_count(row.count), justify="right"),
            Text(numbers.share(row.count, total), justify="right"),
            Text(status_text(row), justify="right"),
            Text(str(row.kind)),
            Text(row.cause),
            Text(row.last_key or "—"),
            Text(numbers.duration(row.last_at_s), justify="right"),
            Text(one_line(row.last_text), no_wrap=True, overflow="ellipsis"),
        ]

    @property
    def selected_group(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        try:
            row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        except Exception:
            return None
        return row_key.value

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_body()

    def _show_body(self) -> None:
        body = self.query_one("#errors-body", Static)
        key = self.selected_group
        row = self._shown.get(key) if key else None
        if row is None:
            body.update("[$text-success]no failed attempts[/]")
            return
        body.border_subtitle = (
            f"{status_text(row)} {row.kind} · {row.last_key or '—'} at {numbers.duration(row.last_at_s)}"
        )
        body.update(escape(row.last_text) or "[$text-muted](no body)[/]", layout=False)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_key()

    def action_open_key(self) -> None:
        key = self.selected_group
        row = self._shown.get(key) if key else None
        if row is None or not row.last_key:
            self.notify("No key to open", severity="warning")
            return
        cast(OpensKeys, self.app).open_key_detail(row.last_key)

    def action_close(self) -> None:
        self.dismiss(None)
