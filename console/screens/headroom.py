"""A small modal to type an exact headroom in milliseconds."""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

MAX_HEADROOM_MS = 60_000.0


def parse_headroom(text: str) -> float:
    """Milliseconds from what the operator typed ("35", "35ms", "12.5").

    Raises `ValueError` with a message fit to show the operator.
    """
    cleaned = text.strip().lower().removesuffix("ms").strip()
    if not cleaned:
        raise ValueError("Type a headroom in milliseconds, e.g. 35")
    try:
        value = float(cleaned)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number of milliseconds") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"Headroom must be 0 ms or more, not {text.strip()!r}")
    if value > MAX_HEADROOM_MS:
        raise ValueError(f"Headroom of {value:g} ms is more than the {MAX_HEADROOM_MS:g} ms allowed")
    return value


class HeadroomScreen(ModalScreen[float | None]):
    """Ask for a fixed headroom; dismisses with the value, or `None` on Esc.

    A bad value is reported with a notice and the modal stays open with the
    text selected, so nothing changes until a valid number is entered.
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel_headroom")]

    def __init__(self, current_ms: float) -> None:
        super().__init__()
        self.current_ms = current_ms

    def compose(self) -> ComposeResult:
        with Vertical(id="headroom-box"):
            yield Static(
                f"Fixed headroom in ms (now {self.current_ms:.0f} ms). Enter applies, Esc cancels.",
                id="headroom-prompt",
            )
            yield Input(value=f"{self.current_ms:.0f}", placeholder="e.g. 35", id="headroom-input")

    def on_mount(self) -> None:
        self.query_one("#headroom-box").border_title = "Set headroom"
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            value = parse_headroom(event.value)
        except ValueError as error:
            self.notify(str(error), title="Headroom not changed", severity="error")
            event.input.select_all()
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
