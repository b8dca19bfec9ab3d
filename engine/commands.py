"""Small command objects that steer a running engine.

The console, the headless runner and tests all hand these to
`Engine.apply` (or a host's `send`); the engine applies them between its own
steps. Keys are named by their id ("k1", "k2", ...), never by secret.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PauseKey:
    key: str


@dataclass(frozen=True, slots=True)
class ResumeKey:
    key: str


@dataclass(frozen=True, slots=True)
class PauseAll:
    pass


@dataclass(frozen=True, slots=True)
class ResumeAll:
    pass


@dataclass(frozen=True, slots=True)
class SetHeadroom:
    """A fixed headroom in milliseconds, or `None` for adaptive."""

    ms: float | None


@dataclass(frozen=True, slots=True)
class SetBackpressure:
    on: bool


@dataclass(frozen=True, slots=True)
class SetArrivalRate:
    """Requests per second the generator produces (>= 0)."""

    rate: float


@dataclass(frozen=True, slots=True)
class SetThrottle:
    """The entry throttle of a message workload: "off", "auto" or messages per second (> 0)."""

    mode_or_rate: str | float


#: Everything the engine can be told.
Command = (
    PauseKey | ResumeKey | PauseAll | ResumeAll | SetHeadroom | SetBackpressure | SetArrivalRate | SetThrottle
)
