"""Latency: p50 and p99 of successful attempts, one bar per second."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers


class LatencyPanel(Vertical):
    """Two labelled sparklines, p50 above p99, with their current values."""

    snapshot: reactive[Snapshot | None] = reactive(None, init=False)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="latency-row"):
            yield Static(id="p50-label", classes="latency-label")
            yield Sparkline([], id="p50-spark")
        with Horizontal(classes="latency-row"):
            yield Static(id="p99-label", classes="latency-label")
            yield Sparkline([], id="p99-spark")

    def on_mount(self) -> None:
        self.border_title = "Latency"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        self.query_one("#p50-label", Static).update(
            f"[$text-muted]p50[/]\n[b]{numbers.millis(snap.latency.p50)}[/]"
        )
        self.query_one("#p99-label", Static).update(
            f"[$text-muted]p99[/]\n[b]{numbers.millis(snap.latency.p99)}[/]"
        )
        self.query_one("#p50-spark", Sparkline).data = list(snap.p50_series)
        self.query_one("#p99-spark", Sparkline).data = list(snap.p99_series)
        self.border_subtitle = (
            f"mean {numbers.millis(snap.latency.mean)} · max {numbers.millis(snap.latency.max)}"
        )
