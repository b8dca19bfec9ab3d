"""How many requests a key keeps in flight when the user pinned no number.

Little's law: a key that sends `rate` requests a second, each answered `rtt`
seconds later, has `rate x rtt` of them in flight on average. A fixed number
below that caps the key under its limit whatever the limiter allows (8 in
flight at round trips of 100 ms is at most 80 a second); a number far above
it piles requests onto a server that is slowing down, and on a server that our
own load slows (a busy box, a proxy) more in flight only makes every answer
later. So the size moves like TCP's window, within what the round trip needs:

- the round trip is measured as TCP measures its own (RFC 6298): a smoothed
  mean `srtt` and mean deviation `rttvar` of the answers' round trips (gain
  1/8 and 1/4). What the key needs is `rate x (srtt + 2 x rttvar)` plus the
  one being sent (paced sends have `rate x rtt` in flight, and two deviations
  above the mean reach about the longest round trips): once the key's limits
  hold it back, the size is never above that, nor ever above the ceiling
  (`engine.in_flight_max`);
- it grows only while it is what holds the key back: the key full (as many in
  flight as its size) with work waiting. Then it doubles per look when the
  key's limits would let it send now (a full bucket's burst: TCP's slow start,
  up to the ceiling), and grows by one when they would not; from `START`;
- answers slower than `SLOWER` times their usual round trip (the mean of the
  first answers, then a slow mean: gain 1/512, and 1/8192 from answers that
  queue, so a slowdown that lasts becomes the usual) are a server that queues:
  each look takes a share off the size, the more the slower they came;
- when timeouts, failed connections and 5xxs are more than `BAD_SHARE` of the
  recent answers (a mean of 1 per failure, gain 1/16: a stray 500 among many
  successes is not trouble), a failure halves the size, at most once per
  size's worth of answers as TCP halves once per round trip; successes win it
  back one request per size's worth of answers.

`InFlightSizing` is per key: `answered` runs for every answer (a few float
operations), `size` on the engine's ticker, ten times a second for every key,
never on a request's path.
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
_USUAL = 1.0 / 512.0
_USUAL_SLOWED = 1.0 / 8192.0
#: The usual round trip is the plain mean of this many first answers.
_WARM = 64
#: How many deviations of spread the size allows above the mean.
SPREAD_K = 2.0
#: Answers this many times slower than usual are a server that queues, not a longer path.
SLOWER = 1.5
#: A look moves the size up by at most this share of it, and while answers queue down by this
#: share of the way to where the slowdown says.
_GROW = 0.25
_SHRINK = 0.2
#: The share of failed answers (timeouts, failed connections, 5xx) above which a failure cuts.
BAD_SHARE = 0.1
_BAD_GAIN = 1.0 / 16.0


class InFlightSizing:
    """One key's in-flight size when none was pinned (see the module)."""

    __slots__ = ("ceiling", "srtt", "rttvar", "usual", "answers", "cap", "now", "bad", "since_cut")

    def __init__(self, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.srtt: float | None = None  # seconds; None until the first answer is measured
        self.rttvar = 0.0
        self.usual = 0.0
        self.answers = 0  # measured so far
        self.cap = float(self.ceiling)  # AIMD: halved by a failure, won back by successes
        self.now = float(min(START, self.ceiling))  # the size, moved a step per look
        self.bad = 0.0  # the recent share of failed answers
        self.since_cut = 0  # answers since the last halving

    @property
    def last(self) -> int:
        """The size last worked out."""
        return max(1, int(self.now))

    def answered(self, rtt_s: float, ok: bool) -> None:
        """One answer: `rtt_s` its round trip, `ok` False for a timeout, a failed connection
        or a 5xx (the server or the path is in trouble: fewer at once)."""
        self.since_cut += 1
        if not ok:
            self.bad += _BAD_GAIN * (1.0 - self.bad)
            if self.bad > BAD_SHARE and self.since_cut >= self.now:
                self.cap = max(1.0, min(self.cap, self.now) / 2.0)
                self.since_cut = 0
            return
        self.bad -= _BAD_GAIN * self.bad
        if self.cap < self.ceiling:
            self.cap = min(float(self.ceiling), self.cap + 1.0 / self.cap)
        srtt = self.srtt
        if srtt is None:
            self.srtt, self.rttvar, self.usual, self.answers = rtt_s, rtt_s / 2.0, rtt_s, 1
            return
        self.rttvar += _BETA * (abs(srtt - rtt_s) - self.rttvar)
        self.srtt = srtt = srtt + _ALPHA * (rtt_s - srtt)
        # The usual round trip: the mean of the first answers, then a slow mean that learns more
        # slowly still from answers that queue.
        self.answers = n = self.answers + 1
        usual = self.usual
        gain = 1.0 / n if n < _WARM else _USUAL if srtt <= SLOWER * usual else _USUAL_SLOWED
        self.usual = usual + gain * (srtt - usual)

    def size(self, rate: float, full: bool, room: bool = False) -> int:
        """Requests in flight for a key sending `rate` a second now (see the module). `full`:
        the key was found with as many in flight as its size while work waited; `room`: its
        limits would let it send now (a bucket's burst, a window with room), so the size is
        all that holds it back. One step per look: twice the size while full with room (as
        TCP's slow start), one more while full without, a share less while answers queue,
        and never above what the round trip needs at the key's rate once it has no room."""
        srtt = self.srtt
        now = self.now
        if srtt is not None and rate > 0.0 and math.isfinite(rate):
            usual = self.usual
            if srtt > SLOWER * usual:  # queueing: shrink with the slowdown instead of following it
                now -= _SHRINK * now * (1.0 - SLOWER * usual / srtt)
            elif full:
                now = now * 2.0 if room else now + 1.0
            if not room:
                now = min(now, math.ceil(rate * (srtt + SPREAD_K * self.rttvar)) + 1.0)
        self.now = now = max(1.0, min(now, self.cap, float(self.ceiling)))
        return int(now)
