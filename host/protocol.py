"""What a front end (console, headless runner, tests) needs from a running engine."""

from __future__ import annotations

from typing import Protocol

from ratedeck.engine.commands import Command
from ratedeck.engine.snapshot import Snapshot


class EngineHost(Protocol):
    """A running engine seen from outside: pull snapshots, push commands.

    `snapshot()` and `send()` are cheap and safe to call from the front end's
    thread; `stop()` stops generating, drains in-flight work (bounded), writes
    the graveyard and returns the final snapshot.
    """

    def snapshot(self) -> Snapshot: ...

    def send(self, command: Command) -> None: ...

    def effective_config(self) -> dict:
        """The run's settings as they are now, as a TOML-ready dict (no secrets)."""
        ...

    async def stop(self) -> Snapshot: ...
