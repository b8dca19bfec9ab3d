"""The one place that chooses an event loop.

Clients (the engine, the bench's peers) run on asyncio's standard loop by
default: measured on 50 keys x 100/s, uvloop was no faster for them, and its
whole-millisecond clock needs care when stamping sends. The simulator prefers
uvloop when installed: it roughly doubles the requests per second a server
process can answer, and it stamps arrivals with `time.monotonic()`.
`RATEDECK_LOOP=asyncio|uvloop` overrides both, for comparisons.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Literal

LoopName = Literal["asyncio", "uvloop"]
LOOP_NAMES: tuple[LoopName, ...] = ("asyncio", "uvloop")


def loop_factory(prefer: LoopName = "asyncio") -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory for the loop to run on: `prefer`, unless RATEDECK_LOOP says otherwise.

    uvloop falls back to the standard loop when it is not installed.
    """
    choice = os.environ.get("RATEDECK_LOOP", prefer)
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            return asyncio.new_event_loop
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def new_loop(prefer: LoopName = "asyncio") -> asyncio.AbstractEventLoop:
    """A new event loop chosen as `loop_factory` says."""
    return loop_factory(prefer)()
