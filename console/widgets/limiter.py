"""Limiter settings the operator can steer: headroom, backpressure, arrival."""

from __future__ import annotations

from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.engine.snapshot import Snapshot

from . import numbers


class LimiterPanel(Static):
    """Headroom (value, adaptive/fixed, range seen), backpressure, arrival rate.

    Below the settings it counts attempts and rejections: the evidence an
    operator needs before moving headroom.
    """

    snapshot: reactive[Snapshot | None] = reactive(None, init=False)

    def on_mount(self) -> None:
        self.border_title = "Limiter"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        mode = (
            "[b $text-success]adaptive[/]" if snap.headroom_adaptive else "[b $text-warning]fixed[/]"
        )
        rejected_429 = (
            f"[$text-warning]{numbers.count(snap.rejected_429)}[/]"
            if snap.rejected_429
            else "0"
        )
        causes = " · ".join(f"{cause} {count}" for cause, count in snap.failures)
        pressure = "[b $text-success]on[/]" if snap.backpressure else "[b $text-warning]off[/]"
        self.update(
            f"[$text-muted]Headroom    [/][b]{snap.headroom_ms:.0f} ms[/] {mode}"
            f" [$text-muted](seen {snap.headroom_min_ms:.0f}–{snap.headroom_max_ms:.0f})[/]\n"
            f"[$text-muted]Backpressure[/] {pressure}\n"
            f"[$text-muted]Arrival     [/][b]{numbers.rate(snap.arrival_rate)}/s[/]\n"
            f"[$text-muted]Attempts    [/]{numbers.count(snap.sent)} sent"
            f" · {numbers.count(snap.retried)} retried\n"
            f"[$text-muted]Rejected    [/]{rejected_429} × 429 · {numbers.count(snap.rejected_other)} other"
            f" · {numbers.count(snap.failed)} failed"
            + (f"\n[$text-muted]Causes      [/]{escape(causes)}" if causes else "")
        )
