"""The cluster (`--store redis://...`): every member and the shared work queues, as members publish them.

The limiter panel shows one line of it (`cluster_line`); `m` opens the
members screen (`screens/cluster.py`). Members publish their keys masked and
their ids carry no secret, so nothing here can show a key.
"""

from __future__ import annotations

from ratedeck.engine.snapshot import ClusterView

from . import numbers
from .gates import plural


def _parts(view: ClusterView) -> list[tuple[str, str]]:
    """(plain text, markup) pieces after the member count, the most important first."""
    parts = []
    for value, word in ((view.waiting, "waiting"), (view.claimed, "claimed")):
        parts.append((f"{numbers.count(value)} {word}", f"[b]{numbers.count(value)}[/] {word}"))
    away = sum(1 for m in view.members if m.store != "ok")
    if away:
        text = f"{away} cut off"
        parts.append((text, f"[$text-error]{text}[/]"))
    if view.uncertain:
        text = f"{numbers.count(view.uncertain)} uncertain"
        parts.append((text, f"[$text-warning]{text}[/]"))
    return parts


def cluster_line(view: ClusterView, width: int) -> tuple[str, str]:
    """(label, value) markup for one line whose value fits `width` columns:
    ("Cluster", "3 members · 1 234 waiting · 12 claimed").

    When that does not fit (the limiter panel at 120 columns has 30), the
    member count moves into the label ("Cluster ×3") so the shared queues
    stay; pieces are then added while they fit, whole (never a number cut
    in half). Members cut off from the store are in the error colour.
    """
    n = len(view.members)
    away = any(m.store != "ok" for m in view.members)
    members = plural(n, "member")
    parts = _parts(view)
    full = [members, *(plain for plain, _ in parts)]
    if len(" · ".join(full)) <= width:
        head = f"[$text-error]{members}[/]" if away else f"[b]{members}[/]"
        return "Cluster", " [$text-muted]·[/] ".join([head, *(markup for _, markup in parts)])
    label = f"Cluster [$text-error]×{n}[/]" if away else f"Cluster [b]×{n}[/]"
    used = -3
    shown = []
    for plain, markup in parts:
        if used + 3 + len(plain) > width:
            break
        used += 3 + len(plain)
        shown.append(markup)
    return label, " [$text-muted]·[/] ".join(shown)
