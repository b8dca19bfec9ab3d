"""Goodput: messages completed per second, when a message needs several calls.

Throughput counts calls; a message of n calls is only worth something when
all n succeed. This panel shows the rate that matters to the caller, and what
the failed ones cost. The app shows it only when `calls_per_message > 1`.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .chart import Chart, ChartSpec

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


class GoodputPanel(Vertical):
    """Goodput (messages completed per second) as bars from zero, with the most the
    live capacity allows (live capacity / calls per message) drawn across."""

    _subtitle: str | None = None  # the border subtitle last set

    snapshot: reactive[Snapshot | None] = reactive(
        None, init=False, repaint=False
    )  # watchers repaint what changed

    def compose(self) -> ComposeResult:
        yield Static(id="goodput-stats", classes="panel-stats")
        yield Chart(id="goodput-chart")

    span = ""  # the charts' span, as the throughput panel says it

    def on_mount(self) -> None:
        self.border_title = "Goodput msg/s"

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
        self.query_one("#goodput-stats", Static).update(
            f"[$text-muted]now[/] [b]{numbers.rate(m.current_goodput)} msg/s[/]"
            f"  [$text-muted]avg[/] [b]{numbers.rate(m.goodput_tps)} msg/s[/]\n"
            f"{messages_text(snap)}\n"
            f"[$text-muted]calls wasted[/] {wasted}"
            f" [$text-muted]· {m.calls_per_message} calls per msg[/]",
            layout=False,  # three lines, fixed in the stylesheet
        )
        subtitle = f"[$accent]─[/] capacity/{m.calls_per_message} · {m.pattern} · {self.span}"
        if subtitle != self._subtitle:  # the getter gives markup back, not what was set
            self._subtitle = subtitle
            self.border_subtitle = subtitle
