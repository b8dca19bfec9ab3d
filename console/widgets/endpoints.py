"""A pool's endpoints ([[endpoints]]): each one's state, models and their limits, its keys' counts.

Shown only when the snapshot has endpoints (`Snapshot.endpoints`; a run with one target has
none): one line per endpoint under the keys, an endpoint out of the pool in the error colour
with why, one probing in the warning colour.
"""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from ratedeck.engine.snapshot import EndpointRow, Snapshot

from .panel import SnapshotPanel

_STYLE = {
    "up": "$text-success",
    "probing": "$text-warning",
    "down": "b $text-error",
    "refused": "b $text-error",
}
_MARK = {"up": "●", "probing": "◐", "down": "○", "refused": "✕"}


def endpoint_line(e: EndpointRow, name_width: int) -> str:
    """Markup for one endpoint: "● east  azure-openai  up  1 key  sent 40  ok 30  429 2 ·
    gpt-4o-mini: requests 120/min, tokens 20,000/min" (why it is out, when it is)."""
    style = _STYLE.get(e.state, "")
    head = f"[{style}]{_MARK.get(e.state, '?')} {escape(e.name).ljust(name_width)} {e.state:<7}[/]"
    keys = f"{e.keys} key" + ("" if e.keys == 1 else "s")
    counts = f"{keys}  sent {e.sent}  ok {e.succeeded}  429 {e.rejected_429}"
    limits = e.limits_text() or ("any model" if e.serves == ("any",) else "")
    text = f"{head} [$text-muted]{escape(e.preset)}[/]  {counts}"
    if e.downs:
        text += f"  [$text-warning]out {e.downs}×[/]"
    if e.reason:
        text += f" · [{style}]{escape(e.reason)}[/]"
    if limits:
        text += f" · {escape(limits)}"
    return text


class EndpointsPanel(SnapshotPanel, Static):
    """One line per endpoint of the pool (see the module doc); the border subtitle counts
    those in the pool."""

    BORDER_TITLE = "Endpoints"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or not snap.endpoints:
            return
        width = max(len(e.name) for e in snap.endpoints)
        text = "\n".join(endpoint_line(e, width) for e in snap.endpoints)
        # its height follows its lines: relayout only when their number changes
        self.show_text(text, layout=text.count("\n") != self._text.count("\n"))
        up = sum(1 for e in snap.endpoints if e.state == "up")
        self.show_subtitle(f"{up} of {len(snap.endpoints)} in the pool")
