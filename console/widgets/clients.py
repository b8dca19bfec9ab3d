"""The gateway's clients: how many wait for the limits, how long they waited, what they got.

Shown only for a gateway (`Snapshot.clients` set): one line under the keys, beside
which the gates panel sits when a gate has closed.
"""

from __future__ import annotations

from textual.widgets import Static

from ratedeck.engine.snapshot import ClientView, Snapshot

from .panel import SnapshotPanel

#: Status the gateway counts for a client that left before its answer (never sent).
CLIENT_GONE = 499


def clients_line(c: ClientView) -> str:
    """Markup for one line: waiting now, queue wait p50/p99, answers by status (errors marked)."""
    parts = []
    for status, count in c.statuses:
        name = "left" if status == CLIENT_GONE else str(status)
        style = "$text-success" if 200 <= status < 300 else "$text-warning" if status < 500 else "$text-error"
        parts.append(f"[{style}]{name}[/] ×{count}")
    answers = " · ".join(parts) or "[$text-muted]none yet[/]"
    waiting = f"[b $text-accent]{c.waiting} waiting[/]" if c.waiting else "[$text-muted]0 waiting[/]"
    return (
        f"{waiting} · queue wait p50 {c.wait_p50_ms:.0f} ms, p99 {c.wait_p99_ms:.0f} ms · answers {answers}"
    )


class ClientsPanel(SnapshotPanel, Static):
    """The gateway's clients in one line (see the module doc)."""

    BORDER_TITLE = "Gateway clients"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or snap.clients is None:
            return
        self.show_text(clients_line(snap.clients))
        self.show_subtitle(f"{snap.clients.answered} answered")
