"""The one place that chooses an event loop.

Every engine process (`--no-ui`, the console's engine, `--procs` shards, the
bench's clients) and the simulator run on uvloop when it is installed (it is
a dependency where it builds: not on Windows). With the lean HTTP client
(engine/http1.py) the loop itself is the largest cost per request; uvloop cut
ratedeck's CPU per accepted request by about a quarter on many-keys-heavy
(`ratedeck bench --scenarios many-keys-heavy --loop asyncio|uvloop`, issue
15). Its `time()` is whole milliseconds, so the engine and the simulator
stamp with `time.monotonic()` there (see `engine_clock`). The console's own
process (Textual) keeps asyncio's standard loop.
`RATEDECK_LOOP=asyncio|uvloop` overrides the choice, for comparisons.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Literal

LoopName = Literal["asyncio", "uvloop"]
LOOP_NAMES: tuple[LoopName, ...] = ("asyncio", "uvloop")


def loop_factory(prefer: LoopName = "uvloop") -> Callable[[], asyncio.AbstractEventLoop]:
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


def new_loop(prefer: LoopName = "uvloop") -> asyncio.AbstractEventLoop:
    """A new event loop chosen as `loop_factory` says."""
    return loop_factory(prefer)()
