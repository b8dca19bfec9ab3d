"""Pieces every baseline client shares: requests, nonces, arrival gaps."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from urllib.parse import quote

MAX_ATTEMPTS = 5
SOFT_QUEUE_CAP = 50  # the improved client's backpressure threshold (at the study's 100/s)
DRAIN_S = 2.0  # how long in-flight sends may finish after the run ends


class BenchRequest:
    """One unit of work: an id, a deadline (monotonic seconds) and attempts made."""

    __slots__ = ("id", "deadline", "attempts")

    def __init__(self, rid: int, deadline: float):
        self.id = rid
        self.deadline = deadline
        self.attempts = 0


class NonceSource:
    """Per key: wall time in ms, bumped so it strictly increases (timestamp + counter)."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, int(time.time() * 1000))
        return self._last


def query(key: str, req_id: int, nonce: int | None) -> str:
    """The query string of one attempt (the key is quoted, as the engine does)."""
    q = f"api_key={quote(key, safe='')}&req_id={req_id}"
    return q if nonce is None else f"{q}&nonce={nonce}"


def arrival_gaps(rate: float, rng: random.Random) -> Callable[[], float]:
    """Uniform random gaps in 0..2/rate seconds: mean 1/rate, the seed generator's shape."""
    high = 2.0 / rate
    return lambda: rng.uniform(0.0, high)


def soft_queue_cap(offered_tps: float) -> int:
    """The generator's backpressure threshold: 50, or half a second of work if more.

    The study's improved client sleeps 0.5 s once its queue holds that many;
    a fixed 50 would starve a fast scenario (50 is 50 ms of work at 1000/s).
    """
    return max(SOFT_QUEUE_CAP, int(offered_tps * 0.5))
