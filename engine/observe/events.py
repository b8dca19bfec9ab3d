"""The engine's event log: the last few hundred things worth telling an operator."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ratedeck.core.vocab import EventKind
from ratedeck.engine.snapshot import Event


class EventLog:
    """Events stamped with the seconds since the engine started (0 before it starts)."""

    __slots__ = ("rows", "clock", "started_at", "running")

    def __init__(self, maxlen: int = 200) -> None:
        self.rows: deque[Event] = deque(maxlen=maxlen)
        self.clock: Callable[[], float] = time.monotonic
        self.started_at = 0.0
        self.running = False

    def start(self, clock: Callable[[], float], started_at: float) -> None:
        self.clock, self.started_at, self.running = clock, started_at, True

    def event(self, kind: EventKind, text: str) -> None:
        at = (self.clock() - self.started_at) if self.running else 0.0
        self.rows.append(Event(round(at, 1), EventKind(kind), text))
