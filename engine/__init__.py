"""ratedeck's engine: rate-limited sending as a library.

    from ratedeck.engine import RateDeck
    from ratedeck.config import load_config  # the settings: ratedeck.config

Everything a program needs is exported here; the submodules are the
engine's own parts and may change.

The names load on first use (PEP 562), so importing one part, such as
`ratedeck.engine.limits.limiter` for the bench's peers, does not load the whole
engine and its HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.http.transport import HttpTransport, Response, Transport, TransportBase
    from ratedeck.engine.snapshot import Snapshot

    from .commands import (
        Command,
        PauseAll,
        PauseKey,
        ResumeAll,
        ResumeKey,
        SetArrivalRate,
        SetBackpressure,
        SetHeadroom,
        SetThrottle,
    )
    from .engine import Engine, UnknownKey
    from .library import CallError, CallExpired, CallFailed, CallShed, RateDeck, RateLimited
    from .settings import ConfigError, EngineSettings, KeySpec

#: Each exported name and the module that defines it.
_HOMES = {
    "Command": "commands",
    "PauseAll": "commands",
    "PauseKey": "commands",
    "ResumeAll": "commands",
    "ResumeKey": "commands",
    "SetArrivalRate": "commands",
    "SetBackpressure": "commands",
    "SetHeadroom": "commands",
    "SetThrottle": "commands",
    "Engine": "engine",
    "UnknownKey": "engine",
    "CallError": "library",
    "CallExpired": "library",
    "CallFailed": "library",
    "CallShed": "library",
    "RateDeck": "library",
    "RateLimited": "library",
    "Outcome": "http.outcome",
    "ConfigError": "settings",
    "EngineSettings": "settings",
    "KeySpec": "settings",
    "Snapshot": "snapshot",
    "HttpTransport": "http.transport",
    "Response": "http.transport",
    "Transport": "http.transport",
    "TransportBase": "http.transport",
}

__all__ = [
    "CallError",
    "CallExpired",
    "CallFailed",
    "CallShed",
    "Command",
    "ConfigError",
    "Engine",
    "EngineSettings",
    "HttpTransport",
    "KeySpec",
    "Outcome",
    "PauseAll",
    "PauseKey",
    "RateDeck",
    "RateLimited",
    "Response",
    "ResumeAll",
    "ResumeKey",
    "SetArrivalRate",
    "SetBackpressure",
    "SetHeadroom",
    "SetThrottle",
    "Snapshot",
    "Transport",
    "TransportBase",
    "UnknownKey",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ratedeck.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
