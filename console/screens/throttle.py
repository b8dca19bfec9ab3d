"""A small modal to type an exact entry throttle in messages per second."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ratedeck.core.throttle import parse_throttle as core_parse_throttle


def parse_throttle(text: str) -> str | float:
    """What the operator typed: messages/s ("25", "25/s", "12.5 msg/s"), "off" or "auto"."""
    mode, rate = core_parse_throttle(text)
    return rate if mode == "fixed" else mode


class ThrottleScreen(ModalScreen[str | float | None]):
    """Ask for an entry throttle; dismisses with the value, or `None` on Esc.

    A bad value is reported with a notice and the modal stays open with the
    text selected, so nothing changes until a valid value is entered.
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_throttle")]

    def __init__(self, mode: str, rate: float) -> None:
        super().__init__()
        self.mode = mode
        self.rate = rate

    def compose(self) -> ComposeResult:
        now = "off" if self.mode == "off" else f"{self.mode} {self.rate:g} msg/s"
        with Vertical(id="throttle-box"):
            yield Static(
                f"Entry throttle in messages/s (now {now}); off and auto work too. "
                "Enter applies, Esc cancels.",
                id="throttle-prompt",
            )
            start = f"{self.rate:g}" if self.rate > 0 else ""
            yield Input(value=start, placeholder="e.g. 25", id="throttle-input")

    def on_mount(self) -> None:
        self.query_one("#throttle-box").border_title = "Set throttle"
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            value = parse_throttle(event.value)
        except ValueError as error:
            self.notify(str(error), title="Throttle not changed", severity="error")
            event.input.select_all()
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
