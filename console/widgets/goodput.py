"""Goodput: messages completed per second, when a message needs several calls.

Throughput counts calls; a message of n calls is only worth something when
all n succeed. This panel shows the rate that matters to the caller, and what
the failed ones cost. The app shows it only when `calls_per_message > 1`.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .chart import Chart, ChartSpec
from .panel import SnapshotPanel

GOODPUT_STYLE = "$secondary"


def is_message_run(snap: Snapshot | None) -> bool:
    """True when the workload sends messages of several calls each."""
    return snap is not None and snap.messages is not None and snap.messages.calls_per_message > 1


def messages_text(snap: Snapshot) -> str:
    """Markup: completed, failed and shed messages (failed/shed coloured when non-zero)."""
    assert snap.messages is not None
    failed = f"[$text-error]{numbers.count(snap.messages.failed)}[/]" if snap.messages.failed else "0"
    shed = f"[$text-warning]{numbers.count(snap.messages.shed)}[/]" if snap.messages.shed else "0"
    return (
        f"[$text-muted]done[/] [b]{numbers.count(snap.messages.completed)}[/]"
        f" [$text-muted]· failed[/] {failed} [$text-muted]· shed[/] {shed}"
    )


class GoodputPanel(SnapshotPanel, Vertical):
    """Goodput (messages completed per second) as bars from zero, with the most the
    live capacity allows (live capacity / calls per message) drawn across."""

    BORDER_TITLE = "Goodput msg/s"

    def compose(self) -> ComposeResult:
        yield Static(id="goodput-stats", classes="panel-stats")
        yield Chart(id="goodput-chart")

    span = ""  # the charts' span, as the throughput panel says it

    def show_chart(self, spec: ChartSpec | None, span: str) -> None:
        self.span = span
        self.query_one("#goodput-chart", Chart).spec = spec
        if self.snapshot is not None:
            self.watch_snapshot(self.snapshot)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or snap.messages is None:
            return
        m = snap.messages
        wasted = f"[$text-warning]{numbers.count(m.calls_wasted)}[/]" if m.calls_wasted else "0"
        self.show_text(
            f"[$text-muted]now[/] [b]{numbers.rate(m.current_goodput)} msg/s[/]"
            f"  [$text-muted]avg[/] [b]{numbers.rate(m.goodput_tps)} msg/s[/]\n"
            f"{messages_text(snap)}\n"
            f"[$text-muted]calls wasted[/] {wasted}"
            f" [$text-muted]· {m.calls_per_message} calls per msg[/]",
            self.query_one("#goodput-stats", Static),  # three lines, fixed in the stylesheet
        )
        self.show_subtitle(f"[$accent]─[/] capacity/{m.calls_per_message} · {m.pattern} · {self.span}")
