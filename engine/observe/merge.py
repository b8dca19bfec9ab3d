"""One `Snapshot` from several: the engine run as several processes (`--procs N`).

Each process runs its own engine over its share of the keys (host/shards.py);
the console and the report read one snapshot made of theirs:

- counts (requests, attempts, queues, in flight, CPU seconds, probes) add up,
  so the accounting balances if every part balances;
- rates add up (throughput, capacity, arrival rate, per-second series
  element by element, aligned on their newest second);
- per-key rows, budget rows and errors are concatenated (a key lives in one
  process); gates are concatenated too, except that "host" gates (one per
  process) become one row: the longest closure;
- the elapsed time is the longest; the phase the least advanced one
  (still running while any part runs); the headroom, its range and its
  estimates are the worst case (the widest), `headroom_adaptive` only when
  every part is adaptive; the loop lag is the worst;
- the loop's lateness (`LoopLag`): the recent p50/p99 and the busiest process's
  CPU share are the worst part's; the run's distribution merges as latency
  does (below); a verdict is any part's that says the client is the limit
  (a saturated process holds back its share of the keys, however idle the others);
- the cluster view (a shared store) is any part's: all read the same store;
- events are interleaved by time (newest last), each marked with its
  process ("[p2]") when there are several;
- latency: counts add and means are weighted by count. When every part
  carries its whole histogram (`LatencySummary.hist`, which engines run as
  shards send), percentiles are computed from the summed histogram: exact,
  the same figure one process would have given. Otherwise each percentile
  is the largest of the parts' (an upper bound, never an underestimate of
  a tail), and the max is the largest max.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ratedeck.core.vocab import Phase
from ratedeck.engine.snapshot import Event, GateRow, LatencySummary, LoopLag, Snapshot

from .makespan import merge_makespans
from .metrics import quantiles_of
from .progress import merge_progress
from .spend import merge_spend

#: How far a phase has gone: the merged phase is the least advanced part's.
_PHASE_ORDER = (Phase.STARTING, Phase.RUNNING, Phase.DRAINING, Phase.STOPPED)

_SUMMED = (
    "capacity_tps",
    "live_capacity_tps",
    "throughput_tps",
    "current_tps",
    "generated",
    "succeeded",
    "expired",
    "graveyard",
    "shed",
    "uncertain",
    "main_depth",
    "dlq_depth",
    "in_flight",
    "sent",
    "rejected_429",
    "rejected_other",
    "failed",
    "retried",
    "main_max",
    "main_peak",
    "main_avg",
    "dlq_peak",
    "dlq_avg",
    "arrival_rate",
    "rejection_budget",
    "rejections_spent",
    "probe_sent",
    "cpu_s",
    "procs",
)
_WIDEST = ("headroom_ms", "headroom_min_ms", "headroom_max_ms", "elapsed_s", "loop_lag_ms")
_WIDEST_OPTIONAL = ("rtt_spread_ms", "network_spread_ms", "server_time_ms")


def merge_latency(parts: Sequence[LatencySummary]) -> LatencySummary:
    """Latency summaries of several processes as one (see the module doc for percentiles)."""
    parts = [p for p in parts if p.count]
    if not parts:
        return LatencySummary()
    if len(parts) == 1:
        return dataclasses.replace(parts[0], hist=())
    count = sum(p.count for p in parts)
    mean = sum(p.mean * p.count for p in parts) / count
    top = max(p.max for p in parts)
    buckets = _merge_buckets([p.buckets for p in parts])
    if all(p.hist for p in parts):
        size = 1 + max(i for p in parts for i, _ in p.hist)
        bins = [0] * size
        for p in parts:
            for i, n in p.hist:
                bins[i] += n
        p50, p90, p99, p999 = quantiles_of(bins, count, top, (0.5, 0.9, 0.99, 0.999))
    else:
        p50, p90, p99, p999 = (max(getattr(p, q) for p in parts) for q in ("p50", "p90", "p99", "p999"))
    return LatencySummary(
        mean=mean, p50=p50, p90=p90, p99=p99, max=top, p999=p999, count=count, buckets=buckets
    )


def merge_lag(parts: Sequence[LoopLag]) -> LoopLag:
    """The loop's lateness of several processes as one (see the module doc)."""
    if len(parts) == 1:
        return parts[0]

    def worst(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return LoopLag(
        p50_ms=max((p.p50_ms for p in parts), default=0.0),
        p99_ms=max((p.p99_ms for p in parts), default=0.0),
        run=merge_latency([p.run for p in parts]),
        core_share=worst([p.core_share for p in parts]),
        run_core_share=worst([p.run_core_share for p in parts]),
        limit=next((p.limit for p in parts if p.limit), ""),
        run_limit=next((p.run_limit for p in parts if p.run_limit), ""),
    )


def _merge_buckets(parts: Sequence[tuple[tuple[float, int], ...]]) -> tuple[tuple[float, int], ...]:
    used = [b for b in parts if b]
    if not used:
        return ()
    edges = [edge for edge, _ in used[0]]
    if any([edge for edge, _ in b] != edges for b in used):  # not the same edges: cannot add
        return ()
    return tuple((edge, sum(b[i][1] for b in used)) for i, edge in enumerate(edges))


def _merge_series(parts: Sequence[tuple[float, ...]], combine=sum) -> tuple[float, ...]:
    """Per-second series aligned on their newest second (each process rolls its own)."""
    longest = max((len(s) for s in parts), default=0)
    out = []
    for back in range(longest, 0, -1):
        values = [s[-back] for s in parts if len(s) >= back]
        out.append(float(combine(values)))
    return tuple(out)


def _host_gates(parts: Sequence[Snapshot]) -> tuple[GateRow, ...]:
    rows: list[GateRow] = []
    host: list[GateRow] = []
    for snap in parts:
        for g in snap.gates:
            (host if g.name == "host" else rows).append(g)
    if host:
        worst = max(host, key=lambda g: g.left_s)
        rows.insert(
            0,
            GateRow(
                "host",
                worst.left_s,
                worst.reason,
                sum(g.closures for g in host),
                sum(g.escalations for g in host),
            ),
        )
    return tuple(rows)


def _events(parts: Sequence[Snapshot], keep: int = 200) -> tuple[Event, ...]:
    if len(parts) == 1:
        return parts[0].events
    tagged = [
        (e.at_s, i, n, Event(e.at_s, e.kind, f"[p{i + 1}] {e.text}"))
        for i, snap in enumerate(parts)
        for n, e in enumerate(snap.events)
    ]
    tagged.sort(key=lambda t: (t[0], t[1], t[2]))
    return tuple(t[3] for t in tagged[-keep:])


def merge_snapshots(parts: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of a run made of several engine processes (see the module doc)."""
    if not parts:
        return Snapshot()
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    values: dict[str, Any] = {}
    for name in _SUMMED:
        values[name] = sum(getattr(s, name) for s in parts)
    for name in _WIDEST:
        values[name] = max(getattr(s, name) for s in parts)
    for name in _WIDEST_OPTIONAL:
        known = [getattr(s, name) for s in parts if getattr(s, name) is not None]
        values[name] = max(known) if known else None
    values["main_avg"] = sum(s.main_avg for s in parts)
    values["phase"] = min((s.phase for s in parts), key=lambda p: _PHASE_ORDER.index(Phase(p)))
    values["headroom_adaptive"] = all(s.headroom_adaptive for s in parts)
    values["backpressure"] = all(s.backpressure for s in parts)
    # The source every process names the same way; "fixed" only when all are.
    sources = {s.headroom_source for s in parts}
    values["headroom_source"] = first.headroom_source if len(sources) == 1 else " / ".join(sorted(sources))
    failures: dict[str, int] = {}
    for s in parts:
        for cause, n in s.failures:
            failures[cause] = failures.get(cause, 0) + n
    values["failures"] = tuple(sorted(failures.items()))
    values["errors"] = tuple(sorted((e for s in parts for e in s.errors), key=lambda e: -e.count))
    values["latency"] = merge_latency([s.latency for s in parts])
    values["latency_total"] = merge_latency([s.latency_total for s in parts])
    values["queue_wait"] = merge_latency([s.queue_wait for s in parts])
    values["lag"] = merge_lag([s.lag for s in parts])
    values["tps_series"] = _merge_series([s.tps_series for s in parts])
    values["p50_series"] = _merge_series([s.p50_series for s in parts], max)
    values["p99_series"] = _merge_series([s.p99_series for s in parts], max)
    values["keys"] = tuple(k for s in parts for k in s.keys)
    values["budgets"] = tuple(b for s in parts for b in s.budgets)
    values["gates"] = _host_gates(parts)
    values["events"] = _events(parts)
    values["messages"] = first.messages  # message runs are not sharded (host/shards.py refuses them)
    # every part reads the same shared store: any part's view of the cluster will do
    values["cluster"] = next((s.cluster for s in parts if s.cluster is not None), None)
    values["makespan"] = merge_makespans([s.makespan for s in parts])
    values["progress"] = merge_progress([s.progress for s in parts])
    values["spend"] = merge_spend([s.spend for s in parts])
    values["fed"] = any(s.fed for s in parts)
    return dataclasses.replace(first, **values)
