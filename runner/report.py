"""The run report: a JSON document with stable names other tools can read."""

from __future__ import annotations

import json
from pathlib import Path

from ratedeck.engine.snapshot import MessageStats, Snapshot


def build_report(snap: Snapshot, server_stats: dict | None = None) -> dict:
    """Report fields from a final snapshot. Keys appear masked only.

    With the embedded simulator, `server` holds its own count of the run
    (totals and the independent window audit): the server's view, not ours.
    """
    r = lambda x, n=2: round(float(x), n)  # noqa: E731
    lat = snap.latency
    report: dict = {
        "duration_s": r(snap.elapsed_s, 3),
        "capacity_tps": r(snap.capacity_tps),
        "throughput_tps": r(snap.throughput_tps),
        "pct_capacity": r(snap.pct_capacity),
        "requests": {
            "generated": snap.generated,
            "sent": snap.sent,
            "succeeded": snap.succeeded,
            "rejected_429": snap.rejected_429,
            "rejected_other": snap.rejected_other,
            "failed": snap.failed,
            "expired": snap.expired,
            "retried": snap.retried,
            "graveyard": snap.graveyard,
            "shed": snap.shed,
            "queued_at_end": snap.main_depth + snap.dlq_depth,
            "in_flight_at_end": snap.in_flight,
        },
        "balance_ok": snap.balance() == 0,
        "failures": dict(snap.failures),
        "latency_ms": {
            "mean": r(lat.mean),
            "p50": r(lat.p50),
            "p90": r(lat.p90),
            "p99": r(lat.p99),
            "max": r(lat.max),
        },
        "headroom_ms": {
            "final": r(snap.headroom_ms, 1),
            "min": r(snap.headroom_min_ms, 1),
            "max": r(snap.headroom_max_ms, 1),
            "adaptive": snap.headroom_adaptive,
        },
        "queues": {
            "main_max": snap.main_peak,
            "main_avg": r(snap.main_avg),
            "dlq_max": snap.dlq_peak,
            "dlq_avg": r(snap.dlq_avg),
            "graveyard": snap.graveyard,
        },
        "keys": [
            {
                "key": f"{k.label} {k.masked}",
                "sent": k.sent,
                "succeeded": k.succeeded,
                "rejected_429": k.rejected_429,
                "paused": k.state == "paused",
                "state": k.state,
            }
            for k in snap.keys
        ],
        "series": {
            "tps": list(snap.tps_series),
            "p50_ms": [r(x) for x in snap.p50_series],
            "p99_ms": [r(x) for x in snap.p99_series],
        },
        "gates": [
            {"name": g.name, "closures": g.closures, "escalations": g.escalations}
            for g in snap.gates
            if g.closures
        ],
    }
    if snap.messages is not None:
        report["messages"] = messages_report(snap.messages)
    if server_stats:
        report["server"] = {"audit_ok": server_stats["audit_ok"], "totals": server_stats["totals"]}
    return report


def messages_report(m: MessageStats) -> dict:
    """A message run's own accounting: messages end in one place, like requests."""
    return {
        "calls_per_message": m.calls_per_message,
        "pattern": str(m.pattern),
        "generated": m.generated,
        "completed": m.completed,
        "failed": m.failed,
        "shed": m.shed,
        "queued_at_end": m.queued,
        "in_progress_at_end": m.in_progress,
        "calls_wasted": m.calls_wasted,
        "calls_cancelled": m.calls_cancelled,
        "goodput_tps": round(m.goodput_tps, 2),
        "throttle": m.throttle_mode,
        "excess": str(m.excess),
        "balance_ok": m.balance() == 0,
    }


def write_report(snap: Snapshot, path: str, server_stats: dict | None = None) -> str | None:
    """Write the report; returns a problem text instead of raising."""
    try:
        Path(path).write_text(json.dumps(build_report(snap, server_stats), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        return f"cannot write report {path}: {exc.strerror or exc}"
    return None
