"""An asyncio loop on fake time: sleeping costs nothing and is deterministic.

When the loop would block waiting for a timer, the selector instead moves
the virtual clock to that timer. Real I/O still works (a zero-timeout poll
comes first), but engine tests use in-memory transports and do none.
"""

from __future__ import annotations

import asyncio
import selectors


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self):
        super().__init__()
        self.now = 0.0

    def select(self, timeout=None):
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("virtual time: nothing is scheduled and nothing can happen (deadlock)")
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual; it jumps to the next timer whenever the loop would wait."""

    def __init__(self):
        self._vsel = _VirtualSelector()
        super().__init__(self._vsel)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vsel.now


def run_virtual(coro):
    """Run a coroutine to completion on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
