"""The per-key table: one row per API key, updated cell by cell."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from ratedeck.engine.snapshot import KeyRow

from . import numbers

# (column key, heading, width). Fixed widths: cells are updated in place and
# must not make the columns jump as numbers grow.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("key", "Key", 13),
    ("state", "State", 15),
    ("in_flight", "In flight", 9),
    ("sent", "Sent", 8),
    ("ok", "OK", 8),
    ("r429", "429s", 6),
    ("window", "Window", 8),
    ("last", "Last", 9),
)

_STATE_COLOUR = {"active": "success", "paused": "warning", "cooling": "accent", "blocked": "error"}
_STATE_ICON = {"active": "●", "paused": "‖", "cooling": "◔", "blocked": "✖"}


def state_text(row: KeyRow) -> str:
    """The words of the state cell: "cooling 3.2s" shows the seconds left."""
    if row.state == "cooling":
        # At least 0.1s: a gate a few ms from opening is still closed, not "0.0s".
        return f"{_STATE_ICON['cooling']} cooling {max(row.cooldown_left_s, 0.1):.1f}s"
    return f"{_STATE_ICON.get(row.state, '?')} {row.state}"


def key_text(row: KeyRow) -> str:
    """Label and masked secret; the only parts of a key ever shown."""
    return f"{row.label} {row.masked}"


class KeysTable(DataTable):
    """Keys with state, in flight, sent, ok, 429s, window fill and last latency.

    `show_keys` adds, updates (with `update_cell`, only cells that changed) and
    removes rows keyed by label, so the cursor stays on the operator's row
    across refreshes. `selected_key` is the label under the cursor.
    """

    DEFAULT_CSS = """
    KeysTable {
        height: 1fr;
    }
    """

    compact: reactive[bool] = reactive(False)
    """No cell padding, so all eight columns fit in 80 columns."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._rows: dict[str, KeyRow] = {}
        self._cells: dict[str, dict[str, object]] = {}
        self._palette_for: str | None = None
        self._palette: dict[str, str] = {}

    def on_mount(self) -> None:
        for key, heading, width in COLUMNS:
            label = Text(heading, justify="left" if key in ("key", "state") else "right")
            self.add_column(label, key=key, width=width)
        # Cell colours are real colours (DataTable renders Rich text), so a theme
        # change has to repaint every state cell.
        self.watch(self.app, "theme", self._restyle, init=False)

    def watch_compact(self, compact: bool) -> None:
        self.cell_padding = 0 if compact else 1

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
        return self._rows.get(label)

    def _colour(self, name: str) -> str:
        theme = self.app.current_theme
        if self._palette_for != theme.name:
            variables = theme.to_color_system().generate()
            self._palette = {
                "success": variables.get("text-success", "green"),
                "warning": variables.get("text-warning", "yellow"),
                "error": variables.get("text-error", "red"),
                "accent": variables.get("text-accent", variables.get("accent", "magenta")),
            }
            self._palette_for = theme.name
        return self._palette[name]

    def _cells_for(self, row: KeyRow) -> dict[str, object]:
        colour = self._colour(_STATE_COLOUR.get(row.state, "error"))
        window_text = f"{row.window_used}/{row.window_limit}" if row.window_limit else "—"
        full = row.window_limit and row.window_used >= row.window_limit
        return {
            "key": Text(key_text(row)),  # Text, not str: a label is never markup
            "state": Text(state_text(row), style=f"bold {colour}"),
            "in_flight": Text(numbers.count(row.in_flight), justify="right"),
            "sent": Text(numbers.count(row.sent), justify="right"),
            "ok": Text(numbers.count(row.succeeded), justify="right"),
            "r429": Text(
                numbers.count(row.rejected_429),
                justify="right",
                style=self._colour("warning") if row.rejected_429 else "",
            ),
            "window": Text(window_text, justify="right", style=self._colour("accent") if full else ""),
            "last": Text(numbers.millis(row.last_latency_ms), justify="right"),
        }

    def show_keys(self, rows: tuple[KeyRow, ...]) -> None:
        """Bring the table in line with `rows`, touching only what changed."""
        wanted = {row.label for row in rows}
        for label in [label for label in self._rows if label not in wanted]:
            self.remove_row(label)
            del self._rows[label]
            del self._cells[label]
        for row in rows:
            if self._rows.get(row.label) == row:
                continue
            cells = self._cells_for(row)
            if row.label not in self._rows:
                self.add_row(*cells.values(), key=row.label)
            else:
                old = self._cells[row.label]
                for column, value in cells.items():
                    if old.get(column) != value:
                        self.update_cell(row.label, column, value)
            self._rows[row.label] = row
            self._cells[row.label] = cells

    def _restyle(self) -> None:
        for label, row in self._rows.items():
            cells = self._cells_for(row)
            for column, value in cells.items():
                self.update_cell(label, column, value)
            self._cells[label] = cells
