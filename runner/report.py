"""The run report: a JSON document with stable names other tools can read.

Its shape is `report.schema.json` beside this file (JSON Schema, shipped
with the package: `schema()`); every field is described in
docs/report.md. `SCHEMA_VERSION` changes when a field changes meaning or
goes away; new fields may appear without a change.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ratedeck.core.files import private_write_text
from ratedeck.engine.snapshot import (
    BatchRow,
    BudgetRow,
    ClientRow,
    ClusterView,
    EndpointRow,
    ErrorRow,
    KeyRow,
    LatencySummary,
    Makespan,
    MessageStats,
    Progress,
    Snapshot,
)
from ratedeck.store.work import StoreReport

from .money import spend_report

SCHEMA_VERSION = 1
SCHEMA_FILE = "report.schema.json"


def schema() -> dict:
    """The report's JSON Schema, as shipped with the package."""
    from importlib.resources import files

    return json.loads(files("ratedeck.runner").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def latency_report(lat: LatencySummary) -> dict:
    """A latency distribution in milliseconds, as the report and thresholds name it."""
    r = lambda x: round(float(x), 2)  # noqa: E731
    return {
        "mean": r(lat.mean),
        "p50": r(lat.p50),
        "p90": r(lat.p90),
        "p99": r(lat.p99),
        "p999": r(lat.p999),
        "max": r(lat.max),
        "count": lat.count,
    }


def _r(x: float, n: int = 2) -> float:
    return round(float(x), n)


def _maybe(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)


def build_report(snap: Snapshot, server_stats: dict | None = None, store: StoreReport | None = None) -> dict:
    """Report fields from a final snapshot. Keys appear masked only.

    With the embedded simulator, `server` holds its own count of the run
    (totals and the independent window audit): the server's view, not ours.
    With `--store`, `store` holds the store's count of every job (`store_report`);
    with a shared one, `cluster` the members and shared queues last read (`cluster_report`).
    """
    report: dict = {
        "schema_version": SCHEMA_VERSION,
        "duration_s": _r(snap.elapsed_s, 3),
        "capacity_tps": _r(snap.capacity_tps),
        "live_capacity_tps": _r(snap.live_capacity_tps),
        "throughput_tps": _r(snap.throughput_tps),
        "pct_capacity": _r(snap.pct_capacity),
        "requests": requests_report(snap),
        "balance_ok": snap.balance() == 0,
        "failures": dict(snap.failures),
        "errors": [error_report(e) for e in snap.errors],
        "latency_ms": latency_report(snap.latency),
        "latency_total_ms": latency_report(snap.latency_total),
        "queue_wait_ms": latency_report(snap.queue_wait),
        **headroom_report(snap),
        "queues": {
            "main_max": snap.main_peak,
            "main_avg": _r(snap.main_avg),
            "dlq_max": snap.dlq_peak,
            "dlq_avg": _r(snap.dlq_avg),
            "graveyard": snap.graveyard,
        },
        "keys": [key_report(k, snap.elapsed_s) for k in snap.keys],
        "budgets": [budget_report(b) for b in snap.budgets],
        "series": {
            "tps": list(snap.tps_series),
            "p50_ms": [_r(x) for x in snap.p50_series],
            "p99_ms": [_r(x) for x in snap.p99_series],
        },
        "gates": [
            {"name": g.name, "closures": g.closures, "escalations": g.escalations}
            for g in snap.gates
            if g.closures
        ],
        "keys_refused": [refused_report(k) for k in snap.keys if k.state == "blocked"],
        "client": client_report(snap),
        "loop": loop_report(snap),
    }
    if snap.messages is not None:
        report["messages"] = messages_report(snap.messages)
    if server_stats:
        report["server"] = {"audit_ok": server_stats["audit_ok"], "totals": server_stats["totals"]}
    if store is not None:
        report["store"] = store_report(store, snap)
    if snap.cluster is not None:
        report["cluster"] = cluster_report(snap.cluster)
    if snap.progress is not None:
        report["progress"] = progress_report(snap.progress)
    if snap.makespan is not None:
        report["makespan"] = makespan_report(snap.makespan)
    if snap.spend is not None:
        report["spend"] = spend_report(snap.spend)
    if snap.endpoints:
        report["endpoints"] = [endpoint_report(e) for e in snap.endpoints]
    if snap.clients is not None and snap.clients.rows:
        report["clients"] = [gateway_client_report(r, snap.clients.unit) for r in snap.clients.rows]
    if snap.clients is not None and snap.clients.batches:
        report["batches"] = [batch_report(b) for b in snap.clients.batches]
    return report


def batch_report(b: BatchRow) -> dict:
    """One batch of the gateway's Batch APIs: its id, API, client and status (OpenAI's names),
    its lines in all, ended (in any way), failed and left, and the seconds its lines left should
    take at the rate they have been ending (None: no rate yet, or final)."""
    return {
        "id": b.id,
        "api": b.api,
        "client": b.client,
        "status": b.status,
        "total": b.total,
        "done": b.done,
        "failed": b.failed,
        "left": b.left,
        "eta_s": _maybe(b.eta_s),
    }


def gateway_client_report(r: ClientRow, unit: str) -> dict:
    """One gateway client (`[[gateway.clients]]`): its priority and weight, its requests waiting,
    answered, sent and refused by its quota, its queue waits, its share of the binding `unit` over
    the last 60 s and what it was served of it since the start, and what is left of each quota."""
    return {
        "name": r.name,
        "priority": r.priority,
        "weight": r.weight,
        "waiting": r.waiting,
        "answered": r.answered,
        "sent": r.sent,
        "refused": r.refused,
        "queue_wait_ms": {"p50": _r(r.wait_p50_ms), "p99": _r(r.wait_p99_ms)},
        "share": _r(r.share, 4),
        "served": _r(r.served, 3),
        "unit": unit,
        "quotas": [{"name": q.name, "limit": q.limit, "left": _r(q.left, 4)} for q in r.quotas],
    }


def endpoint_report(e: EndpointRow) -> dict:
    """One endpoint of a pool: what it serves, each model's limits per minute, its health."""
    return {
        "name": e.name,
        "preset": e.preset,
        "url": e.url,
        "serves": list(e.serves),
        "models": [
            {
                "model": m.model,
                "limits": [{"unit": unit, "per_min": per_min} for unit, per_min in m.limits],
                "followed": m.followed,
            }
            for m in e.models
        ],
        "state": e.state,
        "reason": e.reason,
        "downs": e.downs,
        "keys": e.keys,
        "sent": e.sent,
        "succeeded": e.succeeded,
        "rejected_429": e.rejected_429,
    }


def requests_report(snap: Snapshot) -> dict:
    """Where every request went: the counters the accounting balances."""
    return {
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
        "uncertain": snap.uncertain,
    }


def error_report(e: ErrorRow) -> dict:
    """One kind of failed attempt, with the last key and text that had it (masked by the engine)."""
    return {
        "status": e.status,
        "kind": str(e.kind),
        "cause": e.cause,
        "count": e.count,
        "last_key": e.last_key,
        "last_text": e.last_text,
    }


def headroom_report(snap: Snapshot) -> dict:
    """`headroom_ms` (where it ended and its range) and `headroom` (what it was learned from)."""
    return {
        "headroom_ms": {
            "final": _r(snap.headroom_ms, 1),
            "min": _r(snap.headroom_min_ms, 1),
            "max": _r(snap.headroom_max_ms, 1),
            "adaptive": snap.headroom_adaptive,
        },
        "headroom": {
            "source": snap.headroom_source,
            "rtt_spread_ms": _maybe(snap.rtt_spread_ms),
            "network_spread_ms": _maybe(snap.network_spread_ms),
            "server_time_ms": _maybe(snap.server_time_ms),
            "rejection_budget": snap.rejection_budget,
            "rejections_spent": snap.rejections_spent,
            "probe_sent": snap.probe_sent,
        },
    }


def key_report(k: KeyRow, elapsed_s: float) -> dict:
    """One key's line: its counts, state, the server's counts and its limit estimate."""
    return {
        "key": f"{k.label} {k.masked}",
        "label": k.label,
        "sent": k.sent,
        "succeeded": k.succeeded,
        "rejected_429": k.rejected_429,
        "errors": k.errors,
        "last_status": k.last_status,
        "paused": k.state == "paused",
        "state": k.state,
        "server_remaining": k.server_remaining,
        "server_limit": k.server_limit,
        "told_limit": k.told_limit,
        "learned_limit": k.learned_limit,
        "in_flight_limit": k.in_flight_limit,
        "in_flight_auto": k.in_flight_auto,
        **estimate_fields(k, elapsed_s),
        **({"endpoint": k.endpoint} if k.endpoint else {}),
    }


def budget_report(b: BudgetRow) -> dict:
    """One budget of one owner (a key or the host): used, its limit, reserved and settled."""
    return {
        "name": b.name,
        "owner": b.owner,
        "used": b.used,
        "limit": b.limit,
        "unit": b.unit,
        "per_min": b.per_min,
        "reserved": b.reserved,
        "settled": b.settled,
    }


def refused_report(k: KeyRow) -> dict:
    """A key the server refused for good, with its status and message (masked by the engine)."""
    return {
        "key": f"{k.label} {k.masked}",
        "label": k.label,
        "fingerprint": k.fingerprint or None,
        "status": k.refused_status,
        "message": k.refused_message,
    }


def client_report(snap: Snapshot) -> dict:
    """The client's own cost: processes, CPU, how late the loop ran."""
    cpu_us = snap.cpu_us_per_request
    return {
        "procs": snap.procs,
        "cpu_s": _r(snap.cpu_s, 3),
        "cpu_us_per_request": _r(cpu_us, 1) if cpu_us is not None else None,
        "cpu_cores": _r(snap.cpu_cores, 3) if snap.cpu_cores is not None else None,
        "loop_lag_ms": _r(snap.loop_lag_ms, 1),
        "loop": snap.loop or None,
        "cpu_with": snap.cpu_with or None,
    }


def loop_report(snap: Snapshot) -> dict:
    """How late the engine's timers fired over the whole run, the CPU it cost, and whether the
    client, not the server, was the limit (engine/observe/loop_watch.py says when)."""
    lag, cpu_us = snap.lag, snap.cpu_us_per_request
    share = lag.run_core_share
    return {
        "lag_p50_ms": _r(lag.run.p50, 1),
        "lag_p99_ms": _r(lag.run.p99, 1),
        "lag_max_ms": _r(lag.run.max, 1),
        "ticks": lag.run.count,
        "cpu_s": _r(snap.cpu_s, 3),
        "cpu_us_per_request": _r(cpu_us, 1) if cpu_us is not None else None,
        "core_share": _r(share, 3) if share is not None else None,
        "client_is_the_limit": bool(lag.run_limit),
        "why": lag.run_limit or None,
    }


def makespan_report(m: Makespan) -> dict:
    """A job run's makespan: `elapsed_s` to do `jobs`, `least_s` the limits allowed, their ratio."""
    ratio = m.ratio
    return {
        "jobs": m.jobs,
        "elapsed_s": round(m.elapsed_s, 3),
        "least_s": round(m.least_s, 3),
        "ratio": round(ratio, 4) if ratio is not None else None,
    }


def progress_report(p: Progress) -> dict:
    """A job of known size: `done` of `total`, and the time left as the run last saw it."""
    r = lambda x: None if x is None else round(x, 3)  # noqa: E731
    return {
        "total": p.total,
        "done": p.done,
        "fraction": round(p.fraction, 4),
        "eta_s": r(p.eta_s),
        "least_s": r(p.least_s),
    }


def cluster_report(view: ClusterView) -> dict:
    """The cluster as the run last read it (a shared store): every member's row and the shared queues."""
    return {
        "members": [
            {
                "member": m.member,
                "phase": m.phase,
                "current_tps": round(float(m.current_tps), 2),
                "sent": m.sent,
                "succeeded": m.succeeded,
                "rejected_429": m.rejected_429,
                "main_depth": m.main_depth,
                "dlq_depth": m.dlq_depth,
                "in_flight": m.in_flight,
                "leases_used": m.leases_used,
                "leases_granted": m.leases_granted,
                "store": m.store,
            }
            for m in view.members
        ],
        "waiting": view.waiting,
        "claimed": view.claimed,
        "uncertain": view.uncertain,
        "graveyard": view.graveyard,
        "read_at_s": round(float(view.read_at_s), 1),
    }


def ended(snap: Snapshot) -> int:
    """Requests of this run that reached their final place."""
    return snap.succeeded + snap.expired + snap.graveyard + snap.shed + snap.uncertain


def store_report(s: StoreReport, snap: Snapshot) -> dict:
    """Every job in the store by state, and whether every ending of this run reached it.

    `jobs = pending + in_flight + uncertain + succeeded + expired + graveyard + shed`;
    `balance_ok` says the store journaled exactly the endings this run counted.
    """
    c = s.counts
    return {
        "url": s.url,
        "jobs": c.total,
        "pending": c.pending,
        "in_flight": c.claimed,
        # a killed run's jobs that may have been sent, and writes of a live run that ended uncertain
        "uncertain": c.uncertain + c.done.get("uncertain", 0),
        **{str(e): c.done.get(str(e), 0) for e in ("succeeded", "expired", "graveyard", "shed")},
        "resumed": s.recovered,
        "resumed_retried": s.retried_uncertain and s.recovered > 0,
        "journaled": s.journaled,
        "balance_ok": s.problem is None and s.unjournaled == 0 and s.journaled == ended(snap),
        # what a restart of the store keeps ("none": a restart loses the work), and jobs a loss took
        "persistence": s.persistence or "file",
        "lost_claims": s.lost_claims,
        "left_claimed": s.left_claimed,
        "at_work": list(s.at_work),
    }


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


def write_report(
    snap: Snapshot, path: str, server_stats: dict | None = None, report: dict | None = None
) -> str | None:
    """Write the report (`report`, or one built from `snap`) to `path`, "-" for stdout;
    returns a problem text instead of raising."""
    data = report if report is not None else build_report(snap, server_stats)
    text = json.dumps(data, indent=2) + "\n"
    try:
        if path == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            private_write_text(path, text)  # 0600, as every file ratedeck creates
    except (OSError, ValueError) as exc:
        where = "to stdout" if path == "-" else path
        return f"cannot write report {where}: {getattr(exc, 'strerror', None) or exc}"
    return None


def shared_text(k: KeyRow) -> str | None:
    """ "k2: someone else used 38% of this window", when the server's counts showed it."""
    if k.shared_share is None:
        return None
    return f"{k.label}: someone else used {k.shared_share:.0%} of this window"


def estimate_fields(k: KeyRow, elapsed_s: float) -> dict[str, Any]:
    """A key's limit estimate as the report gives it (engine/limits/estimate.py), at the end of its row."""
    ago = k.estimate_moved_ago_s
    return {
        "limit_estimate": k.limit_estimate,
        "estimate_reason": k.estimate_reason or None,
        "estimate_moved_at_s": round(max(0.0, elapsed_s - ago), 1) if ago is not None else None,
        "estimate_climb": k.estimate_climb or None,
        "shared_share": k.shared_share,
        "shared": shared_text(k),
        "binding": k.binding or None,
        "limits_followed": k.followed or None,
    }
