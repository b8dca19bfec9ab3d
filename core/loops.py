"""The one place that chooses an event loop.

Every engine process (`--no-ui`, the console's engine, `--procs` shards, the
bench's clients) and the simulator run on uvloop when it is installed (it is
a dependency where it builds: not on Windows): the loop itself is a large
share of the engine's cost per request, and uvloop's is smaller (measured with
`ratedeck bench --scenarios many-keys-heavy --loop asyncio|uvloop`; figures in
docs/benchmarks.md). Its `time()` is whole milliseconds, so the engine and the simulator
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


#: Allocations (net) between young-generation collections in an engine process; Python's
#: default is 700. See `tune_gc`.
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Collect garbage less often in an engine process: it spends less CPU per request
    (figures in docs/measurements.md, "Transport").

    At thousands of requests a second, Python's default thresholds (700, 10, 10) run a
    young collection every few hundred requests, and each one walks every object of the
    requests in flight (aiohttp's, ours); those survive, so the middle generation fills and
    is walked too. A larger first threshold walks the same in-flight objects far less often;
    a collection then takes a few milliseconds, no longer than the default's full ones.
    Reference counting still frees almost everything at once: only cycles wait longer.
    """
    import gc

    _young, middle, old = gc.get_threshold()
    if _young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
