"""Building engines against the in-memory simulator for tests."""

from __future__ import annotations

from ratedeck.config import load_config
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import ServerSettings, study_settings
from ratedeck.server.simulated import SimulatedTransport


def seed_engine(
    tmp_path=None, *, server: ServerSettings | None = None, transport_kw=None, engine_kw=None, **sections
):
    """An Engine on the study preset with overrides per section, and its transport.

    `engine_kw` goes to the Engine itself (e.g. `cooldown=`)."""
    overrides = {k: v for k, v in sections.items()}
    engine_over = overrides.setdefault("engine", {})
    engine_over.setdefault("graveyard_path", str(tmp_path / "graveyard.jsonl") if tmp_path else "")
    cfg = load_config(preset="study", overrides=overrides)
    transport = SimulatedTransport(server or study_settings(), **(transport_kw or {}))
    return Engine(cfg, transport, **(engine_kw or {})), transport


def audit_max(stats: dict) -> int:
    """The largest count the server saw in any window, over all keys and policies."""
    return max(p["max_in_window"] for k in stats["keys"] for p in k["max_in_window"])
