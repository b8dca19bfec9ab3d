"""The client's own cost: process CPU since the start, and how late the ticker's timer fires
(a loop that cannot keep up makes every timer, pacing and deadlines, that late too)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ratedeck.core.vocab import EventKind
from ratedeck.engine.ports import EventSink

#: Timers firing this late (ms) mean the loop cannot keep up: the client is the bottleneck.
LOOP_LAG_WARN_MS = 10.0
#: At most one loop-lag warning in the event log per this many seconds.
LOOP_LAG_WARN_EVERY_S = 30.0
LAG_WINDOW_S = 5.0  # the lag shown is the worst in the last this-many seconds


class LoopWatch:
    """CPU seconds since `start` (frozen at `stop`) and the loop's lateness (`lag_ms`).

    `answered()` says how many attempts were answered so far, for the CPU cost
    per request a warning names.
    """

    __slots__ = (
        "event",
        "answered",
        "name",
        "lag_ms",
        "started",
        "_cpu0",
        "_cpu_end",
        "_lag_now",
        "_lag_prev",
        "_late_ticks",
        "_window_end",
        "_warned_at",
    )

    def __init__(self, events: EventSink, answered: Callable[[], int]) -> None:
        self.event = events.event
        self.answered = answered
        self.name = ""  # the loop's family ("uvloop" or "asyncio"), once started
        self.lag_ms = 0.0
        self.started = False
        self._cpu0 = 0.0
        self._cpu_end: float | None = None
        self._lag_now = 0.0  # the worst lateness in the running window
        self._lag_prev = 0.0  # and in the one before
        self._late_ticks = 0  # ticks in a row that fired late
        self._window_end = 0.0
        self._warned_at = -math.inf

    def start(self, now: float, name: str) -> None:
        self.started, self.name = True, name
        self._cpu0 = time.process_time()
        self._window_end = now + LAG_WINDOW_S

    def stop(self) -> None:
        self._cpu_end = time.process_time()

    def cpu_s(self) -> float:
        """CPU seconds of this process since the start (frozen when it stopped)."""
        end = self._cpu_end if self._cpu_end is not None else time.process_time()
        return max(0.0, end - self._cpu0) if self.started else 0.0

    def _cpu_us_per_request(self) -> float | None:
        answered = self.answered()
        return self.cpu_s() * 1e6 / answered if answered > 0 else None

    def note_lag(self, late_s: float, now: float) -> None:
        """The ticker's timer fired `late_s` late: keep the worst of the last few seconds,
        and say so in the event log (at most every `LOOP_LAG_WARN_EVERY_S`) when two ticks
        in a row were later than `LOOP_LAG_WARN_MS`: then every timer (pacing, deadlines) is
        that late too."""
        late_ms = max(0.0, late_s * 1000.0)
        if now >= self._window_end:  # a new window: the last one's worst is still shown
            self._lag_prev, self._lag_now = self._lag_now, late_ms
            self._window_end = now + LAG_WINDOW_S
        elif late_ms > self._lag_now:
            self._lag_now = late_ms
        self.lag_ms = max(self._lag_prev, self._lag_now)
        # Two late ticks in a row: one alone may be a single long turn (the start, a GC).
        self._late_ticks = self._late_ticks + 1 if late_ms > LOOP_LAG_WARN_MS else 0
        if self._late_ticks >= 2 and now - self._warned_at >= LOOP_LAG_WARN_EVERY_S:
            self._warned_at = now
            cpu = self._cpu_us_per_request()
            cost = f", {cpu:.0f} µs CPU per request" if cpu is not None else ""
            self.event(
                EventKind.ERROR,
                f"the engine's loop runs late: a timer fired {late_ms:.0f} ms late{cost};"
                " the client, not the server, may be the bottleneck (try --procs)",
            )
