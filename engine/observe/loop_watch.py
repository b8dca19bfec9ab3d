"""The client's own cost: process CPU since the start, and how late the ticker's timer fires
(a loop that cannot keep up makes every timer, pacing and deadlines, that late too).

From both it says whether the client, not the server, is the limit (`client_limit`):

- the loop lags, sustained and under load: its lag p99 is over `LOOP_LAG_WARN_MS` (more
  than one tick in a hundred fired that late), once `VERDICT_MIN_TICKS` ticks were
  measured, AND at least `SUSTAINED_LATE_TICKS` ticks in a row fired that late, AND the
  loop's thread was busy (at least `BUSY_CORE_SHARE` of a core): one stall (the start's
  long turn, a GC, a swap-in) is no verdict, and a loop late while idle is a machine
  busy with something else, which no flag of ratedeck's lifts;
- or the process used at least `CLIENT_CORE_SHARE` of a core (CPU seconds per wall
  second) over at least `VERDICT_MIN_WALL_S`: one asyncio loop cannot use more;
- and the run is not already at `AT_CAPACITY_PCT` of what the limits allow: a run at
  the limits has the server's rules as its limit, however busy the client is.

The recent verdict reads the last `LAG_RECENT_TICKS` ticks (about a minute), the
run's reads every tick and the CPU since the start.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from ratedeck.core.vocab import EventKind
from ratedeck.engine.ports import EventSink
from ratedeck.engine.snapshot import LatencySummary, LoopLag

from .metrics import LatencyHistogram

#: Timers firing this late (ms) mean the loop cannot keep up: the client is the bottleneck.
LOOP_LAG_WARN_MS = 10.0
#: At most one loop-lag warning in the event log per this many seconds.
LOOP_LAG_WARN_EVERY_S = 30.0
LAG_WINDOW_S = 5.0  # the lag shown is the worst in the last this-many seconds
LAG_RECENT_TICKS = 600  # the recent p50/p99 and CPU share: the last this-many ticks (a minute at 10/s)
#: CPU seconds per wall second from which the process is taken as saturated (1.0: a whole core).
CLIENT_CORE_SHARE = 0.9
VERDICT_MIN_TICKS = 50  # the lag p99 says nothing before this many ticks (5 s)
VERDICT_MIN_WALL_S = 5.0  # nor the CPU share over less than this
#: Ticks in a row this late make a lag sustained (fewer: a stall, the start's long turn).
SUSTAINED_LATE_TICKS = 3
#: The loop's thread busy at least this share of a core: its lag comes from its own work.
BUSY_CORE_SHARE = 0.5
#: A run at this percentage of its capacity is held by the limits, not by the client.
AT_CAPACITY_PCT = 95.0


def client_limit(
    lag_p99_ms: float,
    ticks: int,
    core_share: float | None,
    pct_capacity: float = 0.0,
    *,
    streak: int = 0,
) -> str:
    """The verdict (see the module doc): the figures that say the client is the limit,
    "loop late p99 25 ms, 97% of a core busy", or "" when it is not. `streak`: the most
    ticks in a row that fired later than `LOOP_LAG_WARN_MS` over the same ticks."""
    if pct_capacity >= AT_CAPACITY_PCT:
        return ""
    why = []
    lagging = ticks >= VERDICT_MIN_TICKS and lag_p99_ms > LOOP_LAG_WARN_MS
    sustained = streak >= SUSTAINED_LATE_TICKS
    busy = core_share is not None and core_share >= BUSY_CORE_SHARE
    if lagging and sustained and busy:
        why.append(f"loop late p99 {lag_p99_ms:.0f} ms")
    if core_share is not None and core_share >= CLIENT_CORE_SHARE:
        why.append(f"{core_share * 100:.0f}% of a core busy")
    return ", ".join(why)


def _longest_late_run(lags_ms: deque[float]) -> int:
    """The most ticks in a row later than `LOOP_LAG_WARN_MS`."""
    longest = run = 0
    for late_ms in lags_ms:
        run = run + 1 if late_ms > LOOP_LAG_WARN_MS else 0
        longest = max(longest, run)
    return longest


def _nearest_rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


class LoopWatch:
    """CPU seconds since `start` (frozen at `stop`) and the loop's lateness (`lag_ms`), with
    its distribution and the verdict in `view`.

    `answered()` says how many attempts were answered so far, for the CPU cost
    per request a warning names. `cpu` and `wall` are the process's CPU and a
    monotonic wall clock, in seconds (tests pass their own).
    """

    __slots__ = (
        "event",
        "answered",
        "name",
        "shared_with",
        "lag_ms",
        "started",
        "_cpu",
        "_loop_cpu",
        "_loop_cpu0",
        "_loop_cpu_end",
        "_wall",
        "_cpu0",
        "_wall0",
        "_cpu_end",
        "_wall_end",
        "_lag_now",
        "_lag_prev",
        "_late_ticks",
        "_late_run_max",
        "_window_end",
        "_warned_at",
        "_recent",
        "_marks",
        "_run",
    )

    def __init__(
        self,
        events: EventSink,
        answered: Callable[[], int],
        cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
        loop_cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.event = events.event
        self.answered = answered
        self.name = ""  # the loop's family ("uvloop" or "asyncio"), once started
        self.shared_with = ""  # what else runs in this process and counts in `cpu_s` (the embedded simulator)
        self.lag_ms = 0.0
        self.started = False
        self._cpu, self._wall = cpu, wall
        # The loop's own thread: the process's CPU also counts the HTTP client's thread
        # (pyreqwest's), so only this one says whether the loop is out of time.
        self._loop_cpu = loop_cpu
        self._loop_cpu0 = 0.0
        self._loop_cpu_end: float | None = None
        self._cpu0 = self._wall0 = 0.0
        self._cpu_end: float | None = None
        self._wall_end: float | None = None
        self._lag_now = 0.0  # the worst lateness in the running window
        self._lag_prev = 0.0  # and in the one before
        self._late_ticks = 0  # ticks in a row that fired late
        self._late_run_max = 0  # the most ticks in a row that fired late, over the run
        self._window_end = 0.0
        self._warned_at = -math.inf
        self._recent: deque[float] = deque(maxlen=LAG_RECENT_TICKS)  # the last ticks' lateness, ms
        self._marks: deque[tuple[float, float]] = deque(maxlen=LAG_RECENT_TICKS)  # (wall, cpu) per tick
        self._run = LatencyHistogram()  # every tick's lateness, ms

    def start(self, now: float, name: str) -> None:
        self.started, self.name = True, name
        self._cpu0, self._wall0, self._loop_cpu0 = self._cpu(), self._wall(), self._loop_cpu()
        self._window_end = now + LAG_WINDOW_S

    def stop(self) -> None:
        self._cpu_end, self._wall_end, self._loop_cpu_end = self._cpu(), self._wall(), self._loop_cpu()

    def cpu_s(self) -> float:
        """CPU seconds of this process since the start (frozen when it stopped)."""
        end = self._cpu_end if self._cpu_end is not None else self._cpu()
        return max(0.0, end - self._cpu0) if self.started else 0.0

    def _cpu_us_per_request(self) -> float | None:
        answered = self.answered()
        return self.cpu_s() * 1e6 / answered if answered > 0 else None

    def core_share(self) -> float | None:
        """The loop thread's CPU seconds per wall second over the recent ticks; None over less
        than `VERDICT_MIN_WALL_S`."""
        if len(self._marks) < 2:
            return None
        (wall0, cpu0), (wall1, cpu1) = self._marks[0], self._marks[-1]
        return (cpu1 - cpu0) / (wall1 - wall0) if wall1 - wall0 >= VERDICT_MIN_WALL_S else None

    def run_core_share(self) -> float | None:
        """The loop thread's CPU seconds per wall second since the start (to the stop); None
        before `VERDICT_MIN_WALL_S`."""
        if not self.started:
            return None
        wall = (self._wall_end if self._wall_end is not None else self._wall()) - self._wall0
        end = self._loop_cpu_end if self._loop_cpu_end is not None else self._loop_cpu()
        return (end - self._loop_cpu0) / wall if wall >= VERDICT_MIN_WALL_S else None

    def view(self, pct_capacity: float = 0.0, whole: bool = False) -> LoopLag:
        """The lateness as p50/p99 (recent and the run's) and the verdicts; `pct_capacity` is the
        run's throughput as a percentage of its capacity (0: not known), `whole` puts the run's
        histogram in (a process of several: the merge adds them)."""
        recent = sorted(self._recent)
        p50, p99 = _nearest_rank(recent, 0.5), _nearest_rank(recent, 0.99)
        h = self._run
        run_p50, run_p99 = h.quantiles(0.5, 0.99)
        run = LatencySummary(
            mean=h.total / h.count if h.count else 0.0,
            p50=run_p50,
            p99=run_p99,
            max=h.max,
            count=h.count,
            hist=h.sparse() if whole else (),
        )
        share, run_share = self.core_share(), self.run_core_share()
        return LoopLag(
            p50_ms=p50,
            p99_ms=p99,
            run=run,
            core_share=share,
            run_core_share=run_share,
            limit=client_limit(p99, len(recent), share, pct_capacity, streak=_longest_late_run(self._recent)),
            run_limit=client_limit(run_p99, h.count, run_share, pct_capacity, streak=self._late_run_max),
        )

    def note_lag(self, late_s: float, now: float) -> None:
        """The ticker's timer fired `late_s` late: keep the worst of the last few seconds and
        the distribution, and say so in the event log (at most every `LOOP_LAG_WARN_EVERY_S`)
        when two ticks in a row were later than `LOOP_LAG_WARN_MS`: then every timer (pacing,
        deadlines) is that late too."""
        late_ms = max(0.0, late_s * 1000.0)
        self._recent.append(late_ms)
        self._run.add(late_ms)
        self._run.fold()  # a few a second: binned at once
        self._marks.append((self._wall(), self._loop_cpu()))
        if now >= self._window_end:  # a new window: the last one's worst is still shown
            self._lag_prev, self._lag_now = self._lag_now, late_ms
            self._window_end = now + LAG_WINDOW_S
        elif late_ms > self._lag_now:
            self._lag_now = late_ms
        self.lag_ms = max(self._lag_prev, self._lag_now)
        # Two late ticks in a row: one alone may be a single long turn (the start, a GC).
        self._late_ticks = self._late_ticks + 1 if late_ms > LOOP_LAG_WARN_MS else 0
        self._late_run_max = max(self._late_run_max, self._late_ticks)
        if self._late_ticks >= 2 and now - self._warned_at >= LOOP_LAG_WARN_EVERY_S:
            self._warned_at = now
            cpu = self._cpu_us_per_request()
            cost = f", {cpu:.0f} µs CPU per request" if cpu is not None else ""
            self.event(
                EventKind.ERROR,
                f"the engine's loop runs late: a timer fired {late_ms:.0f} ms late{cost};"
                " the client, not the server, may be the bottleneck",
            )
