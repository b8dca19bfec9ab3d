"""Errors, first class: failed attempts grouped by HTTP status and cause.

Each group (`Snapshot.errors`) has a count, the key that last got it, when,
and the last answer's body or error text, secrets already masked by the engine.
"""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from ratedeck.engine.snapshot import ErrorRow, Snapshot

from . import numbers
from .panel import SnapshotPanel

KIND_STYLE = {
    "rate_limited": "$text-warning",
    "nonce": "$text-warning",
    "blocked": "$text-error",
    "client_error": "$text-error",
    "server_error": "$text-error",
    "timeout": "$text-accent",
    "connection": "$text-accent",
}


def status_text(row: ErrorRow) -> str:
    """The HTTP status, or "—" when no answer came."""
    return "—" if row.status is None else str(row.status)


def by_count(errors: tuple[ErrorRow, ...]) -> list[ErrorRow]:
    """Most frequent first; ties by the most recent."""
    return sorted(errors, key=lambda row: (-row.count, -row.last_at_s, status_text(row), row.cause))


def one_line(text: str) -> str:
    """A body on one line (newlines and runs of spaces folded)."""
    return " ".join(text.split())


def ago(snap: Snapshot, at_s: float) -> str:
    """How long ago, in whole seconds (so the text changes at most once a second)."""
    return f"{numbers.duration(int(max(0.0, snap.elapsed_s - at_s)))} ago"


def cause_text(row: ErrorRow) -> str:
    """The cause ("connection refused"), or the kind in words when the cause says no more."""
    return row.cause or str(row.kind).replace("_", " ")


def error_line(snap: Snapshot, row: ErrorRow) -> str:
    """Markup: ×count status cause (coloured by kind) · last key, when · last body."""
    style = KIND_STYLE.get(str(row.kind), "$text-error")
    return (
        f"[b]{'×' + numbers.compact_count(row.count):>6}[/] [b {style}]{status_text(row):>3} {escape(cause_text(row))}[/]"
        f" [$text-muted]· {escape(row.last_key or '—')} {ago(snap, row.last_at_s)} ·[/]"
        f" {escape(one_line(row.last_text))}"
    )


def errors_summary(errors: tuple[ErrorRow, ...]) -> str:
    total = sum(row.count for row in errors)
    if not total:
        return "no failed attempts"
    kinds = "1 kind" if len(errors) == 1 else f"{len(errors)} kinds"
    return f"{numbers.count(total)} failed attempts · {kinds}"


class ErrorsPanel(SnapshotPanel, Static):
    """Failed attempts by status and cause, most frequent first, with the last masked body.

    Shown beside the keys on wide terminals; `e` opens the full errors screen.
    """

    BORDER_TITLE = "Errors"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        rows = by_count(snap.errors)
        text = "\n".join(error_line(snap, row) for row in rows) or "[$text-success]no failed attempts[/]"
        self.show_text(text)  # a fixed-size panel: no relayout
        self.show_subtitle(f"{errors_summary(snap.errors)} · e: details")
