"""The Unix clock on virtual time: `time.time()` follows the virtual loop while one runs.

Fixed windows turn on the Unix clock's whole windows (`engine/limits/limiter.py`'s
`_Fixed`, `server/policy_transport.py`). On a virtual loop the real clock would put
that turn wherever it happened to stand when the test ran, and a test's first
seconds would differ from run to run. Every test gets a pinned clock instead:
while a `VirtualTimeLoop` runs, `time.time()` is a fixed start plus the loop's
time; elsewhere (real loops, real servers, no loop) it is the real clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from ratedeck.server.simulated import VirtualTimeLoop

# Half a second past a whole minute: a 1 s window turns at 0.5 s, a 2 s one at 1.5 s,
# a minute's at 59.5 s, as they would for a job started at an ordinary moment.
START = 1_800_000_000.5

_real = time.time


@pytest.fixture(autouse=True)
def unix_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float], None]]:
    """`unix_clock(at)`: the Unix time at the virtual loop's zero (START unless a test says)."""
    start = [START]

    def unix() -> float:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return _real()
        return start[0] + loop.time() if isinstance(loop, VirtualTimeLoop) else _real()

    def pin(at: float) -> None:
        start[0] = at

    monkeypatch.setattr(time, "time", unix)
    yield pin
