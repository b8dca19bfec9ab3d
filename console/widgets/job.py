"""The job bar: a job of known size as it goes, done of total with the time left (`Progress`)."""

from __future__ import annotations

from ratedeck.engine.snapshot import Progress, Snapshot

from . import numbers
from .gauge import Gauge
from .panel import SnapshotPanel


def job_text(p: Progress) -> str:
    """ "1 234 of 3 000 (41%) · ETA 2m10s · least 2m02s"; a job done says "done"."""
    text = f"{numbers.count(p.done)} of {numbers.count(p.total)} ({int(100 * p.fraction)}%)"
    if p.remaining == 0:
        return f"{text} · done"
    eta = "—" if p.eta_s is None else numbers.duration(p.eta_s)
    text += f" · ETA {eta}"
    if p.least_s is not None:
        text += f" · least {numbers.duration(p.least_s)}"
    return text


class JobBar(SnapshotPanel, Gauge):
    """One line under the header, shown only for a job of known size (App.-job): a gauge of
    the jobs that ended against the job's size, the ETA and the least time the limits allow."""

    DEFAULT_CSS = """
    JobBar {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("Job", id=id, classes=classes)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is None or snap.progress is None:
            return
        p = snap.progress
        self.show(
            p.done,
            max(p.total, 1),
            job_text(p),
            "ok" if p.eta_s is not None or not p.remaining else "warning",
        )
