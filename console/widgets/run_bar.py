"""A one-line status strip: run phase, elapsed time and the request totals."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers

_PHASE_STYLE = {
    "starting": "$text-warning",
    "running": "$text-success",
    "draining": "$text-warning",
    "stopped": "$text-error",
}


class RunBar(Static):
    """Phase, elapsed time, totals and current latency on one line.

    It sits at the top of the screen so that even in the compact layout (where
    the latency panel is hidden) p50/p99 stay in view. `draining` is set by the
    app the moment the operator quits, before the engine reports it.
    """

    DEFAULT_CSS = """
    RunBar {
        height: 1;
        padding: 0 1;
        background: $panel;
        color: $foreground;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    snapshot: reactive[Snapshot | None] = reactive(None, init=False)
    draining: reactive[bool] = reactive(False, init=False)

    def watch_snapshot(self) -> None:
        self._render_line()

    def watch_draining(self) -> None:
        self._render_line()

    def _render_line(self) -> None:
        snap = self.snapshot
        if snap is None:
            self.update("[$text-muted]waiting for the engine…[/]")
            return
        phase = "draining" if self.draining and snap.phase != "stopped" else snap.phase
        label = "draining…" if phase == "draining" else phase
        style = _PHASE_STYLE.get(phase, "$text-muted")
        balance = snap.balance()
        balance_part = "" if balance == 0 else f"  [$text-error]unaccounted {balance}[/]"
        self.update(
            f"[b {style}]● {label}[/] {numbers.duration(snap.elapsed_s)}"
            f"  [$text-muted]p50[/] {numbers.millis(snap.latency.p50)}"
            f"  [$text-muted]p99[/] {numbers.millis(snap.latency.p99)}"
            f"  [$text-muted]generated[/] {numbers.count(snap.generated)}"
            f"  [$text-muted]ok[/] {numbers.count(snap.succeeded)}"
            f"  [$text-muted]in flight[/] {numbers.count(snap.in_flight)}"
            f"  [$text-muted]429s[/] {numbers.count(snap.rejected_429)}"
            f"  [$text-muted]failed[/] {numbers.count(snap.failed)}"
            f"  [$text-muted]shed[/] {numbers.count(snap.shed)}"
            f"{balance_part}"
        )
