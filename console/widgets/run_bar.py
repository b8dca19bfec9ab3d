"""The header: what the run is doing and why, then the figures that matter most.

Left to right in order of importance, so a narrow terminal cuts the least
important end: state and reason, elapsed, 429s and failures, throughput
against the live capacity, latency, then the request totals.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.markup import escape
from textual.reactive import reactive
from textual.widgets import Static

from ratedeck.core.numbers import usd
from ratedeck.engine.snapshot import Snapshot

from . import numbers
from .gates import closed_gates
from .panel import SnapshotPanel


@dataclass(frozen=True)
class RunStatus:
    """What the header says the run is doing: a word, why, and its colour."""

    icon: str
    word: str
    reason: str
    style: str


def run_status(snap: Snapshot, draining: bool = False, drain_reason: str = "") -> RunStatus:
    """Running, paused, waiting, all blocked, draining or stopped, with the reason.

    Derived from the phase and the keys' states.
    """
    if snap.phase == "stopped":
        return RunStatus("■", "stopped", "", "$text-error")
    if draining or snap.phase == "draining":
        return RunStatus("◌", "draining", drain_reason or "finishing in-flight requests", "$text-warning")
    if snap.phase == "starting":
        return RunStatus("○", "starting", "", "$text-warning")
    keys = snap.keys
    blocked = sum(1 for row in keys if row.state == "blocked")
    paused = sum(1 for row in keys if row.state == "paused")
    cooling = sum(1 for row in keys if row.state == "cooling")
    usable = len(keys) - blocked
    if keys and blocked == len(keys):
        return RunStatus("✖", "all blocked", "the server refused every key", "$text-error")
    if keys and paused == usable:
        reason = "every key paused by the operator" if not blocked else f"paused; {blocked} blocked"
        return RunStatus("‖", "paused", reason, "$text-warning")
    if keys and paused + cooling == usable:
        gates = closed_gates(snap.gates)
        reason = f"gate {gates[0].name} {gates[0].left_s:.1f}s" if gates else "cooldowns"
        return RunStatus("◔", "waiting", reason, "$text-accent")
    notes = []
    if blocked:
        notes.append(f"{blocked} blocked")
    if paused:
        notes.append(f"{paused} paused")
    if cooling:
        notes.append(f"{cooling} cooling")
    return RunStatus("●", "running", ", ".join(notes), "$text-success")


def header_text(snap: Snapshot, draining: bool = False, drain_reason: str = "") -> str:
    """The header's markup line.

    A stopped, paused, waiting or draining run says why right after its state;
    a running one lists its keys that cannot send after the failures, so the
    429s and failures stay in view at 80 columns.
    """
    status = run_status(snap, draining, drain_reason)
    running = status.word == "running"
    reason = f" [$text-muted]({escape(status.reason)})[/]" if status.reason and not running else ""
    balance = snap.balance()
    r429 = f"[b $text-warning]{numbers.count(snap.rejected_429)}[/]" if snap.rejected_429 else "0"
    other = f"[b $text-error]{numbers.count(snap.rejected_other)}[/]" if snap.rejected_other else "0"
    failed = f"[b $text-error]{numbers.count(snap.failed)}[/]" if snap.failed else "0"
    parts = [
        f"[b {status.style}]{status.icon} {status.word}[/]{reason} {numbers.duration(snap.elapsed_s)}",
        f"[$text-muted]429s[/] {r429}",
        f"[$text-muted]4xx[/] {other}",
        f"[$text-muted]failed[/] {failed}",
    ]
    if running and status.reason:
        parts.append(f"[$text-accent]{escape(status.reason)}[/]")
    parts += [
        f"[b]{numbers.rate(snap.current_tps)}[/][$text-muted]/s of[/] {numbers.rate(snap.live_capacity_tps)}"
        "[$text-muted] live[/]",
        f"[$text-muted]p99[/] {numbers.percentile(snap.latency, snap.latency.p99)}",
        f"[$text-muted]p50[/] {numbers.percentile(snap.latency, snap.latency.p50)}",
        f"[$text-muted]ok[/] {numbers.count(snap.succeeded)}",
        f"[$text-muted]in flight[/] {numbers.count(snap.in_flight)}",
        f"[$text-muted]generated[/] {numbers.count(snap.generated)}",
        f"[$text-muted]shed[/] {numbers.count(snap.shed)}",
    ]
    if snap.spend is not None:
        parts.insert(len(parts) - 4, spend_text(snap))  # before the request totals
    if balance:
        parts.insert(1, f"[b $text-error]unaccounted {balance}[/]")
    return "  ".join(parts)


def spend_text(snap: Snapshot) -> str:
    """The header's bill: "spent $0.0123", with the cost cap ("of $1.00", "cap reached") and
    the models with no price ("+ 1 unpriced")."""
    spend = snap.spend
    if spend is None:
        return ""
    text = f"[$text-muted]spent[/] [b]{usd(spend.total_usd)}[/]"
    if spend.unpriced:
        text += f" [$text-warning]+ {len(spend.unpriced)} unpriced[/]"
    if spend.cap_usd is not None:
        if spend.capped:
            text += f" [b $text-warning]cap {usd(spend.cap_usd)} reached[/]"
        else:
            text += f" [$text-muted]of[/] {usd(spend.cap_usd)}"
    return text


class RunBar(SnapshotPanel, Static):
    """One line: state (running / paused / waiting / all blocked / draining) with
    the reason, then 429s and failures first so 80 columns keep them.

    `draining` and `drain_reason` are set by the app the moment the operator
    quits, before the engine reports it.
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

    draining: reactive[bool] = reactive(False, init=False)
    drain_reason: reactive[str] = reactive("", init=False)

    def watch_snapshot(self) -> None:
        self._render_line()

    def watch_draining(self) -> None:
        self._render_line()

    def watch_drain_reason(self) -> None:
        self._render_line()

    def _render_line(self) -> None:
        snap = self.snapshot
        text = (
            "[$text-muted]waiting for the engine…[/]"
            if snap is None
            else header_text(snap, self.draining, self.drain_reason)
        )
        self.show_text(text)  # one line, always
