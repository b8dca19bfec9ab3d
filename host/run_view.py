"""What a store run and a results file read of a running engine (`ports.StoreRunHost`,
`ports.ResultsHost`), taken from its parts: the engine itself forwards none of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratedeck.core.vocab import EventKind, Pacing

if TYPE_CHECKING:
    from ratedeck.engine.engine import Engine
    from ratedeck.engine.ports import FinishWatcher
    from ratedeck.engine.queues import Graveyard
    from ratedeck.engine.request import Request


class RunView:
    """One engine's parts as the store's journal, a store run and a results file use them."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def watch(self, watcher: FinishWatcher) -> None:
        self._engine.watch(watcher)

    def event(self, kind: EventKind, text: str) -> None:
        self._engine.event(kind, text)

    @property
    def graveyard(self) -> Graveyard:
        return self._engine.parts.graveyard

    @property
    def pacing(self) -> Pacing:
        return self._engine.parts.limits.pacing

    def redact(self, text: str, limit: int | None = None) -> str:
        return self._engine.parts.redact(text, limit)

    def clock(self) -> float:
        """The run's clock now (the loop's, once the engine started)."""
        return self._engine.parts.run.clock()

    def wall_time(self, t: float) -> float:
        return self._engine.parts.run.wall_time(t)

    def problem(self, text: str) -> None:
        self._engine.parts.ends.problem(text)

    def queued(self) -> list[Request]:
        """Requests still queued: the main queue first, then the retry queue by due time."""
        return self._engine.parts.queues.all_queued()

    def in_flight_requests(self) -> list[Request]:
        return self._engine.parts.path.in_flight_requests()

    def recent_sends(self) -> dict[str, list[float]]:
        """Each key's sends in its longest window, as Unix times, by key fingerprint."""
        return self._engine.parts.keys.recent_sends()

    def seed_sends(self, sends: dict[str, list[float]]) -> int:
        """Start each key's limiter with another run's sends; before the engine starts."""
        return self._engine.parts.keys.seed_sends(sends)
