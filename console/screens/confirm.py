"""A yes/no question before doing something that cannot be undone."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    """Asks `question`; dismisses with True for y (or Enter), False for n or Esc."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "Yes", id="confirm_yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm_no"),
    ]

    def __init__(self, question: str, title: str = "Confirm") -> None:
        super().__init__()
        self.question = question
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(escape(self.question), id="confirm-question")
            yield Static("[b $text-accent]y[/] yes   [b $text-accent]n[/] / Esc no", id="confirm-keys")

    def on_mount(self) -> None:
        self.query_one("#confirm-box").border_title = self.title_text

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
