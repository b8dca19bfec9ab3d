"""Headroom: the margin added to every window for client/server timing noise.

The server stamps a request when it arrives, not when we send it. If one
request's trip to the server is slow and a request N sends later is fast, the
server sees the two closer together than we sent them. The headroom must
cover the spread of that one-way delay.

We only observe round trips. The spread of round-trip times (max - min over
the last `window_s` seconds) bounds the spread of both legs together;
assuming the jitter splits evenly between the legs (as NTP does), the one-way
spread is about half of it: `target = spread * jitter_share * safety`. The
seed instead used average latency x 1.1 clamped to 30..50 ms, which wastes
capacity on slow but steady links and still fails on jittery ones: the mean
says nothing about spread.

That estimate is the fallback. Better evidence arrives with every answer:
once request i is answered, its own round trip bounds how late the server
can have stamped it. With rtt_min the fastest round trip seen lately,
`d_in(i) - d_in_min <= rtt(i) - rtt_min` (the other leg can only have been
at or above its own minimum). So the slot request i holds frees at
`send(i) + W + (rtt(i) - rtt_min) + margin` (`extra_for`): a slow request
pushes its own slot back, a fast one frees it early. This is exact for
queueing spikes on the way in (which a symmetric split would under-cover),
and on symmetric jitter it costs the mean round-trip excess instead of
covering the worst case for every slot. When the jitter looks two-sided
(the mean round trip sits well inside the range) the per-request bound is
also capped by the symmetric estimate; one-sided tails keep it whole.
Requests not answered yet use the fallback.

Rules:
- widen at once when the evidence says so, or on a rejection (x1.5, at least
  +10 ms, once per burst: rejections of requests that were already in flight
  do not compound); a rejection also sets a floor the evidence cannot undercut;
- the initial value is only a prior: once `settle_s` seconds of evidence
  exist (and no rejection came first), the estimate replaces it at once;
- after that, narrow slowly (at most `narrow_ms_per_s`) when clean;
- with `rejection_budget == 0`, never narrow below the evidence or the floor:
  no probing. With a budget, after a clean stretch the floor and the share
  are walked down (probing) until a rejection; probing stops once the budget
  is spent.
"""

from __future__ import annotations

from collections import deque


class HeadroomController:
    """Learns and holds the headroom shared by every key of one target.

    Attributes:
        adaptive: False while a fixed value is set (live override).
        value_ms: the headroom in force now, in milliseconds.
        rejections: rejections seen (429s not caused by a blocked key).
        seen_min_ms / seen_max_ms: range of values in force during the run.
    """

    __slots__ = (
        "adaptive",
        "value_ms",
        "min_ms",
        "max_ms",
        "rejection_budget",
        "jitter_share",
        "safety",
        "narrow_ms_per_s",
        "settle_s",
        "rejections",
        "seen_min_ms",
        "seen_max_ms",
        "_buckets",
        "_bucket_end",
        "_bucket_lo",
        "_bucket_hi",
        "_lo",
        "_hi",
        "_first_t",
        "_target_ms",
        "_floor_ms",
        "_last_t",
        "_clean_since",
        "_probe",
        "_prior",
        "_hold_until",
        "margin_ms",
        "_mean_extra_ms",
        "_n",
        "_mean_rtt",
    )

    def __init__(
        self,
        *,
        initial_ms: float = 100.0,
        min_ms: float = 0.0,
        max_ms: float = 500.0,
        fixed_ms: float | None = None,
        rejection_budget: int = 0,
        jitter_share: float = 0.5,
        safety: float = 1.25,
        narrow_ms_per_s: float = 10.0,
        settle_s: float = 2.0,
        window_s: int = 10,
    ):
        self.min_ms, self.max_ms = min_ms, max_ms
        self.rejection_budget = rejection_budget
        self.jitter_share, self.safety = jitter_share, safety
        self.narrow_ms_per_s = narrow_ms_per_s
        self.settle_s = settle_s
        self.rejections = 0
        # (min, max) round trip per second for the last `window_s` seconds, plus
        # the running second: O(1) per sample at any request rate.
        self._buckets: deque[tuple[float, float]] = deque(maxlen=window_s)
        self._bucket_end = float("inf")  # the first answer starts the first one-second bucket
        self._bucket_lo = self._lo = float("inf")
        self._bucket_hi = self._hi = float("-inf")
        self._first_t: float | None = None
        self._target_ms: float | None = None  # evidence-based target, once known
        self._floor_ms = min_ms
        self._last_t: float | None = None
        self._clean_since: float | None = None
        self._probe = 1.0  # multiplier below 1 only while probing with a budget
        self._prior = True  # still on the initial guess
        self._hold_until = float("-inf")  # rejections before this belong to the last burst
        self.margin_ms = max(min_ms, 1.0)  # added to every per-request extra; grows on rejections
        self._mean_extra_ms: float | None = None  # moving mean of per-request extras
        self._n = 0  # answers seen
        self._mean_rtt = 0.0  # moving mean round trip (seconds)
        self.adaptive = fixed_ms is None
        self.value_ms = self._clamp(initial_ms if fixed_ms is None else fixed_ms)
        self.seen_min_ms = self.seen_max_ms = self.value_ms

    # -- reading
    def seconds(self) -> float:
        """The headroom in seconds (what the limiters read)."""
        return self.value_ms / 1000.0

    @property
    def target_ms(self) -> float | None:
        return self._target_ms

    @property
    def effective_ms(self) -> float:
        """What the windows carry on average now: the mean per-request extra,
        or the fallback (or the fixed value) while there is none."""
        if self.adaptive and self._mean_extra_ms is not None:
            return self._mean_extra_ms
        return self.value_ms

    def pace_seconds(self) -> float:
        """The headroom the even-pacing gap uses (the average, not the worst case)."""
        return self.effective_ms / 1000.0

    def extra_for(self, rtt_s: float, now: float) -> float | None:
        """The headroom (seconds) the slot of an answered request needs, or None
        to keep the fallback (fixed headroom, or no settled baseline yet).

        rtt_min only falls as samples accumulate, and an early, too high
        baseline would make extras too small: until `settle_s` seconds and
        100 answers have passed, an answered slot keeps at least the fallback
        in force then (so a later, narrower fallback cannot shrink it).
        Extras carry a margin of 1 ms plus 5% of the round-trip spread on top
        of any rejection-driven margin.
        """
        if not self.adaptive:
            return None
        if self._n < 100 or self._first_t is None or now - self._first_t < self.settle_s:
            return max(self.value_ms, (rtt_s - min(self._lo, rtt_s)) * 1000.0 + self.margin_ms) / 1000.0
        spread_ms = (self._hi - self._lo) * 1000.0
        extra_ms = (rtt_s - self._lo) * 1000.0 + self.margin_ms + 0.05 * spread_ms
        if self._target_ms is not None and self._mean_rtt - self._lo > 0.3 * (self._hi - self._lo):
            # Two-sided jitter (the mean sits inside the range, as when both legs
            # vary alike): one leg's spread is bounded by the symmetric estimate
            # too, and the smaller of two bounds holds. One-sided spikes (mean
            # near the minimum, a long tail: queueing on the way in) keep the
            # per-request bound, which the symmetric estimate would under-cover.
            extra_ms = min(extra_ms, max(self.value_ms, self._floor_ms))
        extra_ms = max(self.min_ms, min(self.max_ms, extra_ms))
        m = self._mean_extra_ms
        self._mean_extra_ms = extra_ms if m is None else m + 0.02 * (extra_ms - m)
        e = self._mean_extra_ms
        if e < self.seen_min_ms:
            self.seen_min_ms = e
        if e > self.seen_max_ms:
            self.seen_max_ms = e
        return extra_ms / 1000.0

    # -- control
    def set_fixed(self, ms: float) -> None:
        """Live override: hold exactly `ms` until set adaptive again."""
        self.adaptive = False
        self._set(max(0.0, float(ms)))

    def set_adaptive(self) -> None:
        self.adaptive = True

    # -- evidence
    def observe_rtt(self, rtt_s: float, now: float) -> None:
        """Record one round-trip time of an answered request."""
        self._n += 1
        self._mean_rtt = rtt_s if self._n == 1 else self._mean_rtt + 0.01 * (rtt_s - self._mean_rtt)
        if self._first_t is None:
            self._first_t = now
            self._bucket_end = now + 1.0
        if now >= self._bucket_end:
            self._roll(now)
        if rtt_s < self._bucket_lo:
            self._bucket_lo = rtt_s
        if rtt_s > self._bucket_hi:
            self._bucket_hi = rtt_s
        if rtt_s < self._lo or rtt_s > self._hi:
            # The spread just grew: act on it now, do not wait for the second to end.
            self._lo, self._hi = min(self._lo, rtt_s), max(self._hi, rtt_s)
            self._estimate()
        self._step(now)

    def _roll(self, now: float) -> None:
        self._buckets.append((self._bucket_lo, self._bucket_hi))
        self._bucket_lo, self._bucket_hi = float("inf"), float("-inf")
        while self._bucket_end <= now:
            self._bucket_end += 1.0
        self._lo = min(lo for lo, _ in self._buckets)
        self._hi = max(hi for _, hi in self._buckets)
        self._estimate()

    def _estimate(self) -> None:
        if self._hi >= self._lo:
            self._target_ms = (self._hi - self._lo) * 1000.0 * self.jitter_share * self.safety

    def observe_rejection(self, now: float) -> None:
        """A rate-limit rejection: the headroom was too small. Widen at once."""
        self.rejections += 1
        self._clean_since = now
        self._prior = False
        if not self.adaptive or now < self._hold_until:
            return
        widened = max(self.value_ms * 1.5, self.value_ms + 10.0)
        self._floor_ms = self._clamp(widened)
        self.margin_ms = min(self.max_ms, max(self.margin_ms * 1.5, self.margin_ms + 10.0))
        if self._probe < 1.0:
            self._probe = min(1.0, self._probe * 1.3)
        self._set(self._floor_ms)
        # Answers to requests already in flight may still be rejections of the
        # same burst; give them a round trip (generously) before widening again.
        self._hold_until = now + max(0.5, 2.0 * max(self._hi, 0.0))

    def _step(self, now: float) -> None:
        last, self._last_t = self._last_t, now
        if self._clean_since is None:
            self._clean_since = now
        if not self.adaptive or self._target_ms is None:
            return
        probing = self.rejection_budget > self.rejections
        if probing and now - self._clean_since > 10.0:
            # A clean stretch with budget left: try a little less.
            self._clean_since = now
            self._probe = max(0.5, self._probe * 0.95)
            self._floor_ms = self.min_ms + (self._floor_ms - self.min_ms) * 0.9
            self.margin_ms = max(self.min_ms, 1.0, self.margin_ms * 0.9)
        goal = self._clamp(max(self._target_ms * self._probe, self._floor_ms))
        if goal >= self.value_ms:
            self._set(goal)
        elif self._prior:
            if self._first_t is not None and now - self._first_t >= self.settle_s:
                self._prior = False
                self._set(goal)  # the initial value was a guess; settled evidence replaces it
            elif last is not None:
                self._set(max(goal, self.value_ms - self.narrow_ms_per_s * max(0.0, now - last)))
        elif last is not None:
            self._set(max(goal, self.value_ms - self.narrow_ms_per_s * max(0.0, now - last)))

    def _clamp(self, ms: float) -> float:
        return max(self.min_ms, min(self.max_ms, ms))

    def _set(self, ms: float) -> None:
        self.value_ms = ms
        if ms < self.seen_min_ms:
            self.seen_min_ms = ms
        if ms > self.seen_max_ms:
            self.seen_max_ms = ms
