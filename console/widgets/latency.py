"""Latency: p50 and p99 of successful attempts per second, on a log scale."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .chart import Chart, ChartSpec

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


class LatencyPanel(Vertical):
    """p50 and p99 lines per second on a log10 scale of whole decades (a fixed
    scale: small wobbles stay small), with the run's percentiles above."""

    _subtitle: str | None = None  # the border subtitle last set

    snapshot: reactive[Snapshot | None] = reactive(
        None, init=False, repaint=False
    )  # watchers repaint what changed

    def compose(self) -> ComposeResult:
        yield Static(id="latency-stats", classes="panel-stats")
        yield Chart(id="latency-chart")

    def on_mount(self) -> None:
        self.border_title = "Latency send→answer"
        self._stats = self.query_one("#latency-stats", Static)
        self._chart = self.query_one("#latency-chart", Chart)
        self._text = ""

    def show(self, snap: Snapshot, spec: ChartSpec | None, span: str) -> None:
        self.snapshot = snap
        text = latency_text(snap)
        if text != self._text:
            self._text = text
            self._stats.update(text, layout=False)  # two lines, fixed in the stylesheet
        self._chart.spec = spec
        subtitle = f"[{P50_STYLE}]⠒[/] p50 [{P99_STYLE}]⠒[/] p99 · log · {span}"
        if subtitle != self._subtitle:  # the getter gives markup back, not what was set
            self._subtitle = subtitle
            self.border_subtitle = subtitle
