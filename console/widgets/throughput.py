"""Throughput: successes per second against the keys' combined capacity."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers


def capacity_style(pct: float) -> str:
    """Colour for "% of capacity": near the limit is the goal, so it is green."""
    if pct >= 90:
        return "$text-success"
    if pct >= 60:
        return "$text-warning"
    return "$text-error"


class ThroughputPanel(Vertical):
    """A TPS sparkline (one bar per second) with current, average and capacity."""

    snapshot: reactive[Snapshot | None] = reactive(None, init=False)

    def compose(self) -> ComposeResult:
        yield Static(id="tps-stats", classes="panel-stats")
        yield Sparkline([], id="tps-spark")

    def on_mount(self) -> None:
        self.border_title = "Throughput"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        pct = snap.pct_capacity
        self.query_one("#tps-stats", Static).update(
            f"[$text-muted]now[/] [b]{numbers.rate(snap.current_tps)}/s[/]"
            f"  [$text-muted]avg[/] [b]{numbers.rate(snap.throughput_tps)}/s[/]\n"
            f"[$text-muted]capacity[/] {numbers.rate(snap.capacity_tps)}/s"
            f"  [b {capacity_style(pct)}]{pct:.1f}%[/] [$text-muted]of capacity[/]"
        )
        self.query_one("#tps-spark", Sparkline).data = list(snap.tps_series)
        self.border_subtitle = f"last {numbers.duration(len(snap.tps_series))}"
