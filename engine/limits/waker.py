"""One pending wait that a timer or a poke ends: how the engine sleeps without polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: How much later than asked a timer is set on a loop whose timers keep whole milliseconds
#: (uvloop's: libuv rounds a delay to the nearest ms from a clock read at the turn's start).
#: Set for the moment itself, about one wake in two came before it on a busy loop (40,022 of
#: 79,718 timed waits on the live-heavy bench) and the worker slept again, a second timer and
#: turn for one send; half a millisecond more and none comes early.
TIMER_GRAIN_S = 0.0005

_grains: dict[type, float] = {}


def timer_grain(loop: asyncio.AbstractEventLoop) -> float:
    """What `Waker.wait` adds to a timer on `loop`: none where timers keep the loop's own
    float time (asyncio's, and the virtual clock's), `TIMER_GRAIN_S` elsewhere."""
    kind = type(loop)
    grain = _grains.get(kind)
    if grain is None:
        grain = _grains[kind] = 0.0 if isinstance(loop, asyncio.BaseEventLoop) else TIMER_GRAIN_S
    return grain


class Waker:
    """Holds at most one waiting future; `poke()` ends the wait early.

    `wait(loop, until)` sleeps until the loop time `until` (None: until
    poked). `register` receives the future before the wait starts, so it can
    also be handed to someone else who may end it (a queue's getter list).
    """

    __slots__ = ("_fut", "until", "for_work")

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None
        self.until: float | None = None  # when the current wait ends by itself (None: only a poke)
        self.for_work = False  # the current wait was handed to someone else too (a queue's getters)

    @property
    def waiting(self) -> bool:
        """Whether a wait is pending (a poke would end it)."""
        fut = self._fut
        return fut is not None and not fut.done()

    def poke(self) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(
        self,
        loop: asyncio.AbstractEventLoop | None,
        until: float | None = None,
        register: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> None:
        if loop is None:
            loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._fut = fut
        self.until = until
        self.for_work = register is not None
        if register is not None:
            register(fut)
        handle = loop.call_at(until + timer_grain(loop), _resolve, fut) if until is not None else None
        try:
            await fut
        finally:
            self._fut = None
            if handle is not None:
                handle.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
