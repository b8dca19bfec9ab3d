"""Limiter settings the operator can steer: headroom, backpressure, arrival, throttle."""

from __future__ import annotations

from textual.content import Content
from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.core.vocab import Phase
from ratedeck.engine.engine import LOOP_LAG_WARN_MS
from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .cluster import cluster_line
from .gates import gates_summary
from .goodput import is_message_run, messages_text
from .panel import SnapshotPanel


def throttle_text(snap: Snapshot, excess: bool = True) -> str:
    """Markup for the entry throttle: mode, the rate it admits now, what happens to the excess."""
    assert snap.messages is not None
    if snap.messages.throttle_mode == "off":
        mode = "[b $text-warning]off[/] [$text-muted](no limit)[/]"
    elif snap.messages.throttle_mode == "auto":
        mode = f"[b $text-success]auto[/] [b]{numbers.rate(snap.messages.throttle_rate)} msg/s[/]"
    else:
        mode = f"[b $text-accent]fixed[/] [b]{numbers.rate(snap.messages.throttle_rate)} msg/s[/]"
    return f"{mode} [$text-muted]· excess {escape(snap.messages.excess)}[/]" if excess else mode


def client_text(snap: Snapshot) -> str:
    """Markup for the client's own cost: CPU per answered request and how busy its cores are
    (per process); "" before any answer."""
    cpu = snap.cpu_us_per_request
    if cpu is None:
        return ""
    cores = snap.cpu_cores
    busy = ""
    if cores is not None:  # a core per process: "2×45% core" is 2 processes, each 45% busy
        share = f"{cores * 100 / snap.procs:.0f}% core"
        busy = f" · {snap.procs}×{share}" if snap.procs > 1 else f" · {share}"
    return f"[b]{cpu:.0f} µs[/]/req CPU{busy}"


def _ms(ms: float) -> str:
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def lag_text(snap: Snapshot) -> str:
    """Markup for how late the loop's timers fire: "p50 0.2 · p99 3.1 · max 12 ms" (the last
    minute's, the whole run's once stopped), a p99 over `LOOP_LAG_WARN_MS` in the warning colour."""
    final = snap.phase == Phase.STOPPED
    p50, p99, _ = snap.lag.shown(final)
    worst = snap.lag.run.max if final else snap.loop_lag_ms
    tail = f"[b $text-warning]{_ms(p99)}[/]" if p99 > LOOP_LAG_WARN_MS else f"[b]{_ms(p99)}[/]"
    return f"p50 [b]{_ms(p50)}[/] · p99 {tail} · max {_ms(worst)} ms"


def verdict_text(snap: Snapshot) -> str:
    """Markup for the verdict when the client, not the server, is the limit (highlighted); ""
    when it is not."""
    if not snap.lag.shown(snap.phase == Phase.STOPPED)[2]:
        return ""
    return "[b $text-error]the client, not the server, is the limit[/]"


#: What fits after a limiter panel label at 120 columns.
_VALUE_WIDTH = 30


def basis_lines(snap: Snapshot) -> list[str]:
    """Where the headroom comes from and the round trip's spread: one line when both fit."""
    source, spread = snap.headroom_from(), snap.headroom_spread() or "not measured yet"
    if len(source) + 10 + len(spread) <= _VALUE_WIDTH:
        return [f"[$text-muted]  from      [/]{escape(source)} [$text-muted]· spread[/] {escape(spread)}"]
    return [
        f"[$text-muted]  from      [/]{escape(source)}",
        f"[$text-muted]  spread    [/]{escape(spread)}",
    ]


class LimiterPanel(SnapshotPanel, Static):
    """Headroom (value, adaptive/fixed, range seen), backpressure, arrival rate.

    Below the settings it counts attempts and rejections: the evidence an
    operator needs before moving headroom. A message run adds the entry
    throttle; a run with cooldown gates adds a one-line gate summary; a run
    with a shared store adds a one-line cluster summary (members, shared
    queues) just above the gates. Once answers came, the client's cost (CPU
    per request, cores) and the loop's lag (p50/p99, the worst) take a row
    each, and a highlighted line says when the client, not the server, is the
    limit. When the lines outnumber the panel's rows, the failure causes, the
    loop's lag and then the client's cost give way, never the verdict, the
    cluster or gates line.

    With `compact` (80x24) the panel has three lines, so the settings share
    the first, gates (or attempts, with no gates) take the second and the
    third is the throttle and goodput for a message run, rejections otherwise,
    or the verdict and the loop's lag p99 when the client is the limit.
    """

    BORDER_TITLE = "Limiter"
    compact: reactive[bool] = reactive(False, init=False)

    def watch_snapshot(self) -> None:
        self._render_panel()

    def watch_compact(self) -> None:
        self._render_panel()

    def on_resize(self) -> None:
        self._render_panel()  # the rows it has decide which lines give way

    def _render_panel(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        mode = "[b $text-success]adaptive[/]" if snap.headroom_adaptive else "[b $text-warning]fixed[/]"
        rejected_429 = f"[$text-warning]{numbers.count(snap.rejected_429)}[/]" if snap.rejected_429 else "0"
        pressure = "[b $text-success]on[/]" if snap.backpressure else "[b $text-warning]off[/]"
        messages = is_message_run(snap)
        unit = " msg/s" if messages else "/s"
        headroom = (
            f"[b]{snap.headroom_ms:.0f} ms[/] {mode}"
            f" [$text-muted](seen {snap.headroom_min_ms:.0f}–{snap.headroom_max_ms:.0f})[/]"
        )
        rejected = (
            f"{rejected_429} × 429 · {numbers.count(snap.rejected_other)} other"
            f" · {numbers.count(snap.failed)} failed"
        )
        attempts = f"{numbers.count(snap.sent)} sent · {numbers.count(snap.retried)} retried"
        cpu = client_text(snap)
        if self.compact:
            lines = [
                f"[$text-muted]Headroom[/] {headroom} [$text-muted]· backpressure[/] {pressure}"
                f" [$text-muted]· arrival[/] [b]{numbers.rate(snap.arrival_rate)}{unit}[/]",
            ]
            if snap.gates:
                lines.append(f"[$text-muted]Gates   [/] {gates_summary(snap.gates)}")
            else:
                lines.append(f"[$text-muted]Attempts[/] {attempts}")
            if verdict := verdict_text(snap):  # the client is the limit: that, before the rest
                p99 = snap.lag.shown(snap.phase == Phase.STOPPED)[1]
                lines.append(f"{verdict} [$text-muted]· loop lag p99[/] [b]{_ms(p99)} ms[/]")
            elif messages and snap.messages is not None:
                lines.append(
                    f"[$text-muted]Throttle[/] {throttle_text(snap, excess=False)} [$text-muted]· goodput[/]"
                    f" [b]{numbers.rate(snap.messages.current_goodput)}/s[/] [$text-muted]·[/] {messages_text(snap)}"
                )
            else:
                lines.append(f"[$text-muted]Rejected[/] {rejected}")
            self.show_text("\n".join(lines))  # a fixed-size panel: no relayout
            return
        causes = " · ".join(f"{cause} {count}" for cause, count in snap.failures)
        lines = [
            f"[$text-muted]Headroom    [/]{headroom}",
            *basis_lines(snap),
            f"[$text-muted]Backpressure[/] {pressure} [$text-muted]· arrival[/] [b]{numbers.rate(snap.arrival_rate)}{unit}[/]",
        ]
        if messages:
            lines.append(f"[$text-muted]Throttle    [/]{throttle_text(snap)}")
        lines.append(f"[$text-muted]Attempts    [/]{attempts}")
        lines.append(f"[$text-muted]Rejected    [/]{rejected}")
        if cpu:
            # the embedded simulator answers on the engine's loop: its CPU is in the figures
            label = "Client+sim  " if snap.cpu_with else "Client      "
            lines.append(f"[$text-muted]{label}[/]{cpu}")
            lines.append(f"[$text-muted]Loop lag    [/]{lag_text(snap)}")
            if verdict := verdict_text(snap):
                lines.append(verdict)
        if causes:
            lines.append(f"[$text-muted]Causes      [/]{escape(causes)}")
        if snap.cluster is not None:
            width = self.content_region.width - 12 if self.content_region.width > 12 else _VALUE_WIDTH
            label, value = cluster_line(snap.cluster, width)
            pad = " " * max(1, 12 - len(Content.from_markup(label).plain))
            lines.append(f"[$text-muted]{label}{pad}[/]{value}")
        if snap.gates:
            lines.append(f"[$text-muted]Gates       [/]{gates_summary(snap.gates)}")
        rows = self.content_region.height
        for label in ("Causes", "Loop lag", "Client"):  # what gives way first when the panel is full
            if 0 < rows < len(lines):
                lines = [line for line in lines if not line.startswith(f"[$text-muted]{label}")]
        self.show_text("\n".join(lines))
