"""The gateway's clients: how many wait for the limits, how long they waited, what they got.

Shown only for a gateway (`Snapshot.clients` set): one line under the keys, beside
which the gates panel sits when a gate has closed. A gateway with `[[gateway.clients]]`
adds a table under that line, one row per client: its priority (and weight), its requests
waiting, its queue waits, its share of the binding unit over the last 60 s, what is left of
its quotas, and the requests its quota refused. The table is left out at small sizes
(App.-compact), where the one line stays.

A gateway serving the Batch APIs (`ClientView.batches`) adds its batches under that: a summary
line (batches by status, lines left, when the last should end), then one line per batch (at
most `MOST_BATCHES`, those not final first): its id's end, API, client, status, lines ended of
all with a bar, lines failed, ETA. At small sizes the summary line alone stays.
"""

from __future__ import annotations

from collections import Counter

from textual.markup import escape
from textual.widgets import Static

from ratedeck.engine.snapshot import BatchRow, ClientRow, ClientView, QuotaRow, Snapshot
from ratedeck.gateway.batches.records import FINAL, UNFINISHED

from . import numbers
from .panel import SnapshotPanel

#: Status the gateway counts for a client that left before its answer (never sent).
CLIENT_GONE = 499
#: Clients shown in the table at most; the rest are counted on one more line.
MOST_ROWS = 8
#: Batches shown a line each at most; the rest are counted on one more line.
MOST_BATCHES = 5
#: A batch id is shown by its last characters (the APIs' ids share their prefix).
BATCH_ID_CHARS = 8
_GAP = "  "
_BAR = 10
#: Batch statuses in the order a batch goes through them (the summary's order).
_STATUSES = (*UNFINISHED, *FINAL)
_STATUS_STYLE = {
    "validating": "$text-muted",
    "in_progress": "b $text-accent",
    "finalizing": "$text-accent",
    "cancelling": "$text-warning",
    "completed": "$text-success",
    "failed": "b $text-error",
    "cancelled": "$text-muted",
}
_PRIORITY_STYLE = {"interactive": "b $text-accent", "standard": "", "batch": "$text-muted"}


def clients_line(c: ClientView) -> str:
    """Markup for one line: waiting now, queue wait p50/p99, answers by status (errors marked)."""
    parts = []
    for status, count in c.statuses:
        name = "left" if status == CLIENT_GONE else str(status)
        style = "$text-success" if 200 <= status < 300 else "$text-warning" if status < 500 else "$text-error"
        parts.append(f"[{style}]{name}[/] ×{count}")
    answers = " · ".join(parts) or "[$text-muted]none yet[/]"
    waiting = f"[b $text-accent]{c.waiting} waiting[/]" if c.waiting else "[$text-muted]0 waiting[/]"
    return (
        f"{waiting} · queue wait p50 {c.wait_p50_ms:.0f} ms, p99 {c.wait_p99_ms:.0f} ms · answers {answers}"
    )


def priority_text(r: ClientRow) -> str:
    """Its priority, with its weight when that is not 1: "standard ×3"."""
    return r.priority if r.weight == 1 else f"{r.priority} ×{r.weight:g}"


def wait_text(ms: float) -> str:
    """A queue wait: whole milliseconds below a second, else seconds ("840 ms", "2.4 s", "31 s")."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{ms / 1000:.1f} s" if ms < 10_000 else f"{ms / 1000:.0f} s"


def _amount(value: float, quota: str) -> str:
    return f"${value:,.2f}" if quota.startswith("usd") else f"{value:,.0f}"


def quota_text(q: QuotaRow) -> str:
    """One quota and what is left of it: "tokens_per_minute 12,000 of 100,000 left"."""
    return f"{q.name} {_amount(q.left, q.name)} of {_amount(q.limit, q.name)} left"


def _quota_markup(q: QuotaRow) -> str:
    # the colour says how near the limit it is: none left, under a tenth left, or plenty
    style = "b $text-error" if q.left <= 0 else "$text-warning" if q.left < 0.1 * q.limit else ""
    text = escape(quota_text(q))
    return f"[{style}]{text}[/]" if style else text


def _share_bar(share: float, width: int) -> str:
    filled = round(min(1.0, max(0.0, share)) * width)
    return f"[$accent]{'━' * filled}[/][$foreground 15%]{'━' * (width - filled)}[/]"


def client_rows(c: ClientView, most: int = MOST_ROWS) -> list[str]:
    """Markup for the clients' table: a header, then one line per client (at most `most`,
    then one line counting the others). [] with one token (no `rows`).

    Columns: name, priority (×weight), waiting, queue wait p50 / p99, share of the binding unit
    over the last 60 s (a bar and a percentage), requests refused (only when a quota refused
    some), and what is left of each quota, last so that a narrow terminal cuts only that."""
    if not c.rows:
        return []
    shown = c.rows[:most]
    name_w = max(6, *(len(r.name) for r in shown))
    prio_w = max(8, *(len(priority_text(r)) for r in shown))
    waits = [f"{wait_text(r.wait_p50_ms)} / {wait_text(r.wait_p99_ms)}" if r.sent else "—" for r in shown]
    wait_head = "wait p50 / p99"
    wait_w = max(len(wait_head), *(len(w) for w in waits))
    share_head = f"share of {c.unit}"
    bar_w = max(6, len(share_head) - 5)
    refusing = any(r.refused for r in c.rows)
    heads = [
        "client".ljust(name_w),
        "priority".ljust(prio_w),
        "waiting",
        wait_head.rjust(wait_w),
        share_head.ljust(bar_w + 5),
        *(["refused"] if refusing else []),
        "quota left",
    ]
    lines = [f"[$text-muted]{_GAP.join(heads)}[/]"]
    for r, wait in zip(shown, waits, strict=True):
        prio = priority_text(r)
        style = _PRIORITY_STYLE.get(r.priority, "")
        prio_cell = f"[{style}]{escape(prio)}[/]" if style else escape(prio)
        waiting = f"{r.waiting:>7}"
        pct = f"{r.share * 100:.0f}%".rjust(4)
        cells = [
            f"[b]{escape(r.name)}[/]" + " " * (name_w - len(r.name)),
            prio_cell + " " * (prio_w - len(prio)),
            f"[b $text-accent]{waiting}[/]" if r.waiting else f"[$text-muted]{waiting}[/]",
            wait.rjust(wait_w),
            f"{_share_bar(r.share, bar_w)} {pct}",
        ]
        if refusing:
            cells.append(f"[$text-warning]{r.refused:>7}[/]" if r.refused else " " * 7)
        cells.append(" · ".join(_quota_markup(q) for q in r.quotas) or "[$text-muted]none[/]")
        lines.append(_GAP.join(cells))
    if len(c.rows) > most:
        others = len(c.rows) - most
        lines.append(
            f"[$text-muted]… and {others} more client{'s' if others > 1 else ''}"
            " (the report and /metrics hold every one)[/]"
        )
    return lines


# ---------------------------------------------------------------- batches (the Batch APIs)


def eta_text(b: BatchRow) -> str:
    """ "eta 1m20s"; "eta —" while the batch has no rate yet; "" once it is final."""
    if b.status in FINAL:
        return ""
    return "eta —" if b.eta_s is None else f"eta {numbers.duration(b.eta_s)}"


def batches_eta(batches: tuple[BatchRow, ...]) -> float | None:
    """When the last batch not final should end: the latest ETA of those that have one (None
    when none has: no rate yet, or every batch is final)."""
    known = [b.eta_s for b in batches if b.status not in FINAL and b.eta_s is not None]
    return max(known) if known else None


def batches_summary(batches: tuple[BatchRow, ...]) -> str:
    """Markup for one line: "batches: 2 in progress · 1 completed · 340 lines left · eta 1m20s"
    ("" with no batches). Lines left and the ETA count the batches not final only (the ETA:
    `batches_eta`, "—" while no batch has one)."""
    if not batches:
        return ""
    counts = Counter(b.status for b in batches)
    order = [s for s in _STATUSES if s in counts] + sorted(s for s in counts if s not in _STATUSES)
    parts = [f"[{_STATUS_STYLE.get(s, '')}]{counts[s]} {escape(s.replace('_', ' '))}[/]" for s in order]
    live = [b for b in batches if b.status not in FINAL]
    if live:
        left = sum(b.left for b in live)
        parts.append(f"{numbers.count(left)} line{'' if left == 1 else 's'} left")
        eta = batches_eta(batches)
        parts.append("eta —" if eta is None else f"eta {numbers.duration(eta)}")
    return "[b]batches:[/] " + " · ".join(parts)


def _lines_bar(b: BatchRow) -> str:
    share = b.done / b.total if b.total > 0 else 1.0
    filled = round(min(1.0, share) * _BAR)
    style = "$success" if b.status == "completed" else "$accent"
    return f"[{style}]{'━' * filled}[/][$foreground 15%]{'━' * (_BAR - filled)}[/]"


def batch_rows(batches: tuple[BatchRow, ...], most: int = MOST_BATCHES) -> list[str]:
    """Markup for one line per batch (at most `most`, in the snapshot's order: those not final
    first; then "+N more"): id's end, API, client, status, done/total with a bar, failed (when
    some did), ETA (none once final). [] with no batches."""
    if not batches:
        return []
    shown = batches[:most]
    ids = [b.id[-BATCH_ID_CHARS:] for b in shown]
    api_w = max(len(b.api) for b in shown)
    client_w = max(len(b.client) for b in shown)
    status_w = max(len(b.status) for b in shown)
    counts = [f"{numbers.count(b.done)}/{numbers.count(b.total)}" for b in shown]
    count_w = max(len(c) for c in counts)
    fails = [f"failed {numbers.count(b.failed)}" if b.failed > 0 else "" for b in shown]
    fail_w = max(len(f) for f in fails)
    lines = []
    for b, short, lines_done, failed in zip(shown, ids, counts, fails, strict=True):
        style = _STATUS_STYLE.get(b.status, "")
        status = escape(b.status).ljust(status_w)
        cells = [
            "  " + escape(short).ljust(BATCH_ID_CHARS),
            escape(b.api).ljust(api_w),
            f"[b]{escape(b.client)}[/]" + " " * (client_w - len(b.client)),
            f"[{style}]{status}[/]" if style else status,
            f"{_lines_bar(b)} {lines_done.rjust(count_w)}",
        ]
        if fail_w:
            cells.append(
                f"[$text-error]{failed}[/]" + " " * (fail_w - len(failed)) if failed else " " * fail_w
            )
        eta = eta_text(b)
        if eta:
            cells.append(f"[$text-muted]{eta}[/]" if b.eta_s is None else eta)
        lines.append(_GAP.join(cells).rstrip())
    if len(batches) > most:
        lines.append(f"  [$text-muted]+{len(batches) - most} more (the report lists them)[/]")
    return lines


class ClientsPanel(SnapshotPanel, Static):
    """The gateway's clients in one line, and a table of its named clients (see the module doc)."""

    BORDER_TITLE = "Gateway clients"

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or snap.clients is None:
            return
        c = snap.clients
        compact = self.app.has_class("-compact")
        table = [] if compact else client_rows(c)
        lines = [clients_line(c), *table]
        if c.batches:
            lines.append(batches_summary(c.batches))
            lines += [] if compact else batch_rows(c.batches)
        # Its height follows its lines (the stylesheet's is one line): relayout only when their
        # number changes.
        height = len(lines) + 2  # the border
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height
        self.show_text("\n".join(lines))
        subtitle = f"{c.answered} answered"
        if c.rows:
            subtitle = f"{len(c.rows)} clients · shares over the last 60 s · {subtitle}"
        self.show_subtitle(subtitle)
