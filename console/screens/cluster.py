"""The cluster (`--store redis://...`): every member as it last published itself, and the shared queues.

`m` opens it on a run with a shared store; the table is updated in place at
each snapshot (members read from the store at most once a second); Esc or q
goes back. Member ids are host:pid:random and carry no secret.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ratedeck.engine.snapshot import ClusterView, MemberRow, SharedKeyRow, Snapshot

from ..widgets import numbers
from ..widgets.gates import plural

COLUMNS = (  # 94 columns with their padding: the whole table fits 120
    ("member", "Member", 22),
    ("phase", "Phase", 8),
    ("tps", "Now/s", 6),
    ("sent", "Sent", 7),
    ("ok", "OK", 7),
    ("429", "429s", 5),
    ("queue", "Queue+DLQ", 9),
    ("flight", "Flight", 6),
    ("leases", "Leases used", 13),
    ("store", "Store", 11),
)


def queues_text(view: ClusterView) -> str:
    """Markup for the shared work queues and how many members there are."""
    uncertain = (
        f"[$text-warning]{numbers.count(view.uncertain)}[/]"
        if view.uncertain
        else numbers.count(view.uncertain)
    )
    return (
        f"[b]{plural(len(view.members), 'member')}[/] [$text-muted]· shared queues[/]"
        f" [b]{numbers.count(view.waiting)}[/] waiting [$text-muted]·[/] [b]{numbers.count(view.claimed)}[/] claimed"
        f" [$text-muted]·[/] {uncertain} uncertain [$text-muted]·[/] {numbers.count(view.graveyard)} graveyard"
        f" [$text-muted]· read at {numbers.duration(view.read_at_s)}[/]"
    ) + "".join(f"\n{shared_key_text(row)}" for row in view.keys)


def shared_key_text(row: SharedKeyRow) -> str:
    """Markup for what the members learned of one shared key (shown only when there is some)."""
    parts = [f"[$text-muted]key {row.budget[:8]}[/]"]
    if row.estimate:
        parts.append(
            f"estimate [b]{row.estimate}[/] ({row.reason or 'learned'}, {row.member}, {row.age_s:g}s ago)"
        )
    if row.remaining is not None:
        parts.append(
            f"server remaining {numbers.count(row.remaining)}"
            + (f"/{numbers.count(row.limit)}" if row.limit else "")
        )
    if row.headroom_ms is not None:
        parts.append(f"headroom {row.headroom_ms:g} ms")
    return " [$text-muted]·[/] ".join(parts)


def member_cells(row: MemberRow) -> list[object]:
    store = Text(row.store, style="bold red" if row.store != "ok" else "")
    return [
        Text(row.member, no_wrap=True, overflow="ellipsis"),
        Text(row.phase),
        Text(numbers.rate(row.current_tps), justify="right"),
        Text(numbers.compact_count(row.sent), justify="right"),
        Text(numbers.compact_count(row.succeeded), justify="right"),
        Text(numbers.compact_count(row.rejected_429), justify="right"),
        Text(f"{numbers.count(row.main_depth)}+{numbers.count(row.dlq_depth)}", justify="right"),
        Text(numbers.count(row.in_flight), justify="right"),
        Text(
            f"{numbers.compact_count(row.leases_used)}/{numbers.compact_count(row.leases_granted)}",
            justify="right",
        ),
        store,
    ]


class ClusterScreen(Screen[None]):
    """The shared queues above a table of members, one row each."""

    BINDINGS = [Binding("escape,q", "close", "Back", id="close_cluster")]

    snapshot: reactive[Snapshot | None] = reactive(None, init=False, repaint=False)

    def __init__(self, snapshot: Snapshot | None) -> None:
        super().__init__()
        self._initial = snapshot
        self._shown: dict[str, MemberRow] = {}
        self._order: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(id="cluster-head")
        yield DataTable(id="cluster-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.border_title = "Cluster · members as they last published themselves"
        for key, heading, width in COLUMNS:
            table.add_column(heading, key=key, width=width)
        table.focus()
        self.snapshot = self._initial

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or not self.query("#cluster-head"):
            return  # none yet, or it came before the screen composed (on_mount shows it)
        head = self.query_one("#cluster-head", Static)
        view = snap.cluster
        table = self.query_one(DataTable)
        if view is None:
            head.update("[$text-muted]no cluster: this run has no shared store (--store redis://...)[/]")
            table.clear()
            self._order, self._shown = [], {}
            return
        head.update(queues_text(view), layout=False)
        order = [row.member for row in view.members]
        if order != self._order:
            table.clear()
            for row in view.members:
                table.add_row(*member_cells(row), key=row.member)
            self._order = order
        else:
            for row in view.members:
                if self._shown.get(row.member) != row:
                    for column, value in zip(COLUMNS, member_cells(row), strict=True):
                        table.update_cell(row.member, column[0], value)
        self._shown = {row.member: row for row in view.members}

    def action_close(self) -> None:
        self.dismiss(None)
