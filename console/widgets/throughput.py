"""Throughput: successes per second against what the keys that can send allow."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .chart import Chart, ChartSpec
from .panel import SnapshotPanel

BAR_STYLE = "$success"
LIVE_STYLE = "$accent"
CAPACITY_STYLE = "$text-muted"


def capacity_style(pct: float) -> str:
    """Colour for "% of capacity": near the limit is the goal, so it is green."""
    if pct >= 90:
        return "$text-success"
    if pct >= 60:
        return "$text-warning"
    return "$text-error"


def sending_keys(snap: Snapshot) -> tuple[int, int]:
    """(keys that can send now, all keys)."""
    return sum(1 for row in snap.keys if row.state == "active"), len(snap.keys)


def throughput_text(snap: Snapshot, compact: bool = False) -> str:
    """Markup: current and average rate, and the share of the live capacity used now.

    The share is of `live_capacity_tps` (keys that can send now), not of every
    key's capacity: with half the keys cooling, 100% means "all that is allowed".
    """
    live = snap.live_capacity_tps
    pct = 100.0 * snap.current_tps / live if live > 0 else 0.0
    used = (
        f"[b {capacity_style(pct)}]{pct:.0f}%[/] [$text-muted]of[/] [b]{numbers.rate(live)}[/] [$text-muted]live[/]"
        if live > 0
        else "[b $text-error]no key can send[/]"
    )
    first = f"[$text-muted]now[/] [b]{numbers.rate(snap.current_tps)}/s[/] [$text-muted]·[/] {used}"
    if compact:
        return f"{first} [$text-muted]· avg[/] {numbers.rate(snap.throughput_tps)}"
    sending, total = sending_keys(snap)
    return (
        f"{first}\n[$text-muted]avg[/] {numbers.rate(snap.throughput_tps)}/s"
        f" [$text-muted]· {sending}/{total} keys · all[/] {numbers.rate(snap.capacity_tps)}/s"
    )


class ThroughputPanel(SnapshotPanel, Vertical):
    """Successes per second as bars from zero, with the live capacity line (─)
    and every key's capacity (┄) drawn across; the y-axis is in requests/s."""

    BORDER_TITLE = "Throughput /s"
    compact: reactive[bool] = reactive(False, init=False)

    def compose(self) -> ComposeResult:
        yield Static(id="tps-stats", classes="panel-stats")
        yield Chart(id="tps-chart")

    def on_mount(self) -> None:
        self._stats = self.query_one("#tps-stats", Static)
        self._chart = self.query_one("#tps-chart", Chart)

    def show(self, snap: Snapshot, spec: ChartSpec | None, span: str) -> None:
        """New data: the snapshot's figures and the chart over the chosen span."""
        self.snapshot = snap
        self.show_text(throughput_text(snap, self.compact), self._stats)  # fixed height in the stylesheet
        self._chart.spec = spec
        self.show_subtitle(f"[{LIVE_STYLE}]─[/] live [$text-muted]┄[/] all keys · {span}")

    def watch_compact(self) -> None:
        if self.snapshot is not None:
            self._text = throughput_text(self.snapshot, self.compact)
            self._stats.update(self._text)
