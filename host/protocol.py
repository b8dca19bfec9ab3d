"""What a front end (console, headless runner, tests) needs from a running engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ratedeck.engine.commands import Command
from ratedeck.engine.snapshot import Snapshot
from ratedeck.store.base import StoreReport


@dataclass(frozen=True)
class RunFacts:
    """What a run's summary needs besides the snapshot: plain data, safe to print.

    It crosses the console's process pipe, so it holds only numbers and
    already-masked texts. `answers` is None when the transport does not count
    answers (a transport of the caller's own).
    """

    answers: int | None = None
    statuses: tuple[tuple[int, int], ...] = ()  # status -> answers
    no_answer: tuple[tuple[str, int], ...] = ()  # cause -> attempts ("connection refused", 57)
    redirects: tuple[tuple[str, int], ...] = ()  # 3xx not followed, by status and place
    consecutive_no_answer: int = 0
    graveyard_path: str | None = None
    graveyard_written: int = 0
    graveyard_problem: str | None = None
    problems: tuple[str, ...] = ()
    results_path: str | None = None
    results_written: int = 0
    results_problem: str | None = None
    store: StoreReport | None = None  # --store: the store's counts at the end, what this run journaled
    retried: int = 0  # sends the HTTP client repeated once after a kept-alive connection closed under them


class EngineHost(Protocol):
    """A running engine seen from outside: pull snapshots, push commands, stop it.

    `snapshot()` and `send()` are cheap and safe to call from the front end's
    thread; `stop()` stops generating, drains in-flight work (bounded), writes
    the graveyard and returns the final snapshot. `stop_blocking()` does the
    same from a thread that is not the engine's loop; `abort()` stops at once
    (what is left is reported as queued or in flight). Every host has them:
    `session.Session` (this loop), `process_host.ProcessHost` (a child
    process), `shards.ShardedHost` (several).
    """

    #: The embedded simulator's own count, once the run stopped (None: a real target).
    server_stats: dict[str, Any] | None

    def snapshot(self) -> Snapshot: ...

    def send(self, command: Command) -> None: ...

    def effective_config(self) -> dict[str, Any]:
        """The run's settings as they are now, as a TOML-ready dict (no secrets)."""
        ...

    async def stop(self) -> Snapshot: ...

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        """Drain and wait for the final snapshot (at most `timeout_s`, then `abort`)."""
        ...

    def abort(self) -> Snapshot:
        """Stop at once; safe from any thread but the engine's own loop."""
        ...

    @property
    def facts(self) -> RunFacts:
        """The run's counts beyond the snapshot (answers, no-answer causes, graveyard), latest known."""
        ...

    @property
    def aborted(self) -> bool:
        """Stopped at once (`abort`), not drained."""
        ...


class SpawnedHost(EngineHost, Protocol):
    """A host whose engine runs in other processes, started from the caller's thread."""

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the engine (and the simulator, with no target) and wait until it runs;
        raises what its start raised."""
        ...
