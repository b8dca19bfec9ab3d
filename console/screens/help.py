"""The help screen: every key the console answers to and what it does."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    """A modal list of (key, action id, description), keys as currently mapped.

    The rows come from the app (after the user's keymap is applied), so a
    remapped key is shown as the user will press it.
    """

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close help", id="close_help"),
    ]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        key_width = max((len(key) for key, _, _ in self.rows), default=4) + 2
        # Assembled, not markup: keys such as "[" must not be read as tags.
        lines = Content("\n").join(
            Content.assemble(
                (key.ljust(key_width), "b $text-accent"),
                description,
                (f"  ({binding_id})", "$text-muted"),
            )
            for key, binding_id, description in self.rows
        )
        with Vertical(id="help-box"):
            with VerticalScroll(id="help-body"):
                yield Static(lines, id="help-lines")
            yield Static(
                "[$text-muted]Remap with a keymap (action id → key) · Ctrl+P command palette · Esc close[/]",
                id="help-foot",
            )

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Help · keys"

    def action_close(self) -> None:
        self.dismiss(None)
