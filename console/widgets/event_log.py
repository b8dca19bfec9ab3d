"""The event log: cooldowns, pauses, setting changes, graveyard, errors.

Repeated events are folded into one line ("k3 cooling down … ×12 in 9.8s"):
two events are repeats when they have the same kind and the same text once
numbers are set aside (a key label such as "k3" is kept), and the later one
comes within `WINDOW_S` of the first of the group. The log keeps its own
groups, fed with only the events it has not seen, so counts do not shrink
when the engine's bounded event list drops old entries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.markup import escape
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
WINDOW_S = 10.0
MAX_GROUPS = 500
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?")


def repeat_key(event: Event) -> tuple[str, str]:
    """What makes two events repeats: kind and text with numbers set aside."""
    return str(event.kind), _NUMBER.sub("#", event.text)


def new_events(seen: tuple[Event, ...], events: tuple[Event, ...]) -> tuple[Event, ...]:
    """The events at the end of `events` that come after everything in `seen`.

    Both are windows of the same growing log (oldest dropped first); the
    overlap is found from the newest seen event backwards.
    """
    if not seen:
        return events
    if events == seen:
        return ()
    last = seen[-1]
    for index in range(len(events) - 1, -1, -1):
        if events[index] != last:
            continue
        overlap = index + 1
        if overlap <= len(seen) and events[:overlap] == seen[len(seen) - overlap :]:
            return events[overlap:]
    return events  # no overlap: more came than the engine keeps


@dataclass
class EventGroup:
    """A run of repeated events: the latest text, how many, from when to when."""

    kind: str
    text: str
    first_at: float
    last_at: float
    count: int = 1
    key: tuple[str, str] = ("", "")


class EventDigest:
    """Events folded into groups of repeats, newest group last."""

    def __init__(self, window_s: float = WINDOW_S, max_groups: int = MAX_GROUPS) -> None:
        self.window_s = window_s
        self.max_groups = max_groups
        self.groups: list[EventGroup] = []
        self._latest: dict[tuple[str, str], EventGroup] = {}
        self._seen: tuple[Event, ...] = ()

    def feed(self, events: tuple[Event, ...]) -> bool:
        """Take in the events not seen yet; True if the groups changed."""
        fresh = new_events(self._seen, events)
        self._seen = events
        for event in fresh:
            self._add(event)
        return bool(fresh)

    def _add(self, event: Event) -> None:
        key = repeat_key(event)
        group = self._latest.get(key)
        if group is not None and event.at_s - group.first_at <= self.window_s:
            group.count += 1
            group.last_at = event.at_s
            group.text = event.text
            if self.groups[-1] is not group:  # the newest repeat moves to the bottom
                self.groups.remove(group)
                self.groups.append(group)
            return
        group = EventGroup(str(event.kind), event.text, event.at_s, event.at_s, key=key)
        self._latest[key] = group
        self.groups.append(group)
        if len(self.groups) > self.max_groups:
            dropped = self.groups.pop(0)
            if self._latest.get(dropped.key) is dropped:
                del self._latest[dropped.key]


def group_line(group: EventGroup) -> str:
    """One markup line: time, coloured kind, escaped text, and ×N for repeats."""
    style = KIND_STYLE.get(group.kind, "$text-muted")
    repeat = ""
    if group.count > 1:
        repeat = f" [b $text-accent]×{group.count}[/] [$text-muted]in {numbers.duration(group.last_at - group.first_at)}[/]"
    return (
        f"[$text-muted]{numbers.duration(group.last_at):>8}[/] "
        f"[b {style}]{escape(group.kind):<9}[/] {escape(group.text)}{repeat}"
    )


def event_line(event: Event) -> str:
    """One markup line for a single event."""
    return group_line(EventGroup(str(event.kind), event.text, event.at_s, event.at_s))


class EventLog(VerticalScroll, can_focus=False):
    """Newest events at the bottom, repeats folded; follows the tail unless scrolled back.

    Lines are markup with theme variables, so a theme switch recolours history.
    """

    _subtitle: str | None = None  # the border subtitle last set

    def compose(self) -> ComposeResult:
        yield Static(id="event-lines")

    def on_mount(self) -> None:
        self.border_title = "Events"
        self.digest = EventDigest()
        self._lines = self.query_one("#event-lines", Static)
        self._lines.update("[$text-muted]no events yet[/]")

    def show(self, events: tuple[Event, ...]) -> None:
        """New events from a snapshot: fold them in and repaint if anything changed."""
        if not self.digest.feed(events):
            return
        follow = self.scroll_y >= self.max_scroll_y
        groups = self.digest.groups
        self._lines.update(
            "\n".join(group_line(group) for group in groups) or "[$text-muted]no events yet[/]"
        )
        total = sum(group.count for group in groups)
        subtitle = f"{total} events" if total == len(groups) else f"{total} events in {len(groups)} lines"
        if subtitle != self._subtitle:  # the getter gives markup back, not what was set
            self._subtitle = subtitle
            self.border_subtitle = subtitle
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)
