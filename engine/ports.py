"""The narrow interfaces between the engine and its parts.

A key worker and a work source each see the engine only through the
protocol here, never through `Engine` itself, so the request path reads in
one direction: source -> queues -> worker -> engine (send, settle).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ratedeck.core.vocab import EventKind

from .request import CallFn, Request

if TYPE_CHECKING:
    from .limiter import Stamp
    from .queues import WorkQueues
    from .snapshot import MessageStats
    from .worker import KeyWorker


class SourceSink(Protocol):
    """What a work source may do with the engine: make, submit and refuse requests."""

    loop: asyncio.AbstractEventLoop | None
    queues: WorkQueues
    backpressure: bool
    queue_max: int
    stopping: bool

    def clock(self) -> float: ...

    def new_request(
        self,
        params: dict | None = None,
        pool: str | None = None,
        ttl_s: float | None = None,
        call: CallFn | None = None,
        intended_at: float | None = None,
    ) -> Request: ...

    def submit(self, req: Request) -> None:
        """Accept a new request into the main queue."""

    def refuse(self, req: Request) -> None:
        """Count a new request that never entered the queue (no room): it ends as shed."""

    def source_done(self) -> None:
        """The source will make nothing more; the run may finish when the queues empty."""

    def live_capacity(self, now: float) -> float:
        """Requests per second the keys that can send now allow."""

    def next_gate_open(self, now: float) -> float | None:
        """When the next closed gate of a usable key opens, if one is closed."""

    def wall_time(self, t: float) -> float:
        """Engine clock seconds as Unix time, for files people read."""

    def problem(self, text: str) -> None:
        """Report something the run could not do (a file not written): shown once, fails the run."""

    def event(self, kind: EventKind, text: str) -> None: ...


class Source(Protocol):
    """Where requests come from: a generator, a file, messages of several calls."""

    rate: float
    exhausted: bool

    def set_rate(self, rate: float) -> None: ...

    def set_throttle(self, value: str | float) -> None:
        """Raises ValueError where the source has no entry throttle."""

    def poke(self) -> None: ...

    async def run(self, sink: SourceSink) -> None: ...

    def close_second(self) -> None:
        """Once a second: roll per-second series, flush files."""

    def stats(self, elapsed_s: float) -> MessageStats | None:
        """The source's part of a snapshot (None for plain requests)."""


class WorkerHost(Protocol):
    """What a key worker needs from the engine."""

    loop: asyncio.AbstractEventLoop | None
    queues: WorkQueues
    stopping: bool
    pool_ok: Callable[[str | None], bool] | None
    pool_ok_req: Callable[[Request], bool] | None

    def clock(self) -> float: ...

    def launch(self, worker: KeyWorker, req: Request, nonce: int | None, stamps: tuple[Stamp, ...]) -> None:
        """Send one attempt of `req` (the worker has counted it)."""

    def expire(self, req: Request) -> None: ...

    def shed(self, req: Request) -> None: ...
