"""ratedeck's engine as a bench strategy, through `Session` like the CLI runs it."""

from __future__ import annotations

import asyncio
from typing import Any

from ratedeck.engine.config import load_config
from ratedeck.engine.snapshot import Snapshot
from ratedeck.host.session import Session

from .spec import RunSpec


def engine_overrides(spec: RunSpec, **engine: Any) -> dict[str, Any]:
    """The seed preset pointed at the bench's simulator with the scenario's keys and rate.

    `workload.rate` is the offered rate, the same every other strategy gets.
    No graveyard file is written.
    """
    return {
        "target": {"url": spec.url, "nonce_param": "nonce" if spec.nonce else ""},
        "keys": {"secrets": list(spec.keys), "limits": [spec.policy_text]},
        "engine": {"graveyard_path": "", "in_flight_per_key": spec.in_flight, **engine},
        "workload": {"rate": float(spec.offered_tps)},
        "run": {"seed": spec.seed},
    }


async def run_engine(spec: RunSpec) -> dict:
    """Run the engine for `spec.duration_s`, stop it (bounded drain) and summarise."""
    cfg = load_config(preset="seed", overrides=engine_overrides(spec))
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
    }
