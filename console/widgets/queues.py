"""Queues: the main queue, the dead-letter queue, graveyard and expired."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .gauge import Gauge
from .panel import SnapshotPanel


def main_queue_level(depth: int, maximum: int, backpressure: bool) -> str:
    """How alarming the main queue is.

    With backpressure the queue cannot exceed `main_max`, so only "nearly full"
    is a warning. Without it the queue can swell without bound: any depth past
    the backpressure limit (or past 1000 if none is set) is a warning, and
    twice that is an error.
    """
    if backpressure and maximum > 0:
        fill = depth / maximum
        return "error" if fill >= 0.95 else "warning" if fill >= 0.75 else "ok"
    threshold = maximum if maximum > 0 else 1000
    return "error" if depth >= 2 * threshold else "warning" if depth > threshold else "ok"


class QueuesPanel(SnapshotPanel, Vertical):
    """Gauges for the main queue, DLQ, graveyard and expired requests."""

    BORDER_TITLE = "Queues"

    def compose(self) -> ComposeResult:
        yield Gauge("Main", id="gauge-main")
        yield Gauge("DLQ", id="gauge-dlq")
        yield Gauge("Graveyard", id="gauge-graveyard")
        yield Gauge("Expired", id="gauge-expired")
        yield Static(id="queues-note", classes="panel-note")

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        level = main_queue_level(snap.main_depth, snap.main_max, snap.backpressure)
        main = self.query_one("#gauge-main", Gauge)
        if snap.backpressure and snap.main_max > 0:
            main.show(
                snap.main_depth,
                snap.main_max,
                f"{numbers.count(snap.main_depth)}/{numbers.count(snap.main_max)}",
                level,
            )
        else:
            # No ceiling to draw against: the number itself is the gauge.
            main.show(snap.main_depth, 0, f"{numbers.count(snap.main_depth)} ▲ unbounded", level)
        dlq_scale = max(snap.dlq_peak, snap.dlq_depth)
        self.query_one("#gauge-dlq", Gauge).show(
            snap.dlq_depth,
            dlq_scale,
            f"{numbers.count(snap.dlq_depth)} (peak {numbers.count(snap.dlq_peak)})",
            "warning" if snap.dlq_depth else "ok",
        )
        generated = max(snap.generated, 1)
        self.query_one("#gauge-graveyard", Gauge).show(
            snap.graveyard,
            generated,
            f"{numbers.count(snap.graveyard)} ({numbers.share(snap.graveyard, generated)})",
            "error" if snap.graveyard else "ok",
        )
        self.query_one("#gauge-expired", Gauge).show(
            snap.expired,
            generated,
            f"{numbers.count(snap.expired)} ({numbers.share(snap.expired, generated)})",
            "warning" if snap.expired else "ok",
        )
        pressure = (
            f"backpressure [b $text-success]on[/] · max {numbers.count(snap.main_max)}"
            if snap.backpressure
            else "backpressure [b $text-warning]off[/] · queue may swell"
        )
        note = (
            f"[$text-muted]{pressure}\n"
            f"main peak {numbers.count(snap.main_peak)} · avg {snap.main_avg:.0f}"
            f" · DLQ avg {snap.dlq_avg:.1f}[/]"
        )
        self.show_text(note, self.query_one("#queues-note", Static))  # two lines, fixed
