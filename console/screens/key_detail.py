"""One key up close: window fill, the server's own count, latency, last errors, gates.

Opened with Enter on a key; n / p step to the next / previous key in the
table's order (sort and filter included); Esc or q goes back. The app hands
every new snapshot to the screen while it is open.

Everything here comes from the key's `KeyRow`: its fingerprint, the server's
own count when its answers carry one ("unknown" until then), the key's own
latency percentiles and, where an engine reports them, `recent_errors`
(`ErrorRow`s, newest last; read with `getattr`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.markup import escape
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static

from ratedeck.engine.snapshot import BudgetRow, ErrorRow, KeyRow, Snapshot

from ..widgets import numbers
from ..widgets.errors import KIND_STYLE, by_count, cause_text, one_line, status_text
from ..widgets.event_log import event_line
from ..widgets.gauge import Gauge
from ..widgets.keys_table import out_of_quota, state_text

MAX_EVENTS = 40
MAX_ERRORS = 8
_STATE_STYLE = {
    "active": "$text-success",
    "paused": "$text-warning",
    "cooling": "$text-accent",
    "blocked": "$text-error",
}


def unknown(why: str) -> str:
    return f"[$text-muted]unknown[/] [$text-muted i]({why})[/]"


def head_text(row: KeyRow) -> str:
    fp = row.fingerprint
    fp_part = f"fingerprint [b]{escape(fp)}[/]" if fp else "[$text-muted]no fingerprint (short secret)[/]"
    style = _STATE_STYLE.get(str(row.state), "$text-error")
    note = (
        " [$text-error]· refused by the server for good; it is not used[/]" if row.state == "blocked" else ""
    )
    if out_of_quota(row):
        note = " [$text-error]· out of quota: waiting will not bring it back; it is not used[/]"
    if row.state == "blocked" and row.refused_message:
        note += f" [$text-error]({escape(row.refused_message)})[/]"  # masked where it was made
    return f"[b]{escape(row.label)}[/] {escape(row.masked)} · {fp_part} · [b {style}]{escape(state_text(row))}[/]{note}"


def limit_text(row: KeyRow) -> str:
    """The limit the key was given, and one learned from the server's rejections."""
    told = escape(row.told_limit) or "[$text-muted]none given[/]"
    learned = row.learned_limit
    if row.followed:
        return f"[b]{escape(row.followed)}[/] [$text-muted](the server's headers; told {told})[/]"
    if learned:
        return f"told {told}, [b $text-warning]learned {escape(learned)}[/] [$text-muted](from rejections)[/]"
    return f"[b]{told}[/]"


def changed(row: KeyRow) -> bool:
    """Whether the estimate says more than the told limit does (it moved, or the server set it)."""
    return row.estimate_moved_ago_s is not None or row.estimate_reason not in ("", "told")


def estimate_text(row: KeyRow) -> str | None:
    """The key's limit estimate: what, why, since when and how it climbs; None without one."""
    if not row.limit_estimate:
        return None
    style = "$text-warning" if row.estimate_reason.startswith(("lowered", "climbing")) else "$text"
    moved = (
        f"moved {row.estimate_moved_ago_s:.1f}s ago"
        if row.estimate_moved_ago_s is not None
        else "never moved"
    )
    return (
        f"estimate [b {style}]{escape(row.limit_estimate)}[/] {escape(row.estimate_reason)}"
        f" [$text-muted]· {moved} · climbs {escape(row.estimate_climb)}[/]"
    )


def shared_line(row: KeyRow) -> str | None:
    if row.shared_share is None:
        return None
    return f"[b $text-warning]shared[/]: someone else used {row.shared_share:.0%} of this window"


def window_text(row: KeyRow) -> str:
    remaining, limit, reset = row.server_remaining, row.server_limit, row.server_reset_in_s
    if remaining is None:
        server = unknown("server sent none")
    else:
        server = f"[b]{numbers.count(remaining)}[/] remaining"
        if limit is not None:
            server += f" of {numbers.count(limit)}"
        if reset is not None:
            server += f" · resets in {reset:.1f}s"
    return "\n".join(
        (
            f"[$text-muted]Server says [/] {server}",
            f"[$text-muted]Limit       [/] {limit_text(row)}",
            f"[$text-muted]In flight   [/] {in_flight_text(row)}",
            f"[$text-muted]Sent        [/] {numbers.count(row.sent)}"
            f"  [$text-muted]ok[/] {numbers.count(row.succeeded)}",
            f"[$text-muted]429s        [/] {numbers.count(row.rejected_429)}"
            f"  [$text-muted]other failures[/] {numbers.count(max(0, row.errors - row.rejected_429))}",
        )
    )


def in_flight_text(row: KeyRow) -> str:
    """ "3 of 18 (auto: rate x round trip)", or "3 of 8 (pinned)"."""
    text = numbers.count(row.in_flight)
    if row.in_flight_limit:
        how = "auto: rate x round trip" if row.in_flight_auto else "pinned"
        text += f" of {numbers.count(row.in_flight_limit)} [$text-muted]({how})[/]"
    return text


def latency_text(row: KeyRow, snap: Snapshot) -> str:
    """The last answer, this key's own percentiles (p50 and p99 first: they fit at 80 columns)
    and every key's together, send -> answer."""
    summary = row.latency
    lines = [f"[$text-muted]Last        [/] [b]{numbers.millis(row.last_latency_ms)}[/]"]
    if summary.count:
        lines += [
            f"[$text-muted]This key    [/] p50 [b]{numbers.millis(summary.p50)}[/]"
            f"  p99 [b]{numbers.millis(summary.p99)}[/]",
            f"             p90 {numbers.millis(summary.p90)}  max {numbers.millis(summary.max)}",
            f"             [$text-muted]{numbers.count(summary.count)} successes[/]",
        ]
    else:
        lines.append("[$text-muted]This key     no successes yet[/]")
    lines.append(
        f"[$text-muted]All keys    [/] p50 {numbers.millis(snap.latency.p50)}  p99 {numbers.millis(snap.latency.p99)}"
    )
    return "\n".join(lines)


def key_errors(row: KeyRow, snap: Snapshot) -> list[ErrorRow]:
    """This key's recent errors, newest first; else the error groups it got last."""
    if row.recent_errors:
        return list(row.recent_errors)[-MAX_ERRORS:][::-1]
    return [error for error in by_count(snap.errors) if error.last_key == row.label][:MAX_ERRORS]


def errors_text(row: KeyRow, snap: Snapshot) -> str:
    lines = []
    if row.last_status is not None or row.last_error:
        status = "—" if row.last_status is None else str(row.last_status)
        lines.append(
            f"[$text-muted]Last answer [/] [b]{status}[/]"
            + (f"  [$text-muted]last error[/] {escape(one_line(row.last_error))}" if row.last_error else "")
        )
    errors = key_errors(row, snap)
    for error in errors:
        style = KIND_STYLE.get(str(error.kind), "$text-error")
        lines.append(
            f"[b {style}]{status_text(error):>3} {escape(cause_text(error))}[/]"
            f" [$text-muted]×{numbers.count(error.count)} · last at {numbers.duration(error.last_at_s)}[/]\n"
            f"    {escape(one_line(error.last_text)) or '[$text-muted](no body)[/]'}"
        )
    if not lines:
        return "[$text-success]no failed attempts[/]"
    if not errors and row.errors:
        lines.append(
            f"[$text-muted]{numbers.count(row.errors)} failed attempts; groups were last seen on other keys[/]"
        )
    return "\n".join(lines)


def key_budgets(row: KeyRow, snap: Snapshot) -> list[BudgetRow]:
    """The budgets this key spends from: its own, then the host's (every key spends those)."""
    return [b for b in snap.budgets if b.owner == row.label] + [b for b in snap.budgets if b.owner == "host"]


def _per_min(value: float | None) -> str:
    return "[$text-muted]not learned yet[/]" if value is None else f"{numbers.count(round(value))}/min"


def budgets_text(row: KeyRow, snap: Snapshot) -> str:
    """Per budget: the window now (used/limit), what it allows per minute, and reserved against
    settled over the run; the unit that binds the key now is marked."""
    budgets = key_budgets(row, snap)
    width = max((len(b.name) for b in budgets), default=0)
    width = max(width, len("requests")) + 1
    lines = []
    if row.binding == "requests":  # the key's own limit binds, not a budget
        lines.append(
            f"[b]{'requests':<{width}}[/] {numbers.count(row.window_used)}/{numbers.count(row.window_limit)}"
            " now  [$text-muted](the key's own limit)[/] [b $text-warning]◀ binds now[/]"
        )
    for b in budgets:
        fill = b.used / b.limit if b.limit else 0.0
        style = "$text-error" if fill >= 1 else "$text-warning" if fill >= 0.9 else ""
        now = f"{numbers.count(b.used)}/{numbers.count(b.limit)}" if b.limit else "—"
        name = escape(f"{b.name:<{width}}")
        binds = b.owner == row.label and b.name == row.binding
        settled = (
            f"  [$text-muted]settled[/] {numbers.count(b.settled)} ({b.settled / b.reserved:.0%})"
            if b.reserved
            else "  [$text-muted]nothing reserved yet[/]"
        )
        lines.append(
            f"[b]{name}[/] [b {style}]{now}[/] now  {_per_min(b.per_min)}"
            f"  [$text-muted]reserved[/] {numbers.count(b.reserved)}{settled}"
            + (" [$text-muted](host)[/]" if b.owner == "host" else "")
            + (" [b $text-warning]◀ binds now[/]" if binds else "")
        )
    if out_of_quota(row):
        lines.append("[b $text-error]out of quota[/]: refused for good; its budgets are no longer spent")
    return "\n".join(lines)


def mentions(label: str) -> Callable[[str], bool]:
    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(label)}(?![A-Za-z0-9_])")
    return lambda text: bool(pattern.search(text))


def gates_text(row: KeyRow, snap: Snapshot) -> str:
    lines = []
    # The limit estimate, when it says more than the told limit, and someone else's share.
    estimate = estimate_text(row) if changed(row) else None
    if estimate:
        lines.append(f"[b]limit[/] {estimate}")
    shared = shared_line(row)
    if shared:
        lines.append(shared)
    for gate in snap.gates:
        if gate.name not in (row.label, "host"):
            continue
        state = f"[b $text-accent]closed {gate.left_s:.1f}s[/]" if gate.left_s > 0 else "[$text-muted]open[/]"
        raised = f" [b $text-error]▲ {gate.escalations} escalations[/]" if gate.escalations else ""
        reason = f" · {'' if gate.left_s > 0 else 'last: '}{escape(gate.reason)}" if gate.reason else ""
        lines.append(f"[b]{escape(gate.name):<5}[/] {state} · {gate.closures} closures{raised}{reason}")
    if not snap.gates:
        lines.append("[$text-muted]no gates reported[/]")
    about = mentions(row.label)
    events = [event for event in snap.events if about(event.text)][-MAX_EVENTS:]
    lines.append("")
    lines.extend(event_line(event) for event in events)
    if not events:
        lines.append(
            f"[$text-muted]no events about {escape(row.label)} in the last {len(snap.events)} events[/]"
        )
    return "\n".join(lines)


class KeyDetailScreen(Screen[None]):
    """Everything known about one key, live."""

    BINDINGS = [
        Binding("escape,q", "close", "Back", id="close_detail"),
        Binding("n", "step(1)", "Next key", id="next_key"),
        Binding("p", "step(-1)", "Previous key", id="previous_key"),
    ]

    snapshot: reactive[Snapshot | None] = reactive(
        None, init=False, repaint=False
    )  # watchers repaint what changed

    def __init__(self, label: str, snapshot: Snapshot | None, order: Callable[[], list[str]]) -> None:
        super().__init__()
        self.label = label
        self._order = order  # labels in the table's order, for n / p
        self._initial = snapshot

    def compose(self) -> ComposeResult:
        yield Static(id="detail-head")
        with VerticalScroll(id="detail-body"):
            with Horizontal(id="detail-top"):
                with VerticalScroll(id="detail-window", classes="panel"):
                    yield Gauge("Window", id="detail-fill")
                    yield Static(id="detail-window-text")
                yield Static(id="detail-latency", classes="panel")
            yield Static(id="detail-budgets", classes="panel")
            yield Static(id="detail-errors", classes="panel")
            yield Static(id="detail-gates", classes="panel")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#detail-window").border_title = "Window"
        self.query_one("#detail-latency").border_title = "Latency"
        self.query_one("#detail-budgets").border_title = "Budgets"
        self.query_one("#detail-budgets").display = False  # a run with budgets shows it
        self.query_one("#detail-errors").border_title = "Last errors"
        self.query_one("#detail-gates").border_title = "Gates and events"
        self.snapshot = self._initial

    def watch_snapshot(self) -> None:
        self._render_all()

    def _render_all(self) -> None:
        if not self.query("#detail-fill"):
            return  # a snapshot that came before the screen composed: on_mount renders it
        snap = self.snapshot
        row = next((key for key in snap.keys if key.label == self.label), None) if snap else None
        head = self.query_one("#detail-head", Static)
        if snap is None or row is None:
            head.update(f"[b]{escape(self.label)}[/] [$text-muted]is not in the latest snapshot[/]")
            return
        head.update(head_text(row))
        fill = row.window_used / row.window_limit if row.window_limit else 0.0
        level = "error" if fill >= 1 else "warning" if fill >= 0.9 else "ok"
        self.query_one("#detail-fill", Gauge).show(
            row.window_used,
            row.window_limit,
            f"{row.window_used}/{row.window_limit} ({fill:.0%})" if row.window_limit else "no limit known",
            level,
        )
        self.query_one("#detail-window-text", Static).update(window_text(row))
        self.query_one("#detail-latency", Static).update(latency_text(row, snap))
        budgets = self.query_one("#detail-budgets", Static)
        budgets.display = bool(key_budgets(row, snap))
        if budgets.display:
            budgets.update(budgets_text(row, snap))
            budgets.border_subtitle = "used/limit now · per minute · reserved vs settled over the run"
        self.query_one("#detail-errors", Static).update(errors_text(row, snap))
        self.query_one("#detail-gates", Static).update(gates_text(row, snap))
        self.query_one(
            "#detail-gates", Static
        ).border_subtitle = f"gate {row.label} and host · events naming {row.label}"

    def action_step(self, step: int) -> None:
        order = self._order()
        if not order:
            return
        index = order.index(self.label) if self.label in order else -1
        self.label = order[(index + step) % len(order)]
        self._render_all()

    def action_close(self) -> None:
        self.dismiss(None)
