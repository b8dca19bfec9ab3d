"""ratedeck's engine as a bench strategy, through `Session` like the CLI runs it."""

from __future__ import annotations

import asyncio
from typing import Any

from ratedeck.config import load_config
from ratedeck.engine.snapshot import Snapshot
from ratedeck.host.session import Session
from ratedeck.host.shards import ShardedHost

from .spec import RunSpec


def engine_overrides(spec: RunSpec, **engine: Any) -> dict[str, Any]:
    """The study preset pointed at the bench's simulator with the scenario's keys and rate.

    `workload.rate` is the offered rate, the same every other strategy gets.
    No graveyard file is written. ratedeck sizes its in flight as a user's run does
    ("auto": rate x round trip), not the peers' `spec.in_flight`, unless `engine` pins it.
    """
    return {
        "target": {"url": spec.url, "nonce_param": "nonce" if spec.nonce else ""},
        "keys": {"secrets": list(spec.keys), "limits": [spec.policy_text]},
        "engine": {"graveyard_path": "", **engine},
        "workload": {"rate": float(spec.offered_tps)},
        "run": {"seed": spec.seed},
    }


def variant_overrides(spec: RunSpec) -> dict[str, Any]:
    """What a ratedeck strategy adds to the study preset: "ratedeck+probe" probes the
    simulator's `/health`, "ratedeck+budget" may spend 10 rejections probing (limit
    learning stays on: a 429 while the headroom narrows teaches no limit); a live row or a
    limit told wrong (`extra["slow_start"]`) runs with the engine's default slow start, as a
    run on a named target does (the study preset turns it off, its limit being the
    simulator's own)."""
    overrides = engine_overrides(spec)
    if spec.extra.get("slow_start"):
        overrides["engine"]["slow_start"] = True
    if spec.strategy == "ratedeck+probe":
        base = spec.url.rsplit("/api/request", 1)[0]
        overrides["target"]["probe_url"] = f"{base}/health"
    elif spec.strategy == "ratedeck+budget":
        overrides["engine"]["rejection_budget"] = BUDGET
    elif spec.strategy not in ("ratedeck", *PROCS):
        raise ValueError(f"not a ratedeck strategy: {spec.strategy!r}")
    return overrides


#: The rejection budget of the "ratedeck+budget" strategy.
BUDGET = 10
#: ratedeck strategies run as several engine processes (`--procs N`), by name.
PROCS = {"ratedeck+procs2": 2}


async def run_engine(spec: RunSpec) -> dict:
    """Run the engine for `spec.duration_s`, stop it (bounded drain) and summarise."""
    cfg = load_config(preset="study", overrides=variant_overrides(spec))
    procs = PROCS.get(spec.strategy, 1)
    if procs > 1:
        # As `ratedeck --procs N` runs it; the engine processes' CPU is added to this one's.
        host = ShardedHost(cfg, procs)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, host.start)
        await asyncio.sleep(spec.duration_s)
        snap = await loop.run_in_executor(None, host.stop_blocking)
        return snapshot_summary(snap) | {"engine_procs_cpu_s": snap.cpu_s, "procs": snap.procs}
    session = Session(cfg)
    await session.start()
    await asyncio.sleep(spec.duration_s)
    snap = await session.stop()
    return snapshot_summary(snap)


def snapshot_summary(snap: Snapshot) -> dict:
    """The engine's final snapshot in the bench's client-side terms."""
    return {
        "generated": snap.generated,
        "sent": snap.sent,
        "succeeded": snap.succeeded,
        "rejected_429": snap.rejected_429,
        "rejected_nonce": snap.rejected_other,
        "failed": snap.failed,
        "expired": snap.expired,
        "graveyard": snap.graveyard,
        "p50_ms": snap.latency.p50,
        "p99_ms": snap.latency.p99,
        "headroom_ms": round(snap.headroom_ms, 1),
        "headroom_source": snap.headroom_source,
        "rtt_spread_ms": _ms(snap.rtt_spread_ms),
        "network_spread_ms": _ms(snap.network_spread_ms),
        "server_time_ms": _ms(snap.server_time_ms),
        "rejection_budget": snap.rejection_budget,
        "rejections_spent": snap.rejections_spent,
        "probe_sent": snap.probe_sent,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
