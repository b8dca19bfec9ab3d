"""The study's two client limiters, re-implemented from their described behaviour.

Both are told the time (milliseconds) at every call, so tests drive them on a
fake clock and the bench clients pass the wall clock. They are baselines to
measure against, but what they share with ratedeck is ratedeck's: the ring of
the last `limit` sends is the engine's sliding window (`WindowLimiter`, burst
pacing), and the improved client's latency buffer is that limiter's headroom.
Only the study's own rules stay here: the original's fixed interval, and the
improved one's buffer, average latency x 1.1 clamped to 30..50 ms (where
ratedeck measures the spread instead: engine/limits/headroom.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ratedeck.core.policy import Policy
from ratedeck.engine.limits.limiter import WindowLimiter

#: The study's checks are strict (a send exactly a window after the oldest is refused); the
#: engine's slot frees at that instant. A nanosecond more keeps the study's rule.
STRICT_S = 1e-9


def _ring(limit: int, window_ms: float, headroom_s: Callable[[], float]) -> WindowLimiter:
    """At most `limit` sends in any window of `window_ms` (plus the headroom), as the study's ring."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return WindowLimiter((Policy(limit, window_ms / 1000.0),), headroom_s, "burst")


class FixedIntervalRing:
    """The study's original client limiter: a fixed minimum interval AND a ring.

    A send is allowed only when more than `min_interval_ms` passed since the
    previous send and more than `window_ms` passed since the send `limit`
    sends ago (at most `limit` sends in any window). The original polls
    `ready()` with 1 ms sleeps; it never computes when it will be ready.

    Attributes:
        limit: sends per window (the ring's size).
        window_ms: the window the ring enforces.
        min_interval_ms: the fixed gap between consecutive sends.
    """

    __slots__ = ("limit", "window_ms", "min_interval_ms", "_window", "_last")

    def __init__(self, limit: int = 20, window_ms: float = 1000.0, min_interval_ms: float = 50.0):
        self._window = _ring(limit, window_ms, lambda: STRICT_S)
        self.limit = limit
        self.window_ms = window_ms
        self.min_interval_ms = min_interval_ms
        self._last = float("-inf")

    def ready(self, now_ms: float) -> bool:
        """True if a send at `now_ms` passes both checks (both are strict)."""
        if now_ms - self._last <= self.min_interval_ms:
            return False
        now = now_ms / 1000.0
        return self._window.next_free(now) <= now

    def take(self, now_ms: float) -> None:
        """Record a send at `now_ms` in the ring and as the last send."""
        self._window.record(now_ms / 1000.0)
        self._last = now_ms


class AdaptiveRing:
    """The study's improved client limiter: a ring with a latency-based buffer.

    No fixed interval. A send waits until the ring's oldest send is more than
    `window_ms + buffer_ms` old: the engine's sliding window with the buffer
    as its headroom. The buffer follows the average of the last 100 observed
    latencies times 1.1, clamped to `min_buffer_ms..max_buffer_ms` (30..50 ms
    in the seed). `wait_ms()` says how long to sleep, and the caller
    re-checks after sleeping.
    """

    __slots__ = (
        "limit",
        "window_ms",
        "buffer_ms",
        "min_buffer_ms",
        "max_buffer_ms",
        "_window",
        "_latencies",
    )

    def __init__(
        self,
        limit: int = 20,
        window_ms: float = 1000.0,
        *,
        initial_buffer_ms: float = 40.0,
        min_buffer_ms: float = 30.0,
        max_buffer_ms: float = 50.0,
        samples: int = 100,
    ):
        self._window = _ring(limit, window_ms, self._headroom_s)
        self.limit = limit
        self.window_ms = window_ms
        self.buffer_ms = initial_buffer_ms
        self.min_buffer_ms = min_buffer_ms
        self.max_buffer_ms = max_buffer_ms
        self._latencies: deque[float] = deque(maxlen=samples)

    def _headroom_s(self) -> float:
        return self.buffer_ms / 1000.0 + STRICT_S

    def wait_ms(self, now_ms: float) -> float:
        """Milliseconds to wait before a send at `now_ms` is allowed (0 if allowed)."""
        now = now_ms / 1000.0
        return max(0.0, self._window.next_free(now) - now) * 1000.0

    def take(self, now_ms: float) -> None:
        """Record a send at `now_ms`."""
        self._window.record(now_ms / 1000.0)

    def record_latency(self, latency_ms: float) -> None:
        """Feed one observed latency; the buffer becomes avg x 1.1 within the bounds."""
        self._latencies.append(latency_ms)
        avg = sum(self._latencies) / len(self._latencies)
        self.buffer_ms = min(self.max_buffer_ms, max(self.min_buffer_ms, int(avg * 1.1)))
