"""Chart history the console keeps for itself.

The engine publishes the last few minutes of per-second series (throughput,
p50, p99). The console folds every new second into its own history: the last
`FINE_S` seconds at one-second resolution, and the whole run in at most
`MAX_BUCKETS` buckets whose width doubles when they run out (1 s, 2 s, 4 s,
...), so memory stays bounded and every bucket covers the same time. Live
capacity is not a series in the snapshot, so the console records it at each
pull for the second it falls in.

Nothing here knows Textual; the charts get plain lists of numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ratedeck.engine.snapshot import Snapshot

FINE_S = 300
MAX_BUCKETS = 600

#: Chart spans the operator can pick with `z`: seconds, or None for the whole run.
SPANS: tuple[tuple[str, int | None], ...] = (("1m", 60), ("5m", 300), ("run", None))


@dataclass(frozen=True, slots=True)
class Point:
    """One second (or one bucket) of the run.

    `p50`/`p99` are None when nothing succeeded in it (no latency measured).
    `capacity` is what every key allows, `live` what the keys that could send
    allowed (None for seconds before the console was watching: not recorded).
    """

    tps: float
    p50: float | None
    p99: float | None
    capacity: float
    live: float | None
    goodput: float | None = None  # messages completed (a message run only)


class _Bucket:
    """Running sums for one coarse bucket."""

    __slots__ = (
        "cap_sum",
        "good_n",
        "good_sum",
        "lat_n",
        "live_n",
        "live_sum",
        "n",
        "p50_sum",
        "p99_max",
        "tps_sum",
    )

    def __init__(self) -> None:
        self.n = 0
        self.tps_sum = 0.0
        self.lat_n = 0
        self.p50_sum = 0.0
        self.p99_max = 0.0
        self.cap_sum = 0.0
        self.live_n = 0
        self.live_sum = 0.0
        self.good_n = 0
        self.good_sum = 0.0

    def add(self, point: Point) -> None:
        self.n += 1
        self.tps_sum += point.tps
        self.cap_sum += point.capacity
        if point.live is not None:
            self.live_n += 1
            self.live_sum += point.live
        if point.goodput is not None:
            self.good_n += 1
            self.good_sum += point.goodput
        if point.p50 is not None and point.p99 is not None:
            self.lat_n += 1
            self.p50_sum += point.p50
            self.p99_max = max(self.p99_max, point.p99)

    def merge(self, other: _Bucket) -> None:
        self.n += other.n
        self.tps_sum += other.tps_sum
        self.cap_sum += other.cap_sum
        self.live_n += other.live_n
        self.live_sum += other.live_sum
        self.good_n += other.good_n
        self.good_sum += other.good_sum
        self.lat_n += other.lat_n
        self.p50_sum += other.p50_sum
        self.p99_max = max(self.p99_max, other.p99_max)

    def point(self) -> Point:
        n = max(self.n, 1)
        return Point(
            tps=self.tps_sum / n,
            p50=self.p50_sum / self.lat_n if self.lat_n else None,
            p99=self.p99_max if self.lat_n else None,  # the worst p99 of the bucket
            capacity=self.cap_sum / n,
            live=self.live_sum / self.live_n if self.live_n else None,
            goodput=self.good_sum / self.good_n if self.good_n else None,
        )


def new_seconds(old: Sequence[tuple], new: Sequence[tuple], expected: int) -> int:
    """How many points `new` has that `old` had not (the engine appends and drops the oldest).

    While the series grows the answer is the growth. Once it is full, the
    shift is found by matching the overlap, trying the shift the elapsed time
    suggests first (constant data matches any shift; elapsed time decides).
    """
    if len(new) > len(old):
        return len(new) - len(old)
    if len(new) < len(old):  # a shorter series: a new run; take it all
        return len(new)
    if new == old:
        return 0
    size = len(new)
    candidates = sorted(range(1, size + 1), key=lambda d: (abs(d - expected), d))
    for shift in candidates:
        if new[: size - shift] == old[shift:]:
            return shift
    return min(max(expected, 1), size)


class RunHistory:
    """Per-second points of the run, fed from successive snapshots with `ingest`."""

    def __init__(self, fine_s: int = FINE_S, max_buckets: int = MAX_BUCKETS) -> None:
        self.fine: deque[Point] = deque(maxlen=fine_s)
        self.max_buckets = max_buckets
        self.bucket_s = 1  # seconds per coarse bucket
        self._buckets: list[_Bucket] = []
        self._open: _Bucket | None = None  # the coarse bucket being filled
        self._series: tuple[tuple, ...] = ()
        self._elapsed = 0.0
        self._live: dict[int, float] = {}  # second -> live capacity seen during it
        self.seconds = 0  # points taken in so far

    def ingest(self, snap: Snapshot) -> bool:
        """Take in the seconds `snap` has that the history has not; True if any."""
        series = tuple(zip(snap.tps_series, snap.p50_series, snap.p99_series, strict=False))
        now_s = int(snap.elapsed_s)
        self._live[now_s] = snap.live_capacity_tps
        expected = now_s - int(self._elapsed)
        count = new_seconds(self._series, series, expected)
        self._series = series
        self._elapsed = snap.elapsed_s
        if not count:
            return False
        first_second = now_s - count
        goodput = snap.messages.goodput_series if snap.messages is not None else ()
        lag = len(series) - len(goodput)  # goodput is aligned with the other series from the end
        for offset, (tps, p50, p99) in enumerate(series[len(series) - count :]):
            second = first_second + offset
            good_index = len(series) - count + offset - lag
            # None for a second the console did not see (before it started)
            live = self._live.pop(second, None)
            self._add(
                Point(
                    tps=tps,
                    p50=p50 if p50 > 0 else None,
                    p99=p99 if p99 > 0 else None,
                    capacity=snap.capacity_tps,
                    live=live,
                    goodput=goodput[good_index] if 0 <= good_index < len(goodput) else None,
                )
            )
        # Seconds older than the newest point will never be read again.
        for second in [s for s in self._live if s < now_s - 1]:
            del self._live[second]
        return True

    def _add(self, point: Point) -> None:
        self.fine.append(point)
        self.seconds += 1
        if self._open is None:
            self._open = _Bucket()
        self._open.add(point)
        if self._open.n >= self.bucket_s:
            self._buckets.append(self._open)
            self._open = None
            if len(self._buckets) >= self.max_buckets:
                self._compact()

    def _compact(self) -> None:
        """Halve the number of buckets by merging neighbours; each now covers twice the time."""
        merged: list[_Bucket] = []
        for index in range(0, len(self._buckets) - 1, 2):
            bucket = self._buckets[index]
            bucket.merge(self._buckets[index + 1])
            merged.append(bucket)
        if len(self._buckets) % 2:  # an odd one out starts the next bucket
            self._open = self._buckets[-1]
        self._buckets = merged
        self.bucket_s *= 2

    def view(self, span_s: int | None) -> tuple[list[Point], float]:
        """Points covering the last `span_s` seconds (None: the whole run), oldest first,
        and the seconds each point covers. The last point ends now."""
        if span_s is not None and span_s <= len(self.fine):
            return list(self.fine)[-span_s:], 1.0
        if span_s is not None or self.seconds <= len(self.fine):
            return list(self.fine), 1.0
        points = [bucket.point() for bucket in self._buckets]
        if self._open is not None:
            points.append(self._open.point())
        return points, float(self.bucket_s)


def resample(
    values: Sequence[float | None], res_s: float, span_s: float, columns: int, how: str = "mean"
) -> list[float | None]:
    """`values` (oldest first, each covering `res_s` seconds, the last ending now) as
    `columns` values covering the last `span_s` seconds; None where there is no data.

    `how` is "mean" or "max" (a p99 column shows the worst second in it).
    """
    if columns <= 0:
        return []
    count = len(values)
    out: list[float | None] = []
    width = span_s / columns  # seconds per column
    for column in range(columns):
        # seconds ago at the column's two edges (older edge first)
        older = span_s - column * width
        newer = span_s - (column + 1) * width
        last = count - 1 - math.floor(newer / res_s + 1e-9)  # index of the newest point in range
        first = count - math.ceil(older / res_s - 1e-9)  # index of the oldest point in range
        if width < res_s or first > last:  # a column narrower than a point: the point under its middle
            middle = (older + newer) / 2
            first = last = count - 1 - math.floor(middle / res_s)
        first = max(first, 0)
        if last < 0 or first >= count:
            out.append(None)
            continue
        chunk = [value for value in values[first : last + 1] if value is not None]
        if not chunk:
            out.append(None)
        elif how == "max":
            out.append(max(chunk))
        else:
            out.append(sum(chunk) / len(chunk))
    return out
