"""ratedeck's engine: rate-limited sending as a library.

    from ratedeck.engine import RateDeck, load_config

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
from .config import ConfigError, KeySpec, RunConfig, load_config
from .engine import Engine, UnknownKey
from .library import CallError, CallExpired, CallFailed, CallShed, RateDeck, RateLimited
from .outcome import Outcome
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
    "RunConfig",
    "SetArrivalRate",
    "SetBackpressure",
    "SetHeadroom",
    "SetThrottle",
    "Snapshot",
    "Transport",
    "TransportBase",
    "UnknownKey",
    "load_config",
]
