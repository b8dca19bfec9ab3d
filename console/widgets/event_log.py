"""The event log: cooldowns, pauses, setting changes, graveyard, errors."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Event

from . import numbers

KIND_STYLE = {
    "cooldown": "$text-warning",
    "pause": "$text-accent",
    "setting": "$text-primary",
    "graveyard": "$text-error",
    "error": "$text-error",
    "info": "$text-muted",
}


def event_line(event: Event) -> str:
    """One markup line: time, coloured kind, escaped text."""
    style = KIND_STYLE.get(event.kind, "$text-muted")
    return (
        f"[$text-muted]{numbers.duration(event.at_s):>8}[/] "
        f"[b {style}]{escape(event.kind):<9}[/] {escape(event.text)}"
    )


class EventLog(VerticalScroll, can_focus=False):
    """Newest events at the bottom; follows the tail unless scrolled back.

    The engine's `events` tuple is already bounded, so the log simply shows it.
    Lines are markup with theme variables, so a theme switch recolours history.
    """

    events: reactive[tuple[Event, ...]] = reactive((), init=False)

    def compose(self) -> ComposeResult:
        yield Static(id="event-lines")

    def on_mount(self) -> None:
        self.border_title = "Events"

    def watch_events(self, events: tuple[Event, ...]) -> None:
        follow = self.scroll_y >= self.max_scroll_y
        lines = "\n".join(event_line(event) for event in events) or "[$text-muted]no events yet[/]"
        self.query_one("#event-lines", Static).update(lines)
        self.border_subtitle = f"{len(events)} events"
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
