"""The console app's state, in small parts: the main screen's widgets, when the keys
table is brought up to date, the charts' span and specs, and quitting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .history import SPANS, RunHistory
from .widgets import numbers
from .widgets.chart import ChartSpec, Series
from .widgets.clients import ClientsPanel
from .widgets.endpoints import EndpointsPanel
from .widgets.errors import ErrorsPanel
from .widgets.event_log import EventLog
from .widgets.gates import GatesPanel
from .widgets.goodput import GOODPUT_STYLE, GoodputPanel
from .widgets.job import JobBar
from .widgets.keys_table import KeysTable
from .widgets.latency import P50_STYLE, P99_STYLE, LatencyPanel
from .widgets.limiter import LimiterPanel
from .widgets.queues import QueuesPanel
from .widgets.run_bar import RunBar
from .widgets.throughput import BAR_STYLE, CAPACITY_STYLE, LIVE_STYLE, ThroughputPanel

if TYPE_CHECKING:
    from textual.app import App
    from textual.widget import Widget
    from textual.widgets import Input

    from ratedeck.engine.snapshot import Snapshot


@dataclass(frozen=True)
class MainWidgets:
    """The main screen's widgets, found once when the app mounts: while a modal is
    open, `query_one` would search the modal."""

    run_bar: RunBar
    job_bar: JobBar
    limiter: LimiterPanel
    throughput: ThroughputPanel
    latency: LatencyPanel
    goodput: GoodputPanel
    keys_table: KeysTable
    filter: Input
    filter_bar: Widget
    event_log: EventLog
    #: The panels that take every snapshot as an attribute.
    panels: tuple[
        GoodputPanel, QueuesPanel, LimiterPanel, GatesPanel, ErrorsPanel, ClientsPanel, EndpointsPanel
    ]

    @classmethod
    def find(cls, app: App, filter_type: type[Input]) -> MainWidgets:
        limiter = app.query_one(LimiterPanel)
        goodput = app.query_one(GoodputPanel)
        return cls(
            run_bar=app.query_one(RunBar),
            job_bar=app.query_one(JobBar),
            limiter=limiter,
            throughput=app.query_one(ThroughputPanel),
            latency=app.query_one(LatencyPanel),
            goodput=goodput,
            keys_table=app.query_one(KeysTable),
            filter=app.query_one(filter_type),
            filter_bar=app.query_one("#filter-bar"),
            event_log=app.query_one(EventLog),
            panels=(
                goodput,
                app.query_one(QueuesPanel),
                limiter,
                app.query_one(GatesPanel),
                app.query_one(ErrorsPanel),
                app.query_one(ClientsPanel),
                app.query_one(EndpointsPanel),
            ),
        )

    def set_compact(self, compact: bool) -> None:
        """The widgets that follow the compact layout."""
        for widget in (self.keys_table, self.limiter, self.throughput):
            widget.compact = compact


class KeysPacing:
    """When the keys table is brought up to date: at once when a key's state changes
    or the operator acts (`now`), otherwise at most every `refresh_s` (each changed
    cell repaints the table)."""

    __slots__ = ("refresh_s", "now", "shown_at", "states")

    def __init__(self, refresh_s: float):
        self.refresh_s = refresh_s
        self.now = True  # update the table at the next pull whatever the time
        self.shown_at = 0.0  # monotonic time the table was last brought up to date
        self.states: tuple[tuple[str, str], ...] = ()

    def due(self, states: tuple[tuple[str, str], ...], now: float) -> bool:
        return self.now or states != self.states or now - self.shown_at >= self.refresh_s

    def shown(self, states: tuple[tuple[str, str], ...], now: float) -> None:
        self.now = False
        self.shown_at = now
        self.states = states


class Charts:
    """The run's history, the charts' time span, and the chart specs drawn from them:
    rebuilt only when the history gains a second or the span changes."""

    __slots__ = ("history", "span_index", "_drawn_for", "tps", "latency", "goodput")

    def __init__(self) -> None:
        self.history = RunHistory()
        self.span_index = 0  # into SPANS
        self._drawn_for: tuple[int, int] | None = None  # (history seconds, span) the specs show
        self.tps = self.latency = self.goodput = ChartSpec("bars", (), span_s=1.0)  # until `update`

    @property
    def span(self) -> tuple[str, int | None]:
        """The time span: (name, seconds or None for the whole run)."""
        return SPANS[self.span_index]

    def next_span(self) -> None:
        self.span_index = (self.span_index + 1) % len(SPANS)

    def update(self, snap: Snapshot) -> str:
        """Bring the specs up to date for `snap`; the label of the span they show."""
        name, span_s = self.span
        points, res_s = self.history.view(span_s)
        shown_s = span_s if span_s is not None else max(len(points) * res_s, 1.0)
        label = f"last {name}" if span_s is not None else f"run {numbers.duration(shown_s)}"
        if (self.history.seconds, self.span_index) == self._drawn_for:
            return label
        self._drawn_for = (self.history.seconds, self.span_index)
        self.tps = ChartSpec(
            "bars",
            (
                Series(tuple(point.tps for point in points), BAR_STYLE),
                Series(tuple(point.live for point in points), LIVE_STYLE),
                Series(tuple(point.capacity for point in points), CAPACITY_STYLE),
            ),
            span_s=shown_s,
            res_s=res_s,
        )
        self.latency = ChartSpec(
            "log",
            (
                Series(tuple(point.p50 for point in points), P50_STYLE),
                Series(tuple(point.p99 for point in points), P99_STYLE, how="max"),
            ),
            span_s=shown_s,
            res_s=res_s,
        )
        calls = snap.messages.calls_per_message if snap.messages is not None else 1
        self.goodput = ChartSpec(
            "bars",
            (
                Series(tuple(point.goodput for point in points), GOODPUT_STYLE),
                Series(
                    tuple(None if point.live is None else point.live / calls for point in points), LIVE_STYLE
                ),
            ),
            span_s=shown_s,
            res_s=res_s,
        )
        return label


@dataclass
class Quitting:
    """How far the app is in leaving: draining the engine, stopping it at once, exiting;
    and the signals it catches meanwhile."""

    draining: bool = False
    stopping_at_once: bool = False
    exiting: bool = False  # late timer ticks pull nothing
    signals: list[int] = field(default_factory=list)
