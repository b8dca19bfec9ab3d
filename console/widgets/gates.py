"""Cooldown gates: which budgets the server has closed, for how long, and why.

A gate closes when the server says "slow down" (Retry-After and friends) and
every sender of that budget waits until it opens. An escalation (the server
asking for a longer wait than last time) is what ratedeck exists to avoid, so
it is drawn in the error colour wherever it appears.
"""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from ratedeck.engine.snapshot import GateRow, Snapshot

from .panel import SnapshotPanel

# Detail lines before the panel says "+N more"; keeps the keys table in view.
MAX_GATE_LINES = 5
# Closed gates named in the one-line summary before "+N".
MAX_SUMMARY_NAMES = 3


def closed_gates(gates: tuple[GateRow, ...]) -> list[GateRow]:
    """Closed gates, the longest wait first."""
    return sorted((gate for gate in gates if gate.left_s > 0), key=lambda gate: (-gate.left_s, gate.name))


def escalations(gates: tuple[GateRow, ...]) -> int:
    return sum(gate.escalations for gate in gates)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def gates_summary(gates: tuple[GateRow, ...]) -> str:
    """Markup for one line: how many gates are closed, escalations, the closed ones.

    Counts come first so that the list of names is what an ellipsis cuts, never
    the escalation count: "2 closed · 1 escalation · k1 3.2s, host 1.0s".
    """
    closed = closed_gates(gates)
    raised = escalations(gates)
    raised_part = (
        f"[b $text-error]▲ {plural(raised, 'escalation')}[/]" if raised else "[$text-muted]0 escalations[/]"
    )
    if not closed:
        return f"[$text-success]all {len(gates)} open[/] · {raised_part}"
    names = ", ".join(f"{escape(gate.name)} {gate.left_s:.1f}s" for gate in closed[:MAX_SUMMARY_NAMES])
    if len(closed) > MAX_SUMMARY_NAMES:
        names += f", +{len(closed) - MAX_SUMMARY_NAMES}"
    return f"[b $text-accent]{len(closed)} closed[/] · {raised_part} · {names}"


def has_history(gates: tuple[GateRow, ...]) -> bool:
    """True once any gate has closed: from then on the detail panel is worth its rows."""
    return any(gate.left_s > 0 or gate.closures or gate.escalations for gate in gates)


def _order(gate: GateRow) -> tuple:
    # Closed first (longest wait first), then the ones the server escalated,
    # then those that closed most often.
    return (gate.left_s <= 0, -gate.left_s, -gate.escalations, -gate.closures, gate.name)


def gate_line(gate: GateRow, name_width: int) -> str:
    """One markup line for a gate: state and seconds left, closures, escalations, reason."""
    name = escape(gate.name).ljust(name_width)
    if gate.left_s > 0:
        state = f"◔ {name} closed {gate.left_s:5.1f}s"
        style = "b $text-accent"
    else:
        state = f"● {name} open".ljust(len(name) + 16)
        style = "$text-muted"
    if gate.escalations:
        style = "b $text-error"  # escalated: the error colour whatever the state
    closures = plural(gate.closures, "closure").ljust(12)
    raised = f"▲ {plural(gate.escalations, 'escalation')}" if gate.escalations else ""
    reason = escape(gate.reason) if gate.reason else "—"
    if gate.left_s <= 0 and gate.reason:
        reason = f"last: {reason}"
    return f"[{style}]{state}[/]  {closures} [{style}]{raised:<16}[/] {reason}"


class GatesPanel(SnapshotPanel, Static):
    """One line per gate that is closed or has closed before, closed ones first.

    Gates that never closed are named on one line at the end. The border
    subtitle repeats the count of closed gates and of escalations.
    """

    BORDER_TITLE = "Gates"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        gates = snap.gates
        noted = sorted((gate for gate in gates if has_history((gate,))), key=_order)
        quiet = [gate.name for gate in gates if not has_history((gate,))]
        name_width = max((len(gate.name) for gate in noted), default=4)
        lines = [gate_line(gate, name_width) for gate in noted[:MAX_GATE_LINES]]
        hidden = noted[MAX_GATE_LINES:]
        if hidden:
            more_closed = sum(1 for gate in hidden if gate.left_s > 0)
            lines.append(
                f"[$text-muted]+{len(hidden)} more ({more_closed} closed) · longest waits are listed first[/]"
            )
        if quiet:
            lines.append(f"[$text-muted]never closed: {escape(' '.join(quiet))}[/]")
        text = "\n".join(lines) or "[$text-muted]no gates[/]"
        # its height follows its lines: relayout only when their number changes
        self.show_text(text, layout=text.count("\n") != self._text.count("\n"))
        closed = len(closed_gates(gates))
        raised = escalations(gates)
        subtitle = f"{closed} closed of {len(gates)}" + (
            f" · [b $text-error]▲ {plural(raised, 'escalation')}[/]" if raised else " · 0 escalations"
        )
        self.show_subtitle(subtitle)
