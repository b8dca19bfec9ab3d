"""ratedeck's engine: rate-limited sending as a library.

    from ratedeck.engine import RateDeck
    from ratedeck.config import load_config  # the settings: ratedeck.config

Everything a program needs is exported here; the submodules are the
engine's own parts and may change.
"""

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
from .outcome import Outcome
from .settings import ConfigError, EngineSettings, KeySpec
from .snapshot import Snapshot
from .transport import HttpTransport, Response, Transport, TransportBase

__all__ = [
    "CallError",
    "CallExpired",
    "CallFailed",
    "CallShed",
    "Command",
    "ConfigError",
    "Engine",
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
    "EngineSettings",
    "SetArrivalRate",
    "SetBackpressure",
    "SetHeadroom",
    "SetThrottle",
    "Snapshot",
    "Transport",
    "TransportBase",
    "UnknownKey",
]
