"""Latency: p50 and p99 of successful attempts per second, on a log scale."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .chart import Chart, ChartSpec
from .panel import SnapshotPanel

P50_STYLE = "$primary"
P99_STYLE = "$warning"


def latency_text(snap: Snapshot) -> str:
    """Markup: send->answer percentiles, then arrival->done and queue wait."""
    lat, total, wait = snap.latency, snap.latency_total, snap.queue_wait
    ms = numbers.percentile
    lines = [
        f"[{P50_STYLE}]p50[/] [b]{ms(lat, lat.p50)}[/]"
        f" [$text-muted]·[/] [{P99_STYLE}]p99[/] [b]{ms(lat, lat.p99)}[/]"
        f" [$text-muted]· p90[/] {ms(lat, lat.p90)}"
    ]
    second = f"[$text-muted]max[/] {ms(lat, lat.max)}"
    if total.count or wait.count:
        second += (
            f" [$text-muted]· end-to-end p99[/] {ms(total, total.p99)}"
            f" [$text-muted]· queue wait p99[/] {ms(wait, wait.p99)}"
        )
    lines.append(second)
    return "\n".join(lines)


class LatencyPanel(SnapshotPanel, Vertical):
    """p50 and p99 lines per second on a log10 scale of whole decades (a fixed
    scale: small wobbles stay small), with the run's percentiles above."""

    BORDER_TITLE = "Latency send→answer"

    def compose(self) -> ComposeResult:
        yield Static(id="latency-stats", classes="panel-stats")
        yield Chart(id="latency-chart")

    def on_mount(self) -> None:
        self._stats = self.query_one("#latency-stats", Static)
        self._chart = self.query_one("#latency-chart", Chart)

    def show(self, snap: Snapshot, spec: ChartSpec | None, span: str) -> None:
        self.snapshot = snap
        self.show_text(latency_text(snap), self._stats)  # two lines, fixed in the stylesheet
        self._chart.spec = spec
        self.show_subtitle(f"[{P50_STYLE}]⠒[/] p50 [{P99_STYLE}]⠒[/] p99 · log · {span}")
