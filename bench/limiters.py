"""The seed's two client limiters, re-implemented from their described behaviour.

Both are told the time (milliseconds) at every call, so tests drive them on a
fake clock and the bench clients pass the wall clock. They are baselines to
measure against, not ratedeck's limiter (that is `ratedeck.engine.limiter`).
"""

from __future__ import annotations

from collections import deque


class FixedIntervalRing:
    """The seed's original client limiter: a fixed minimum interval AND a ring.

    A send is allowed only when more than `min_interval_ms` passed since the
    previous send and more than `window_ms` passed since the send `limit`
    sends ago (a circular buffer of `limit` send times). The original polls
    `ready()` with 1 ms sleeps; it never computes when it will be ready.

    Attributes:
        limit: sends per window (the ring's size).
        window_ms: the window the ring enforces.
        min_interval_ms: the fixed gap between consecutive sends.
    """

    __slots__ = ("limit", "window_ms", "min_interval_ms", "_times", "_index", "_last")

    def __init__(self, limit: int = 20, window_ms: float = 1000.0, min_interval_ms: float = 50.0):
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.window_ms = window_ms
        self.min_interval_ms = min_interval_ms
        self._times = [float("-inf")] * limit
        self._index = 0
        self._last = float("-inf")

    def ready(self, now_ms: float) -> bool:
        """True if a send at `now_ms` passes both checks (both are strict)."""
        if now_ms - self._last <= self.min_interval_ms:
            return False
        return now_ms - self._times[self._index] > self.window_ms

    def take(self, now_ms: float) -> None:
        """Record a send at `now_ms` in the ring and as the last send."""
        self._times[self._index] = now_ms
        self._index = (self._index + 1) % self.limit
        self._last = now_ms


class AdaptiveRing:
    """The seed's improved client limiter: a ring with a latency-based buffer.

    No fixed interval. A send waits until the ring's oldest send is more than
    `window_ms + buffer_ms` old. The buffer follows the average of the last
    100 observed latencies times 1.1, clamped to `min_buffer_ms..max_buffer_ms`
    (30..50 ms in the seed). `wait_ms()` says how long to sleep, and the
    caller re-checks after sleeping.
    """

    __slots__ = (
        "limit",
        "window_ms",
        "buffer_ms",
        "min_buffer_ms",
        "max_buffer_ms",
        "_times",
        "_index",
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
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.window_ms = window_ms
        self.buffer_ms = initial_buffer_ms
        self.min_buffer_ms = min_buffer_ms
        self.max_buffer_ms = max_buffer_ms
        self._times = [float("-inf")] * limit
        self._index = 0
        self._latencies: deque[float] = deque(maxlen=samples)

    def wait_ms(self, now_ms: float) -> float:
        """Milliseconds to wait before a send at `now_ms` is allowed (0 if allowed)."""
        elapsed = now_ms - self._times[self._index]
        headroom = self.window_ms + self.buffer_ms
        if elapsed > headroom:
            return 0.0
        return max(headroom - elapsed, 0.001)  # the check is strict: at equality, still wait

    def take(self, now_ms: float) -> None:
        """Record a send at `now_ms`."""
        self._times[self._index] = now_ms
        self._index = (self._index + 1) % self.limit

    def record_latency(self, latency_ms: float) -> None:
        """Feed one observed latency; the buffer becomes avg x 1.1 within the bounds."""
        self._latencies.append(latency_ms)
        avg = sum(self._latencies) / len(self._latencies)
        self.buffer_ms = min(self.max_buffer_ms, max(self.min_buffer_ms, int(avg * 1.1)))
