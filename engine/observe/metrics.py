"""Counters, a fixed-size latency histogram and per-second series.

Memory stays flat however long a run lasts: latency goes into a histogram of
fixed size, per-second series are bounded deques, and only the current
second's latencies are kept as a list.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from ratedeck.core.vocab import OutcomeKind
from ratedeck.engine.snapshot import ErrorRow, LatencySummary

_FINE_MS = 1000  # below this, buckets of 0.1 ms
_FINE_BINS = _FINE_MS * 10
_COARSE_BINS = 6000  # then buckets of 10 ms, up to 61 s
_TENFOLD = (10.0).__mul__  # ms -> fine bin, mapped over a list without a Python call per value


#: Upper bounds (ms) of the cumulative buckets a summary carries (Prometheus-style histograms).
BUCKET_EDGES_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


def bin_edge_ms(i: int) -> float:
    """The upper edge (ms) of histogram bin `i`."""
    return (i + 1) / 10 if i < _FINE_BINS else _FINE_MS + (i - _FINE_BINS + 1) * 10


def quantiles_of(bins: list[int], count: int, top: float, qs: tuple[float, ...]) -> list[float]:
    """Nearest-rank quantiles of a histogram: the upper edge of the bin holding each, at most
    `top` (the largest value seen)."""
    if not count:
        return [0.0] * len(qs)
    wanted = sorted((max(1, int(q * count + 0.999999)), k) for k, q in enumerate(qs))
    out = [0.0] * len(qs)
    seen, j = 0, 0
    for i, n in enumerate(bins):
        if not n:
            continue
        seen += n
        while j < len(wanted) and seen >= wanted[j][0]:
            out[wanted[j][1]] = min(bin_edge_ms(i), top)
            j += 1
        if j == len(wanted):
            break
    return out


class _Appended:
    """What both histograms share: `add` is the bound `append` of a list, no Python call. On
    the request path it runs several times per request, and a list's append costs a fifth of
    binning a value there. What was added is binned (`_bin`) when anything is read, or when
    the owner folds it (`fold`; the engine does once a second), so the list stays short."""

    __slots__ = ("_bins", "_count", "_total", "_max", "_pending", "add")

    def __init__(self, bins: Any) -> None:
        self._bins = bins
        self._count = 0
        self._total = 0.0
        self._max = 0.0
        self._pending: list[float] = []
        self.add: Callable[[float], None] = self._pending.append

    def fold(self) -> None:
        """Bin what was added since the last fold."""
        pending = self._pending
        if not pending:
            return
        self._count += len(pending)
        self._total += sum(pending)
        top = max(pending)
        if top > self._max:
            self._max = top
        self._bin(pending, top)
        pending.clear()

    def _bin(self, values: list[float], top: float) -> None:
        raise NotImplementedError

    @property
    def bins(self) -> Any:
        self.fold()
        return self._bins

    @property
    def count(self) -> int:
        self.fold()
        return self._count

    @property
    def total(self) -> float:
        self.fold()
        return self._total

    @property
    def max(self) -> float:
        self.fold()
        return self._max


class LatencyHistogram(_Appended):
    """Latencies in ms: 0.1 ms resolution below 1 s, 10 ms above, capped at 61 s."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__([0] * (_FINE_BINS + _COARSE_BINS))

    def _bin(self, values: list[float], top: float) -> None:
        bins = self._bins
        if top < _FINE_MS and min(values) >= 0:  # the usual case: every value in the fine bins
            for i in map(int, map(_TENFOLD, values)):
                bins[i] += 1
            return
        last = len(bins) - 1
        for ms in values:
            if ms < _FINE_MS:
                i = int(ms * 10) if ms > 0 else 0
            else:
                i = min(_FINE_BINS + int((ms - _FINE_MS) / 10), last)
            bins[i] += 1

    def quantiles(self, *qs: float) -> list[float]:
        """Upper edges of the buckets holding each quantile (in ms)."""
        return quantiles_of(self.bins, self.count, self.max, qs)

    def summary(self, whole: bool = False) -> LatencySummary:
        """Mean, percentiles and cumulative buckets; with `whole`, the sparse histogram too."""
        p50, p90, p99, p999 = self.quantiles(0.5, 0.9, 0.99, 0.999)
        mean = self.total / self.count if self.count else 0.0
        return LatencySummary(
            mean=mean,
            p50=p50,
            p90=p90,
            p99=p99,
            max=self.max,
            p999=p999,
            count=self.count,
            buckets=self.cumulative(),
            hist=self.sparse() if whole else (),
        )

    def sparse(self) -> tuple[tuple[int, int], ...]:
        """(bin, count) for every bin in use, read only up to the largest value's bin."""
        end = len(self.bins) if self.max >= _FINE_MS else int(self.max * 10) + 1
        return tuple((i, n) for i, n in enumerate(self.bins[:end]) if n)

    def cumulative(self, edges_ms: tuple[float, ...] = BUCKET_EDGES_MS) -> tuple[tuple[float, int], ...]:
        """(edge, count of latencies at or below it) for each edge: a histogram as Prometheus reads it."""
        bins, out, total, start = self.bins, [], 0, 0
        for edge in edges_ms:
            end = int(round(edge * 10)) if edge <= _FINE_MS else _FINE_BINS + int((edge - _FINE_MS) / 10)
            end = min(end, len(bins))
            total += sum(bins[start:end])
            start = end
            out.append((float(edge), total))
        return tuple(out)


_KEY_FLOOR_MS = 0.1  # one key's bins: the first ends here, each next one 2 % higher, to 61 s
_KEY_LOG_RATIO = math.log(1.02)
_KEY_BINS = int(math.log(61_000 / _KEY_FLOOR_MS) / _KEY_LOG_RATIO) + 1
_KEY_QS = (0.5, 0.9, 0.99, 0.999)
_KEY_PER_FLOOR, _KEY_PER_LOG = 1 / _KEY_FLOOR_MS, 1 / _KEY_LOG_RATIO  # multiplying is cheaper
_log = math.log


class KeyLatency(_Appended):
    """One key's send -> answer latencies of successes: the run's percentiles within 2 %.

    Bins 2 % wide from 0.1 ms to 61 s (673 of them, 5.4 KB a key, made at its first success)
    instead of the whole run's fixed 0.1 ms grain (128 KB): a key costs little however
    many there are. Adding is a list's append, and binning one log. Count, mean and max are
    current whenever read; the percentiles are worked out again at most every `refresh_s` (a
    pass over the bins, about 20 us), so a snapshot of many busy keys stays cheap.
    """

    __slots__ = ("refresh_s", "_summary", "_due", "_counted")

    def __init__(self, refresh_s: float = 1.0) -> None:
        super().__init__(None)  # made at the first fold with a success in it
        self.refresh_s = refresh_s
        self._summary = LatencySummary()
        self._due = -math.inf
        self._counted = 0  # the count the percentiles were worked out at

    def _bin(self, values: list[float], top: float) -> None:
        bins = self._bins
        if bins is None:
            bins = self._bins = array("Q", bytes(8 * _KEY_BINS))
        last = _KEY_BINS - 1
        if min(values) > _KEY_FLOOR_MS:  # the usual case: a log each, mapped without a Python call
            for i in map(int, map(_KEY_PER_LOG.__mul__, map(_log, map(_KEY_PER_FLOOR.__mul__, values)))):
                bins[i if i < last else last] += 1
            return
        for ms in values:
            i = int(_log(ms * _KEY_PER_FLOOR) * _KEY_PER_LOG) if ms > _KEY_FLOOR_MS else 0
            bins[i if i < last else last] += 1

    def summary(self, now: float) -> LatencySummary:
        """Mean, p50, p90, p99, p99.9 (the upper edge of each one's bin, at most the largest
        seen) and max at `now` (seconds); the same object again while no answer came."""
        self.fold()
        last, count = self._summary, self._count
        due = now >= self._due and self._counted != count
        if (last.count == count and not due) or self._bins is None:
            return last
        if due:
            self._due, self._counted = now + self.refresh_s, count
            running = list(accumulate(self._bins))  # answers at or below each bin's top
            tops = []
            for q in _KEY_QS:  # nearest rank, as LatencyHistogram.quantiles
                i = bisect_left(running, max(1, int(q * count + 0.999999)))
                tops.append(min(_KEY_FLOOR_MS * math.exp(_KEY_LOG_RATIO * (i + 1)), self._max))
            p50, p90, p99, p999 = tops
        else:
            p50, p90, p99, p999 = last.p50, last.p90, last.p99, last.p999
        self._summary = LatencySummary(
            mean=self._total / count, p50=p50, p90=p90, p99=p99, max=self._max, p999=p999, count=count
        )
        return self._summary


class ErrorTable:
    """Attempts that did not succeed, by (status, kind, cause), with the last text of each.

    Bounded: after `distinct` groups, new ones count under one "other" group,
    so a server that puts a fresh id in every error cannot grow memory.
    """

    __slots__ = ("groups", "distinct")

    def __init__(self, distinct: int = 30):
        self.groups: dict[tuple[int | None, OutcomeKind, str], list] = {}
        self.distinct = distinct

    def add(
        self, status: int | None, kind: OutcomeKind, cause: str, text: str, key: str, at_s: float
    ) -> None:
        group = (status, kind, cause)
        row = self.groups.get(group)
        if row is None:
            if len(self.groups) >= self.distinct:
                group = (None, kind, "other")
                row = self.groups.get(group)
            if row is None:
                row = self.groups[group] = [0, "", "", 0.0]
        row[0] += 1
        row[1], row[2], row[3] = text, key, at_s

    def rows(self) -> tuple[ErrorRow, ...]:
        """Most frequent first."""
        ordered = sorted(self.groups.items(), key=lambda item: -item[1][0])
        return tuple(
            ErrorRow(status, kind, cause, count, text, key, round(at, 1))
            for (status, kind, cause), (count, text, key, at) in ordered
        )


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class PerSecond:
    """The run's per-second series: successes a second, and that second's p50 and p99
    latency (ms), the last `series_len` seconds of each."""

    __slots__ = ("tps", "p50", "p99", "latencies", "ok")

    def __init__(self, series_len: int):
        self.tps: deque[float] = deque(maxlen=series_len)
        self.p50: deque[float] = deque(maxlen=series_len)
        self.p99: deque[float] = deque(maxlen=series_len)
        self.latencies: list[float] = []  # this second's latencies (ms)
        self.ok = 0  # this second's successes

    def close(self) -> None:
        """Roll the series: this second's figures go in, a new second starts."""
        self.tps.append(float(self.ok))
        if self.latencies:
            values = sorted(self.latencies)
            self.p50.append(_pct(values, 0.5))
            self.p99.append(_pct(values, 0.99))
        else:
            self.p50.append(0.0)
            self.p99.append(0.0)
        self.latencies = []
        self.ok = 0


class QueueDepths:
    """Samples of the main and retry queues' depths: peaks and means."""

    __slots__ = ("main_peak", "dlq_peak", "samples", "main_sum", "dlq_sum")

    def __init__(self) -> None:
        self.main_peak = self.dlq_peak = 0
        self.samples = 0
        self.main_sum = self.dlq_sum = 0

    def sample(self, main: int, dlq: int) -> None:
        self.samples += 1
        self.main_sum += main
        self.dlq_sum += dlq
        if main > self.main_peak:
            self.main_peak = main
        if dlq > self.dlq_peak:
            self.dlq_peak = dlq


class Metrics:
    """Everything counted during a run. Updated by the engine only."""

    def __init__(self, series_len: int = 300):
        # requests
        self.generated = self.succeeded = self.expired = self.graveyard = self.shed = 0
        self.uncertain = 0  # writes that may or may not have happened (Ending.UNCERTAIN)
        # attempts
        self.sent = self.rejected_429 = self.rejected_other = self.failed = self.retried = 0
        self.failures: Counter[str] = Counter()
        self.latency = LatencyHistogram()  # send -> answer, successes
        self.latency_total = LatencyHistogram()  # arrival (or intended arrival) -> done, successes
        self.queue_wait = LatencyHistogram()  # arrival -> first send, every request sent
        self.errors = ErrorTable()
        self.per_second = PerSecond(series_len)
        self.depths = QueueDepths()

    def success(self, latency_ms: float, total_ms: float) -> None:
        self.succeeded += 1
        second = self.per_second
        second.ok += 1
        self.latency.add(latency_ms)
        self.latency_total.add(total_ms)
        second.latencies.append(latency_ms)

    def fail(self, cause: str) -> None:
        self.failed += 1
        self.failures[cause] += 1

    def close_second(self) -> None:
        """Roll the per-second series and bin the second's latencies; called once a second by
        the engine."""
        self.per_second.close()
        self.latency.fold()
        self.latency_total.fold()
        self.queue_wait.fold()

    def sample_depths(self, main: int, dlq: int) -> None:
        self.depths.sample(main, dlq)

    @property
    def tps_series(self) -> deque[float]:
        return self.per_second.tps

    @property
    def p50_series(self) -> deque[float]:
        return self.per_second.p50

    @property
    def p99_series(self) -> deque[float]:
        return self.per_second.p99

    @property
    def main_peak(self) -> int:
        return self.depths.main_peak

    @property
    def dlq_peak(self) -> int:
        return self.depths.dlq_peak

    @property
    def main_avg(self) -> float:
        d = self.depths
        return d.main_sum / d.samples if d.samples else 0.0

    @property
    def dlq_avg(self) -> float:
        d = self.depths
        return d.dlq_sum / d.samples if d.samples else 0.0
