"""Headroom: the margin added to every window for client/server timing noise.

The server stamps a request when it arrives, not when we send it. If one
request's trip to the server is slow and a request N sends later is fast, the
server sees the two closer together than we sent them. The headroom must
cover the spread of that one-way delay.

We only observe round trips. The spread of round-trip times (max - min over
the last few hundred answers) bounds the spread of both legs together; assuming the jitter splits
evenly between the legs (as NTP does), the one-way spread is about half of it.
`target = spread * jitter_share * safety`. The seed instead used average
latency x 1.1 clamped to 30..50 ms, which wastes capacity on slow but steady
links and still fails on jittery ones: the mean says nothing about spread.

Rules:
- widen at once when the evidence says so, or on any rejection (x1.5, at least
  +10 ms; a rejection also raises a floor the evidence cannot undercut);
- narrow slowly (at most `narrow_ms_per_s`) when clean;
- with `rejection_budget == 0`, never narrow below the evidence: no probing.
  With a budget, after a clean stretch the floor and the share are walked
  down (probing) until a rejection; probing stops once the budget is spent.
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
        "adaptive", "value_ms", "min_ms", "max_ms", "rejection_budget", "jitter_share",
        "safety", "narrow_ms_per_s", "min_samples", "rejections", "seen_min_ms",
        "seen_max_ms", "_samples", "_since_eval", "_target_ms", "_floor_ms", "_last_t",
        "_clean_since", "_probe",
    )

    def __init__(self, *, initial_ms: float = 100.0, min_ms: float = 0.0, max_ms: float = 500.0,
                 fixed_ms: float | None = None, rejection_budget: int = 0,
                 jitter_share: float = 0.5, safety: float = 1.25, narrow_ms_per_s: float = 10.0,
                 min_samples: int = 50, window: int = 500):
        self.min_ms, self.max_ms = min_ms, max_ms
        self.rejection_budget = rejection_budget
        self.jitter_share, self.safety = jitter_share, safety
        self.narrow_ms_per_s = narrow_ms_per_s
        self.min_samples = min_samples
        self.rejections = 0
        self._samples: deque[float] = deque(maxlen=window)
        self._since_eval = 0
        self._target_ms: float | None = None  # evidence-based target, once known
        self._floor_ms = min_ms
        self._last_t: float | None = None
        self._clean_since: float | None = None
        self._probe = 1.0  # multiplier below 1 only while probing with a budget
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

    # -- control
    def set_fixed(self, ms: float) -> None:
        """Live override: hold exactly `ms` (clamped to 0..max) until set adaptive."""
        self.adaptive = False
        self._set(max(0.0, min(float(ms), max(self.max_ms, float(ms)))))

    def set_adaptive(self) -> None:
        self.adaptive = True

    # -- evidence
    def observe_rtt(self, rtt_s: float, now: float) -> None:
        """Record one round-trip time of an answered request."""
        self._samples.append(rtt_s)
        self._since_eval += 1
        if self._since_eval >= 25 and len(self._samples) >= self.min_samples:
            self._since_eval = 0
            # The full range, not p99 - p1: a rejection needs only one early and
            # one late arrival, so the tails are exactly what matters.
            spread = max(self._samples) - min(self._samples)
            self._target_ms = spread * 1000.0 * self.jitter_share * self.safety
        self._step(now)

    def observe_rejection(self, now: float) -> None:
        """A rate-limit rejection: the headroom was too small. Widen at once."""
        self.rejections += 1
        self._clean_since = now
        if not self.adaptive:
            return
        widened = max(self.value_ms * 1.5, self.value_ms + 10.0)
        self._floor_ms = self._clamp(widened)
        if self._probe < 1.0:
            self._probe = min(1.0, self._probe * 1.3)
        self._set(self._floor_ms)

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
        goal = self._clamp(max(self._target_ms * self._probe, self._floor_ms))
        if goal >= self.value_ms:
            self._set(goal)
        elif last is not None:
            step = self.narrow_ms_per_s * max(0.0, now - last)
            self._set(max(goal, self.value_ms - step))

    def _clamp(self, ms: float) -> float:
        return max(self.min_ms, min(self.max_ms, ms))

    def _set(self, ms: float) -> None:
        self.value_ms = ms
        if ms < self.seen_min_ms:
            self.seen_min_ms = ms
        if ms > self.seen_max_ms:
            self.seen_max_ms = ms
