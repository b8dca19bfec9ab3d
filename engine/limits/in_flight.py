"""How many requests a key keeps in flight when the user pinned no number.

Little's law: a key that sends `rate` requests a second, each answered `rtt`
seconds later, has `rate x rtt` of them in flight on average. A fixed number
below that caps the key under its limit whatever the limiter allows (8 in
flight at round trips of 100 ms is at most 80 a second); a number far above
it only piles requests onto a server that is slowing down. So the size follows
the key's own answers:

- the round trip is measured as TCP measures its own (RFC 6298): a smoothed
  mean `srtt` and mean deviation `rttvar` of the answers' round trips (gain
  1/8 and 1/4); the size is `rate x (srtt + 2 x rttvar)`, plus the one being
  sent. Paced sends have `rate x rtt` in flight at most when every answer takes
  the longest round trip; two deviations above the mean reach about there;
- answers that slow down past `SLOWER` times their usual round trip (a slower
  mean, gain 1/256: a few seconds of answers at 100 a second) are a server that queues: the size stops following them and
  shrinks as they slow further (the round trip counted is `SLOWER` times the
  usual one, scaled down by how far past that they came);
- when timeouts, failed connections and 5xxs are more than `BAD_SHARE` of the
  recent answers (a mean of 1 per failure, gain 1/16: a stray 500 among many
  successes is not trouble), a failure halves the size, at most once per
  size's worth of answers as TCP halves once per round trip; successes win it
  back one request per size's worth of answers (AIMD);
- it stays within 1 and the ceiling (`engine.in_flight_max`), and starts at
  `START` before the first answer is measured.

`InFlightSizing` is per key: `answered` runs for every answer (a few float
operations), `size(rate)` on the engine's ticker, ten times a second for every
key, never on a request's path.
"""

from __future__ import annotations

import math

#: The size before any round trip is measured (the old fixed default).
START = 8
#: RFC 6298's gains: the mean moves 1/8 and the deviation 1/4 of the way to each measurement.
_ALPHA = 0.125
_BETA = 0.25
#: The usual round trip moves 1/256 of the way: a slowdown shows as the mean leaving it, and
#: one that lasts becomes the usual.
_USUAL = 1.0 / 256.0
#: How many deviations of spread the size allows above the mean.
SPREAD_K = 2.0
#: Answers this many times slower than usual are a server that queues, not a longer path.
SLOWER = 2.0
#: The share of failed answers (timeouts, failed connections, 5xx) above which a failure cuts.
BAD_SHARE = 0.1
_BAD_GAIN = 1.0 / 16.0


class InFlightSizing:
    """One key's in-flight size when none was pinned (see the module)."""

    __slots__ = ("ceiling", "srtt", "rttvar", "usual", "cap", "last", "bad", "since_cut")

    def __init__(self, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.srtt: float | None = None  # seconds; None until the first answer is measured
        self.rttvar = 0.0
        self.usual = 0.0
        self.cap = float(self.ceiling)  # AIMD: halved by a failure, won back by successes
        self.last = min(START, self.ceiling)  # the size last worked out
        self.bad = 0.0  # the recent share of failed answers
        self.since_cut = 0  # answers since the last halving

    def answered(self, rtt_s: float, ok: bool) -> None:
        """One answer: `rtt_s` its round trip, `ok` False for a timeout, a failed connection
        or a 5xx (the server or the path is in trouble: fewer at once)."""
        self.since_cut += 1
        if not ok:
            self.bad += _BAD_GAIN * (1.0 - self.bad)
            if self.bad > BAD_SHARE and self.since_cut >= self.last:
                self.cap = max(1.0, min(self.cap, float(self.last)) / 2.0)
                self.since_cut = 0
            return
        self.bad -= _BAD_GAIN * self.bad
        if self.cap < self.ceiling:
            self.cap = min(float(self.ceiling), self.cap + 1.0 / self.cap)
        srtt = self.srtt
        if srtt is None:
            self.srtt, self.rttvar, self.usual = rtt_s, rtt_s / 2.0, rtt_s
            return
        self.rttvar += _BETA * (abs(srtt - rtt_s) - self.rttvar)
        self.srtt = srtt = srtt + _ALPHA * (rtt_s - srtt)
        self.usual += _USUAL * (srtt - self.usual)

    def size(self, rate: float) -> int:
        """Requests in flight for a key sending `rate` a second now (see the module)."""
        srtt = self.srtt
        if srtt is None or not rate > 0.0 or not math.isfinite(rate):
            size = min(START, self.ceiling)
        else:
            rtt = srtt + SPREAD_K * self.rttvar
            slower = srtt / self.usual if self.usual > 0.0 else 1.0
            if slower > SLOWER:  # queueing: shrink with the slowdown instead of following it
                rtt = (SLOWER * self.usual + SPREAD_K * self.rttvar) * SLOWER / slower
            size = min(self.ceiling, math.ceil(rate * rtt) + 1)
        size = max(1, min(size, int(self.cap)))
        self.last = size
        return size
