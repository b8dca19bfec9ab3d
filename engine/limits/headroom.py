"""Headroom: the margin added to every window for client/server timing noise.

The server stamps a request when it arrives, not when we send it, so the
headroom covers the spread of the one-way delay on the way in. It is learned
from round trips, server-time hints, a probe and remaining counts, widened on
a rejection, and narrowed on purpose only within a rejection budget. The
reasoning, the safety factors and the rules are in
docs/how-it-stays-under-the-limit.md ("Headroom in detail").
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

#: Probe samples needed before a probe's spread is believed.
PROBE_READY = 50
#: Probe samples taken back to back at the start (`client.PROBE_LANES` in flight), three times what makes
#: it ready: the range it caps every slot by stands on few samples at first, and widens as they come.
PROBE_WARM = 3 * PROBE_READY
#: Below this many samples, the probe's range is widened to about the 90th percentile of its
#: shortfall rather than its mean (`RangeTracker.sampled`): its cap holds every slot.
PROBE_FEW = 300
#: Below this many answers in the hints' window (10 s of 100/s), their range is widened as the
#: probe's is below `PROBE_FEW`: at 2.5 s (about 200 answers) the hinted cap covered a leg's
#: spread in 91 runs of 100, now 99 (tests/engine/test_headroom.py).
HINTS_FEW = 1000
#: Windows of probe samples the probe's range is taken over: a range over few samples comes
#: out short now and then, and the probe's cap holds every slot.
PROBE_WINDOWS = 6
#: Answers that settle the first guess before `settle_s` has passed (about a window's worth at
#: 100/s): the evidence then replaces the initial value, and the cap holds answered slots.
SETTLE_ANSWERS = 100
#: Share of answers that must carry a usable hint for their spread to count as the network's.
HINTED = 0.9

# Where the headroom comes from, as `HeadroomController.source` says it.
SOURCE_FIXED = "fixed"
SOURCE_RTT = "round trip"
SOURCE_HINTS = "hints"
SOURCE_PROBE = "probe"
SOURCE_BUDGET = "budget probing"
SOURCE_REMAINING = "remaining counts"


def hint_fits(rtt_s: float, server_s: float | None) -> bool:
    """A server-time report is usable when it is finite and 0 <= server_s <= rtt_s."""
    return server_s is not None and math.isfinite(server_s) and 0.0 <= server_s <= rtt_s


def network_rtt(rtt_s: float, server_s: float | None) -> float:
    """The network's share of a round trip: `rtt_s` less the server's reported time
    when that report fits (`hint_fits`), else the whole round trip.

    A report that does not fit is ignored, never clamped: clamping a too-large
    one to the round trip would call the network instant, which would make us
    send faster. Ignoring it keeps the round trip, which only widens.
    """
    if server_s is not None and 0.0 <= server_s <= rtt_s and math.isfinite(server_s):  # `hint_fits`, inline
        return rtt_s - server_s
    return rtt_s


class RangeTracker:
    """Min and max of samples over the last `window_s` whole seconds plus the running one,
    a moving mean and counts: O(1) per sample at any rate.

    The body: `body_hi` is the 99.9th percentile of the window's samples (of
    the last `BODY_SAMPLES`, recomputed once a second). A rare spike, a busy
    loop or one slow packet, hits one leg, not both: the range of round trips
    is then no longer twice a leg's, and the symmetric estimate holds only
    for the body. Samples above it pay their own way (`HeadroomController`).
    The 99th percentile cut real range from a smooth spread: of two uniform
    legs' sum its top 1% spans 11 ms of 80, half the body fell 2.5 ms short
    of a leg's spread, and a slot whose way in had been the longest came back
    a window early (virtual, jitter + Server-Timing on continuous delays,
    seeds 17-136: 8 runs of 120 drew a 429, the hinted cap at 37-39 ms
    against 40; the CLI, live on that row, drew one in 3 runs). At the 99.9th,
    with `HINTS_FEW`: 1 run of 120, the same efficiency (0.9608 against 0.9607).
    """

    BODY_Q = 0.999
    BODY_SAMPLES = 4096

    __slots__ = (
        "_buckets",
        "_end",
        "_b_lo",
        "_b_hi",
        "_b_n",
        "_old_n",
        "_recent",
        "_window_s",
        "lo",
        "hi",
        "body_hi",
        "lo_doubt",
        "lo_long",
        "_mins",
        "mean",
        "n",
        "last_t",
    )

    def __init__(self, window_s: int):
        self._buckets: deque[tuple[float, float, int]] = deque(maxlen=window_s)
        self._end = float("inf")  # the first sample starts the first one-second bucket
        self._b_lo = self.lo = float("inf")
        self._b_hi = self.hi = float("-inf")
        self._b_n = 0  # samples in the running second
        self._old_n = 0  # samples in the closed seconds still in the window
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.BODY_SAMPLES)
        self._window_s = window_s
        self.body_hi = float("-inf")  # the body's top; the range's top until a second has passed
        self.lo_doubt = 0.0  # how far above the true minimum `lo` may still be
        self._mins: deque[float] = deque(maxlen=6 * window_s)  # per-second minima, kept longer
        self.lo_long = float("inf")  # the minimum over six windows: closer to the true one
        self.mean = 0.0
        self.n = 0  # samples ever
        self.last_t = float("-inf")

    def add(self, x: float, now: float) -> bool:
        """Record `x` at `now`; True when the range changed (grew, or a second rolled over)."""
        self.n += 1
        # A plain average over the first 100 samples, then a moving one.
        self.mean += (x - self.mean) / (self.n if self.n < 100 else 100)
        self.last_t = now
        self._recent.append((now, x))
        changed = False
        if self._end == float("inf"):
            self._end = now + 1.0
        if now >= self._end:
            self._roll(now)
            changed = True
        self._b_n += 1
        if x < self._b_lo:
            self._b_lo = x
        if x > self._b_hi:
            self._b_hi = x
        if x < self.lo:
            self.lo = x
            changed = True
        if x > self.hi:
            self.hi = x
            changed = True
        if x < self.lo_long:
            self.lo_long = x
        if self._old_n == 0:  # no closed second yet: the range
            self.body_hi = self.hi
        return changed

    def _roll(self, now: float) -> None:
        self._mins.append(self._b_lo)
        self.lo_long = min(self._mins)
        self._buckets.append((self._b_lo, self._b_hi, self._b_n))
        self._b_lo, self._b_hi, self._b_n = float("inf"), float("-inf"), 0
        while self._end <= now:
            self._end += 1.0
        self.lo = min(b[0] for b in self._buckets)
        self.hi = max(b[1] for b in self._buckets)
        self._old_n = sum(b[2] for b in self._buckets)
        oldest = now - self._window_s - 1.0
        recent = sorted(x for t, x in self._recent if t >= oldest)
        if len(recent) >= 100:
            self.body_hi = recent[int(self.BODY_Q * (len(recent) - 1))]
        else:
            self.body_hi = self.hi
        # The smallest of n samples sits above the true minimum. Where the density
        # near the minimum grows like a^m, x(k) - min ~ (x(1) - min) * k^(1/m): for
        # m <= 2 (a sum of up to three delays: two legs and the server's time) the
        # gap to the 4th smallest is at least the doubt.
        self.lo_doubt = recent[3] - recent[0] if len(recent) >= 4 else 0.0

    def range_only(self) -> SecondsRange:
        """A `SecondsRange` that goes on from this tracker's samples: the same range from here."""
        seconds = deque(((lo, hi) for lo, hi, _ in self._buckets), maxlen=self._buckets.maxlen)
        return SecondsRange(seconds, self._end, (self._b_lo, self._b_hi), (self.lo, self.hi), self.n)

    @property
    def in_window(self) -> int:
        """Samples the range is made of."""
        return self._old_n + self._b_n

    @property
    def body_spread(self) -> float:
        return self.body_hi - self.lo if self.body_hi >= self.lo else 0.0

    def sampled(self, spread: float, few: int = 0) -> float:
        """`spread` widened for the samples it is made of. Where the density thins
        out linearly toward both edges (the sum of two uniform legs), n samples
        see a range short of the true one by about 1.25/sqrt(n) of it on average
        (n = 50: 18%, n = 1000: 4%); this undoes that much (at least 25 samples'
        worth). The shortfall's 90th percentile is about 1.85/sqrt(n) (n = 50:
        26%): below `few` samples the correction starts there and falls to the
        mean's by `few` (a range whose cap holds every slot, the probe's, came
        out short enough for a 429 in 6 runs of 80 on virtual time; 1 with this)."""
        n = self.in_window
        if not n:
            return 0.0
        c = 1.25 + 0.6 * (1.0 - n / few) if n < few else 1.25
        return spread / (1.0 - c / math.sqrt(max(n, 25)))

    @property
    def spread(self) -> float:
        return self.hi - self.lo if self.hi >= self.lo else 0.0

    def two_sided(self, body: bool = False) -> bool:
        """The mean sits well inside the range (both legs vary alike), not at a one-sided
        tail; with `body`, inside the body (spikes above it are judged apart)."""
        top = self.body_hi if body else self.hi
        return top > self.lo and self.mean - self.lo > 0.3 * (top - self.lo)


class SecondsRange:
    """A `RangeTracker`'s range alone: min and max over the last `window_s` whole seconds plus
    the running one, and the samples ever added; no mean, no body, no samples kept. For a
    figure that is only shown (`SpreadEvidence.raw`, the whole round trips' spread once hints
    part them from the network's): an answer costs about a third of `RangeTracker.add`."""

    __slots__ = ("_buckets", "_end", "_b_lo", "_b_hi", "lo", "hi", "n")

    def __init__(
        self,
        seconds: deque[tuple[float, float]],
        end: float,
        running: tuple[float, float],
        range_: tuple[float, float],
        n: int,
    ):
        """Go on from a tracker's state (`RangeTracker.range_only`): its closed seconds' ranges,
        the running second's end and range, the whole range and the samples so far."""
        self._buckets = seconds
        self._end, (self._b_lo, self._b_hi) = end, running
        (self.lo, self.hi), self.n = range_, n

    def add(self, x: float, now: float) -> None:
        """Record `x` at `now` (as `RangeTracker.add` does for its range)."""
        self.n += 1
        if now >= self._end:
            self._buckets.append((self._b_lo, self._b_hi))
            self._b_lo, self._b_hi = math.inf, -math.inf
            while self._end <= now:
                self._end += 1.0
            self.lo = min(b[0] for b in self._buckets)
            self.hi = max(b[1] for b in self._buckets)
        elif self._end == math.inf:  # the first sample starts the first one-second bucket
            self._end = now + 1.0
        if x < self._b_lo:
            self._b_lo = x
        if x > self._b_hi:
            self._b_hi = x
        if x < self.lo:
            self.lo = x
        if x > self.hi:
            self.hi = x

    @property
    def spread(self) -> float:
        return self.hi - self.lo if self.hi >= self.lo else 0.0


class BudgetProber:
    """Spends a rejection budget to find how narrow the headroom can go.

    `cap_ms` caps what the evidence asks for (None: not narrowing). Phases:
    "descend" (x0.8 per clean stretch, from the evidence at the start),
    "refine" (bisect, geometrically, between the last clean cap `hi` and the
    highest failing one `lo`, until they are within 20%; a stretch each),
    "hold" (5% above `hi`; a rejection there steps up 10%), "off" (budget
    under 3, or spent: no cap, for good). A failed trial goes back to `hi`
    itself: raised 10% and watched two stretches a step, as it was, the
    refining cost 0.0012 of sustained efficiency on the jitter + budget row
    (virtual, seeds 17-96) for 0.6 fewer rejections a run (1.6 against 2.2).
    Caps are absolute milliseconds: the round-trip evidence wobbles with its
    window, the server's window does not.

    Spending: a new trial starts only while half the budget and more than
    `RESERVE` rejections are left (the first rejection of a failed trial can
    bring one more that was already on its way); with one rejection left,
    probing ends (`retreat`). A budget under 3 therefore never probes: too
    little to try anything without risking more than it allows.
    """

    __slots__ = ("budget", "spent", "cap_ms", "phase", "hi", "lo", "_since", "_testing")

    DESCEND = 0.8
    RESERVE = 2

    def __init__(self, budget: int):
        self.budget = budget
        self.spent = 0
        self.cap_ms: float | None = None
        self.phase = "descend" if budget > self.RESERVE else "off"
        self.hi: float | None = None  # the lowest cap that has been clean for a whole stretch
        self.lo: float | None = None  # the highest cap that drew a rejection
        self._since: float | None = None  # when the current cap took effect
        self._testing = False  # the current cap is below `hi`, on trial

    @property
    def active(self) -> bool:
        return self.phase != "off"

    @property
    def narrowing(self) -> bool:
        return self.active and self.cap_ms is not None

    @property
    def may_try(self) -> bool:
        left = self.budget - self.spent
        return left > self.RESERVE and self.spent * 2 < self.budget

    @property
    def spent_out(self) -> bool:
        """Only the last rejection is left: stop probing for good."""
        return self.budget - self.spent <= 1

    def step(self, now: float, stretch_s: float, evidence_ms: float) -> None:
        """Called with every answer once the evidence is settled: after a clean stretch, move on."""
        if self.phase in ("off", "hold"):
            return
        if self.cap_ms is None:
            self.hi = evidence_ms
            self._try(evidence_ms * self.DESCEND, now)
            return
        assert self._since is not None and self.hi is not None
        if now - self._since < stretch_s:
            return
        if self._testing:
            self.hi = self.cap_ms  # clean for a whole stretch
            self._testing = False
        if not self.may_try:
            self._hold()  # half the budget, or all but the reserve, is spent: no more trials
        elif self.phase == "descend":
            self._try(self.hi * self.DESCEND, now)
        else:  # refine
            lo = self.lo if self.lo is not None else self.hi * self.DESCEND
            if self.hi / lo <= 1.2:
                self._hold()
            else:
                self._try(math.sqrt(self.hi * lo), now)

    def rejected(self, now: float) -> None:
        """The first rejection of a burst, while narrowing: back to the last clean cap."""
        if not self.narrowing:
            return
        assert self.cap_ms is not None and self.hi is not None
        if self._testing:
            # Back to the last clean cap (a hold there that draws one steps up 10%).
            self.lo = self.cap_ms if self.lo is None else max(self.lo, self.cap_ms)
            self.cap_ms = self.hi
            self._testing = False
            if self.phase != "hold":
                self.phase = "refine"
        else:  # a cap that had been clean: it was not, quite
            self.hi = self.cap_ms = self.cap_ms * 1.1
            if self.phase == "descend":
                self.phase = "refine"
        self._since = now

    def retreat(self) -> None:
        """The whole budget is spent: back to the evidence for good."""
        self.phase, self.cap_ms, self._testing = "off", None, False

    def _try(self, cap_ms: float, now: float) -> None:
        self.cap_ms = cap_ms
        self._testing = self.hi is None or cap_ms < self.hi
        self._since = now

    def _hold(self) -> None:
        self.phase = "hold"
        self._testing = False
        if self.hi is not None:
            self.cap_ms = self.hi * 1.05


class RemainingJudge:
    """Narrowing from the server's remaining counts, on round-trip evidence only (a direct
    estimate, from hints or a probe, is the network's spread and is not narrowed).

    A stretch in which the remaining count never reached 0 (and nothing was
    rejected) had room for a whole request in every window: the factor steps
    down x0.9. A 0 in the stretch after such a step takes the step back and
    ends this narrowing for the run; a 0 with nothing to take back means
    nothing (windows fill at full speed). Inert until answers carry counts.
    """

    __slots__ = ("factor", "done", "_since", "_zero", "_seen", "_stepped")

    def __init__(self) -> None:
        self.factor = 1.0
        self.done = False
        self._since: float | None = None
        self._zero = False
        self._seen = 0
        self._stepped = False

    def observe(self, remaining: int) -> None:
        self._seen += 1
        if remaining <= 0:
            self._zero = True
            if self._stepped and not self.done:
                self.factor = min(1.0, self.factor / 0.9)
                self.done = True

    def rejected(self) -> None:
        if self.factor < 1.0:
            self.factor = min(1.0, self.factor / 0.9)
        self.done = True

    def stop(self) -> None:
        """No more narrowing this run, and none in force."""
        self.factor, self.done = 1.0, True

    def step(self, now: float, stretch_s: float) -> None:
        if self.done:
            return
        if self._since is None:
            self._since = now
            return
        if now - self._since < stretch_s:
            return
        self._stepped = self._seen >= 50 and not self._zero
        if self._stepped:
            self.factor = max(0.3, self.factor * 0.9)
        self._since, self._zero, self._seen = now, False, 0


#: A request out this many typical round trips is overdue (`SpreadEvidence.overdue_s`): should
#: its slot's time come while it is still out, the slot is held until it ends
#: (`limiter._Sliding`); out over half a window too, its answer is late and keeps its own bound
#: whole (`HeadroomController.extra_for`).
OVERDUE_ROUND_TRIPS = 4.0
#: The time the typical round trip moves over (`SpreadEvidence.typical`).
TYPICAL_S = 10.0
#: The network's recent round trip this share of its body's spread above its usual level is a
#: queue (`SpreadEvidence.congested`): jitter alone (two uniform legs) moves it about 4% of the
#: spread, one standard deviation, so jitter reaches the mark about never.
CONGESTED_SHARE = 0.25
#: The network's recent round trip moves this share toward each answer's (`congested`): about
#: the last 16 answers. A mean of the last 100 rose past the mark only once a queue's answers
#: were most of them; a 100 ms stall at 1,000 answers a second never got it there.
RECENT_SHARE = 1.0 / 16.0
#: Capped slots kept should the network turn out to be queueing (`HeadroomController._uncap`).
CAPPED_KEPT = 4096
#: The even pace's gap, as a share of its usual, while the headroom stands on measurement
#: (`HeadroomController.measured`: the server's own time bounding each answered slot, a probe
#: of the network, or a rejection budget being spent to find it; `HeadroomNow.pace_scale`).
#: There a pace at 0.9 of the even gap held back sends the windows allowed, for no 429 it
#: saved: 0.0016 and 0.0031 of the sustained rate on the two hinted rows on virtual time (seeds
#: 17-26), 0.003-0.006 live, and 0.002-0.003 live on the probe and budget rows. About half the
#: gap still keeps a window's sends from going at once. A headroom that is a guess (round trips
#: alone, a limit learned from 429s) keeps the whole pace: on a key another user shares, a
#: shorter one drew a third more 429s for less of what they left (virtual, seeds 17-26).
MEASURED_PACE = 0.55


class SpreadEvidence:
    """What the headroom is learned from, and the symmetric estimate it gives.

    Round trips whole (`raw`) and less any usable server time (`net`), the
    probe's round trips (`probe`), how many answers carry a usable hint; from
    them `target_ms`, the fallback headroom (`estimate`), and where it comes
    from (`target_source`: round trip, hints or probe).
    """

    __slots__ = (
        "net",
        "raw",
        "probe",
        "server_mean",
        "hint_share",
        "hints_used",
        "hints_ignored",
        "first_t",
        "jitter_share",
        "safety",
        "direct_safety",
        "target_ms",
        "target_direct",
        "target_source",
        "typical",
        "typical_n",
        "typical_t",
        "judged_by",
        "recent_net",
    )

    def __init__(self, window_s: int, jitter_share: float, safety: float, direct_safety: float):
        self.net = RangeTracker(window_s)  # round trips less usable server time
        # Whole round trips: the same tracker as `net` until an answer's server time is first
        # used (until then both see the same samples), so an answer costs one `add`, not two.
        self.raw: RangeTracker | SecondsRange = self.net
        self.probe = RangeTracker(PROBE_WINDOWS * window_s)  # the probe's round trips: fewer, kept longer
        self.server_mean: float | None = None  # moving mean of usable server time (s)
        self.hint_share = 0.0  # moving share of answers with a usable hint
        self.hints_used = self.hints_ignored = 0
        self.first_t: float | None = None  # the first answer's time
        self.jitter_share, self.safety, self.direct_safety = jitter_share, safety, direct_safety
        self.target_ms: float | None = None  # evidence-based target, once known
        self.target_direct = False  # the target is the network's own spread
        self.target_source = SOURCE_RTT
        # The typical whole round trip, for `overdue_s`: a plain mean of the first 100, then one
        # moving over `TYPICAL_S` of time, not of answers (at 5,000 answers a second, 300 taking
        # a second moved a mean of the last 100 to a second within the burst).
        self.typical: float | None = None
        self.typical_n = 0
        self.typical_t = 0.0
        self.judged_by: float | None = None  # the typical before the latest answer (`late`)
        self.recent_net = 0.0  # the network's round trip over the last few answers (`congested`)

    def late(self, rtt_s: float, late_s: float) -> bool:
        """Whether the latest answer, out `rtt_s`, was late: out over `late_s` (half a window)
        and overdue, out `OVERDUE_ROUND_TRIPS` typical round trips as they were before it
        (after a quiet spell it sets the typical nearly alone, and must not judge itself)."""
        typical = self.judged_by
        return rtt_s > late_s and typical is not None and rtt_s > OVERDUE_ROUND_TRIPS * typical

    def overdue_s(self) -> float:
        """How long a request may be out before it is overdue; inf before the first answer."""
        typical = self.typical
        return OVERDUE_ROUND_TRIPS * typical if typical is not None else math.inf

    def congested(self) -> bool:
        """With hints, whether the network's recent round trips (`recent_net`, about the last
        16) sit well above their usual level (`typical` less the server's mean time): a queue on the
        way, not jitter, whose shift the legs need not share (a server's queue before it
        stamps a request is all on the way in), so no answered slot takes the symmetric cap."""
        typical, server = self.typical, self.server_mean
        if self.target_source != SOURCE_HINTS or typical is None or server is None:
            return False
        return self.recent_net > typical - server + CONGESTED_SHARE * self.net.body_spread

    def observe(
        self, rtt_s: float, now: float, server_s: float | None, last_t: float | None, late_s: float = math.inf
    ) -> None:
        """One answer: its round trip, and the server time it reported, if any (`hint_fits`).
        `last_t` is when the controller last stepped (the probe's freshness is judged by it).

        A late answer (`late`: overdue, and out over `late_s`, half a window) is kept
        out of the spreads: its slot was held for it and keeps its own bound
        (`HeadroomController.extra_for`); in the spreads it would widen every slot for as long
        as they remember it (a SYN sent twice is not the network's jitter). An overdue answer
        back sooner stays in: a one-sided tail is what keeps such spikes' own bounds."""
        typical = self.judged_by = self.typical
        # The typical round trip (inline: this runs for every answer).
        n = self.typical_n = self.typical_n + 1
        if typical is None:
            self.typical = rtt_s
        else:
            share = 1.0 / n if n <= 100 else (now - self.typical_t) / TYPICAL_S
            self.typical = typical + (share if share < 1.0 else 1.0) * (rtt_s - typical)
        self.typical_t = now
        if rtt_s > late_s and self.late(rtt_s, late_s):  # the first test inline: most are not
            return  # (`HeadroomController.extra_for` gives it its own bound)
        usable = False
        if server_s is not None:
            usable = 0.0 <= server_s <= rtt_s and math.isfinite(server_s)  # `hint_fits`, inline
            if usable:
                self.hints_used += 1
                m = self.server_mean
                self.server_mean = server_s if m is None else m + 0.01 * (server_s - m)
            else:
                self.hints_ignored += 1
        # A plain share over the first 100 answers, then a moving one (as `RangeTracker.mean`):
        # a moving share from 0 took 230 answers, 2-3 s, to believe hints on every answer.
        n = self.net.n + 1
        self.hint_share += ((1.0 if usable else 0.0) - self.hint_share) / (n if n < 100 else 100)
        net = rtt_s - server_s if usable and server_s is not None else rtt_s
        self.recent_net = net if n == 1 else self.recent_net + RECENT_SHARE * (net - self.recent_net)
        if self.first_t is None:
            self.first_t = now
        raw = self.raw
        if usable and raw is self.net:  # the first hint: from now on the two differ
            raw = self.raw = self.net.range_only()  # read for its range alone (`rtt_spread_ms`)
        if raw is not self.net:
            raw.add(rtt_s, now)
        if self.net.add(net, now):
            self.estimate(last_t)

    def observe_network(self, rtt_s: float, now: float, last_t: float | None) -> None:
        """One probe round trip (the network's alone, on its own connection)."""
        if not (rtt_s >= 0 and math.isfinite(rtt_s)):
            return
        if self.probe.add(rtt_s, now) or self.probe.n == PROBE_READY:
            self.estimate(last_t)

    def probe_ready(self, last_t: float | None) -> bool:
        p = self.probe
        return p.n >= PROBE_READY and (last_t is None or last_t - p.last_t < 5.0)

    def estimate(self, last_t: float | None) -> None:
        """Work out `target_ms` from the spreads: the narrowest well-founded one."""
        net = self.net
        if net.hi < net.lo:
            return
        direct = self.hint_share >= HINTED
        share = self.jitter_share
        if direct:
            target = net.sampled(net.body_spread, HINTS_FEW) * 1000.0 * share * self.direct_safety
        else:
            # The whole range: with server time in the round trips, a spike may be
            # either, and the wider estimate is the safe one.
            target = net.spread * 1000.0 * share * self.safety
        source = SOURCE_HINTS if direct else SOURCE_RTT
        if self.probe_ready(last_t):
            # The probe's whole range: its samples are few, and the traffic's
            # slots are all capped by it (its round trips carry server time).
            probed = self.probe.sampled(self.probe.spread, PROBE_FEW) * 1000.0 * share * self.direct_safety
            if probed < target:
                target, source, direct = probed, SOURCE_PROBE, True
        self.target_ms, self.target_source, self.target_direct = target, source, direct


class HeadroomNow:
    """The headroom's two figures in seconds, as the limiters read them at every decision
    (`limiter.HeadroomFigures`): for a slot not answered yet, and for the even pace's gap.
    Plain attributes the controller sets when they change, read without a call. And when a
    request still out is overdue (`overdue_s`), from the round trips `evidence` has seen."""

    __slots__ = ("headroom_now_s", "pace_now_s", "pace_scale", "evidence")

    def __init__(self, seconds: float, evidence: SpreadEvidence | None = None):
        self.headroom_now_s = self.pace_now_s = seconds
        self.pace_scale = 1.0  # `MEASURED_PACE` while the headroom stands on measurement
        self.evidence = evidence

    def overdue_s(self) -> float:
        """`SpreadEvidence.overdue_s`; inf without evidence (a test's figures)."""
        return self.evidence.overdue_s() if self.evidence is not None else math.inf


def _widen(stamps, extra_s: float) -> None:
    """Answered `stamps` hold their slots at least `extra_s` past their window (never less)."""
    for stamp in stamps:
        if stamp.extra is not None and stamp.extra < extra_s:
            stamp.extra = extra_s


class HeadroomController:
    """Learns and holds the headroom shared by every key of one target.

    Attributes:
        adaptive: False while a fixed value is set (live override).
        value_ms: the headroom in force now, in milliseconds.
        rejections: rejections seen (429s not caused by a blocked key); with a
            budget, what probing spent.
        seen_min_ms / seen_max_ms: range of values in force during the run.
        hints_used / hints_ignored: answers whose server-time report was used,
            and reports that did not fit their round trip (ignored).
        budget: the rejection-budget prober (`BudgetProber`).
        evidence: the spreads the headroom is learned from, and their
            estimate (`SpreadEvidence`).
        figures: what the limiters read per decision, in seconds (`HeadroomNow`).
    """

    __slots__ = (
        "adaptive",
        "value_ms",
        "figures",
        "min_ms",
        "max_ms",
        "rejection_budget",
        "narrow_ms_per_s",
        "settle_s",
        "bound_settle_s",
        "policy_window_s",
        "rejections",
        "seen_min_ms",
        "seen_max_ms",
        "margin_ms",
        "budget",
        "evidence",
        "_floor_ms",
        "_last_t",
        "_prior",
        "_direct_seen",
        "_hold_until",
        "_mean_extra_ms",
        "_remaining",
        "_trial",
        "_capped",
        "_early_slots",
        "_counted_at",
    )

    def __init__(
        self,
        *,
        initial_ms: float = 100.0,
        min_ms: float = 1.0,  # as engine.headroom_min_ms: timers have about 1 ms grain
        max_ms: float = 500.0,
        fixed_ms: float | None = None,
        rejection_budget: int = 0,
        jitter_share: float = 0.5,
        safety: float = 1.25,
        direct_safety: float = 1.05,
        narrow_ms_per_s: float = 10.0,
        settle_s: float = 2.0,
        bound_settle_s: float = 5.0,
        window_s: int = 10,
        policy_window_s: float = 1.0,
    ):
        self.min_ms, self.max_ms = min_ms, max_ms
        self.rejection_budget = rejection_budget
        self.narrow_ms_per_s = narrow_ms_per_s
        self.settle_s = settle_s
        self.bound_settle_s = max(settle_s, bound_settle_s)  # per-request bounds need a trusted minimum
        self.policy_window_s = policy_window_s  # a change in headroom shows a window later
        self.rejections = 0
        self.budget = BudgetProber(rejection_budget)
        self.evidence = SpreadEvidence(window_s, jitter_share, safety, direct_safety)
        self._floor_ms = min_ms
        self._last_t: float | None = None
        self._prior = True  # still on the initial guess
        self._direct_seen = False  # a direct estimate (hints, probe) has replaced the first one
        self._hold_until = float("-inf")  # rejections before this belong to the last burst
        self.margin_ms = max(min_ms, 1.0)  # added to every per-request extra; grows on rejections
        self._mean_extra_ms: float | None = None  # moving mean of per-request extras
        self._remaining = RemainingJudge()
        self._trial: deque[tuple[float, Any, float]] = (
            deque()
        )  # (when, stamps, whole extra ms) narrowed by a trial
        # (when, stamps, whole extra s) of the latest slots that took the symmetric cap (`_uncap`):
        # more than a typical round trip's answers at thousands a second
        self._capped: deque[tuple[float, Any, float]] = deque(maxlen=CAPPED_KEPT)
        self._counted_at: float | None = None  # when the last rejection was counted from its answer
        # (when, stamps, round trip, server time) of answers in the first seconds (`_rebound`)
        self._early_slots: deque[tuple[float, Any, float, float | None]] = deque()
        self.adaptive = fixed_ms is None
        self.value_ms = self._clamp(initial_ms if fixed_ms is None else fixed_ms)
        self.seen_min_ms = self.seen_max_ms = self.value_ms
        self.figures = HeadroomNow(self.value_ms / 1000.0, self.evidence)

    def _publish(self) -> None:
        """What the limiters read per decision (`figures`): `seconds()` and `pace_seconds()`,
        set here whenever they change."""
        figures = self.figures
        figures.headroom_now_s = self.value_ms / 1000.0
        mean = self._mean_extra_ms
        figures.pace_now_s = (mean if self.adaptive and mean is not None else self.value_ms) / 1000.0
        figures.pace_scale = MEASURED_PACE if self.adaptive and self.measured() else 1.0

    # -- reading
    def measured(self) -> bool:
        """Whether the headroom stands on measurement, not a guess: the server's own time on
        most answers, a probe of the network, or a rejection budget spent to find it."""
        source = self.evidence.target_source
        return source == SOURCE_HINTS or source == SOURCE_PROBE or self.budget.active

    def seconds(self) -> float:
        """The headroom in seconds (what the limiters read)."""
        return self.figures.headroom_now_s

    @property
    def target_ms(self) -> float | None:
        return self.evidence.target_ms

    @property
    def effective_ms(self) -> float:
        """What the windows carry on average now: the mean per-request extra,
        or the fallback (or the fixed value) while there is none."""
        if self.adaptive and self._mean_extra_ms is not None:
            return self._mean_extra_ms
        return self.value_ms

    def pace_seconds(self) -> float:
        """The headroom the even-pacing gap uses (the average, not the worst case):
        `effective_ms` in seconds."""
        return self.figures.pace_now_s

    @property
    def narrowing(self) -> bool:
        """Probing (budget or remaining counts) holds the headroom below the evidence."""
        return self.budget.narrowing or self._remaining.factor < 1.0

    @property
    def source(self) -> str:
        """Where the headroom in force comes from: "fixed", "round trip", "hints", "probe",
        "budget probing" or "remaining counts"."""
        if not self.adaptive:
            return SOURCE_FIXED
        if self.budget.narrowing:
            return SOURCE_BUDGET
        if self._remaining.factor < 1.0:
            return SOURCE_REMAINING
        return self.evidence.target_source

    @property
    def rejections_spent(self) -> int:
        return self.rejections

    @property
    def rtt_spread_ms(self) -> float | None:
        """The spread of whole round trips (network and server time together)."""
        return self.evidence.raw.spread * 1000.0 if self.evidence.raw.n else None

    @property
    def network_spread_ms(self) -> float | None:
        """The network's own round-trip spread, where known (hints on nearly every answer, or a ready probe)."""
        if self.evidence.net.n and self.evidence.hint_share >= HINTED:
            return self.evidence.net.spread * 1000.0
        if self.evidence.probe_ready(self._last_t):
            return self.evidence.probe.spread * 1000.0
        return None

    @property
    def server_time_ms(self) -> float | None:
        """The mean server time the hints report, where they are used."""
        return None if self.evidence.server_mean is None else self.evidence.server_mean * 1000.0

    @property
    def hints_used(self) -> int:
        return self.evidence.hints_used

    @property
    def hints_ignored(self) -> int:
        return self.evidence.hints_ignored

    def extra_for(
        self, rtt_s: float, now: float, server_s: float | None = None, before_s: float = 0.0
    ) -> float | None:
        """The headroom (seconds) the slot of an answered request needs, or None
        (`bound_for`, without the bound it would have had uncapped)."""
        return self.bound_for(rtt_s, now, server_s, before_s)[0]

    def bound_for(
        self, rtt_s: float, now: float, server_s: float | None = None, before_s: float = 0.0
    ) -> tuple[float | None, float | None]:
        """(extra, whole): the headroom (seconds) the slot of an answered request needs, or None
        to keep the fallback (fixed headroom, or no settled baseline yet).

        `server_s` is the server's own account of its time, if it gave one;
        it counts only when it fits the round trip (`network_rtt`).
        rtt_min only falls as samples accumulate, and an early, too high
        baseline would make extras too small: until `bound_settle_s` seconds
        and 100 answers have passed, an answered slot keeps at least the
        fallback in force then (so a later, narrower fallback cannot shrink
        it), and at most the symmetric cap once that stands on 100 answers or
        a ready probe (the cap needs no minimum); after that the minimum is
        the one over six windows. Extras carry
        a margin of 1 ms plus 5% of the round-trip spread, or the doubt about
        the minimum if more (`RangeTracker.lo_doubt`), on top of any
        rejection-driven margin.

        `before_s`: the part of the round trip spent on our side before the exchange began (the
        attempt waiting for a busy loop). All of it was on the way in, so it is added whole and
        never capped: the symmetric cap holds for the network's legs, not for a stall of ours
        (way-in stalls of 80 ms five times a second, 10 keys x 100/1s with Server-Timing,
        virtual: 1-6 429s in 20 s with it capped, none on round trips alone).
        """
        if not self.adaptive:
            return None, None
        net = network_rtt(rtt_s, server_s)
        before = before_s if 0.0 < before_s < net else 0.0
        net -= before
        before_ms = before * 1000.0
        ev = self.evidence
        tracker = ev.net
        lo = tracker.lo_long
        spread_ms = tracker.spread * 1000.0
        cap = self._cap_ms(spread_ms)
        # A late answer, overdue (`HeadroomNow`) and out over half a window, keeps its own bound
        # whole: it may have reached the server a second late (a SYN sent twice), which no
        # split of the round trip covers, and its slot may have been held for it. (An overdue
        # answer back sooner, a 20 s LLM answer in a minute's window, is judged as any other.)
        late = ev.late(rtt_s, 0.5 * self.policy_window_s)
        capped = (net <= tracker.body_hi or self._capped_whole()) and not late
        early = tracker.n < SETTLE_ANSWERS or self._early(now)
        if early:
            bound_ms = max(self.value_ms, (net - min(lo, net)) * 1000.0 + self.margin_ms)
            # The symmetric estimate bounds a leg without the minimum (`_cap_ms`), once it
            # stands on 100 answers or a ready probe.
            capped = capped and (tracker.n >= SETTLE_ANSWERS or ev.target_source == SOURCE_PROBE)
        else:
            bound_ms = (net - lo) * 1000.0 + self._margin(spread_ms)
        whole_ms = None
        if cap is not None and bound_ms > cap and capped:
            # Above the body (a spike) an answer keeps its own bound: a spike hits one
            # leg, and the symmetric estimate does not cover it (RangeTracker). So does
            # every answer while the network queues (`SpreadEvidence.congested`), and the
            # slots capped just before that showed take theirs back (`_uncap`).
            if ev.congested():
                self._uncap(now)
            else:
                whole_ms, bound_ms = bound_ms, cap
        if early or late:  # late: neither the most a headroom may be nor a part of the pace's mean
            whole = None if whole_ms is None else (whole_ms + before_ms) / 1000.0
            return (bound_ms + before_ms) / 1000.0, whole
        extra_ms = self._clamp(bound_ms + before_ms)
        whole = None if whole_ms is None else self._clamp(whole_ms + before_ms) / 1000.0
        m = self._mean_extra_ms
        e = self._mean_extra_ms = extra_ms if m is None else m + 0.02 * (extra_ms - m)
        self.figures.pace_now_s = e / 1000.0  # adaptive here: the pace follows the mean (`_publish`)
        if e < self.seen_min_ms:
            self.seen_min_ms = e
        if e > self.seen_max_ms:
            self.seen_max_ms = e
        return extra_ms / 1000.0, whole

    def let_go(self, stamps, now: float, gave_up: bool = False) -> None:
        """The slots of an attempt that ended with no answer (or was stopped): it may have
        reached the server at any moment until now. Out longer than the fallback, a slot keeps
        that long; else the fallback still applies.

        `gave_up`: the client gave up at the attempt's deadline (a timeout). The request may
        still be on its way (written, then held up in a queue the client cannot see) and reach
        the server after now, so its slot is held as if it were sent now: the fallback past
        the deadline. Held only until the deadline, such requests drew 429s (virtual, 10 keys
        x 100/1s, every send late by a second in four moments of 100 ms, a deadline of 0.95-1 s:
        7 429s in 9 runs with Server-Timing, none held so)."""
        fallback = self.figures.headroom_now_s
        for stamp in stamps:
            stamp.out = False
            held = now - stamp.t
            if gave_up:
                stamp.extra = held + fallback
            elif stamp.extra is None and held > fallback:
                stamp.extra = held

    def assign(
        self, stamps, rtt_s: float, now: float, server_s: float | None = None, before_s: float = 0.0
    ) -> None:
        """Give the slots of an answered request their headroom (`extra_for`).

        While the budget prober holds a narrower cap, the slots it narrowed
        are remembered for a window: if the trial draws a rejection, they are
        widened back at once (`_rewiden`), so sends not made yet never go out
        at the failed value.
        """
        extra, whole = self.bound_for(rtt_s, now, server_s, before_s)
        for stamp in stamps:
            stamp.extra = extra
            stamp.out = False
        if whole is not None:  # kept should the network turn out to be queueing (`_uncap`)
            self._capped.append((now, stamps, whole))
        early = self._early_slots
        if extra is not None and self._early(now):
            early.append((now, stamps, rtt_s, server_s))
            horizon = now - self.policy_window_s - 2.0 * max(self.evidence.net.hi, 0.0)
            while early[0][0] < horizon:
                early.popleft()
        elif early:
            early.clear()  # past the first seconds: no guess left to replace
        if extra is None or not self.budget.narrowing:
            return
        net = network_rtt(rtt_s, server_s)
        spread_ms = self.evidence.net.spread * 1000.0
        whole = (net - self.evidence.net.lo_long) * 1000.0 + self._margin(spread_ms)
        if whole > extra * 1000.0:
            trial = self._trial
            trial.append((now, stamps, whole))
            horizon = now - self.policy_window_s - 2.0 * max(self.evidence.net.hi, 0.0)
            while trial and trial[0][0] < horizon:
                trial.popleft()

    def _early(self, now: float) -> bool:
        """Within the first `bound_settle_s` seconds of answers (or before the first)."""
        first_t = self.evidence.first_t
        return first_t is None or now - first_t < self.bound_settle_s

    def _rebound(self, now: float) -> None:
        """The first guess was just replaced: slots answered under it, and not free yet, take
        the bound the evidence gives them now, as an answer arriving now would. Their extras
        held at least the guess (100 ms at first, less 10 ms a second); kept, each was reused
        that much late (virtual, jitter + Server-Timing: pairs of arrivals starting in the
        second second scored 0.937 of sustained efficiency, 0.954 with this, 0.96 later on).
        Also called when a direct estimate (hints, a ready probe) first replaces the round
        trips' one."""
        early = self._early_slots
        if self._early(now):
            for _t, stamps, rtt_s, server_s in early:
                extra, whole = self.bound_for(rtt_s, now, server_s)
                for stamp in stamps:
                    stamp.extra = extra
                if whole is not None:
                    self._capped.append((now, stamps, whole))
        early.clear()

    def _uncap(self, now: float) -> None:
        """The network queues (`SpreadEvidence.congested`): the slots capped over the last
        typical round trip take their whole bound. A queue shows in the mean only once a
        share of its answers is in: a stall on the way in (requests sent in it all reach the
        server as it ends, their answers come back together) sent the first of them back
        capped, their slots free before the server's window let them go (live, 50 keys x
        100/1s with hints: one 429 on each of a few keys, a window after such a stall;
        virtual, stalls of 100 ms every 2 s: 8-13 429s in 20 s)."""
        capped = self._capped
        horizon = now - (self.evidence.typical or 0.0)
        for t, stamps, whole in capped:
            if t >= horizon:
                _widen(stamps, whole)
        capped.clear()

    def _rewiden(self) -> None:
        """Slots narrowed by a trial that failed: give them the cap in force now."""
        cap = self._cap_ms(self.evidence.net.spread * 1000.0)
        for _t, stamps, whole in self._trial:
            _widen(stamps, (min(whole, cap) if cap is not None else whole) / 1000.0)
        self._trial.clear()

    def _cap_ms(self, spread_ms: float) -> float | None:
        """The most one answered slot needs, if anything bounds it below its own round trip."""
        shape = self.evidence.probe if self.evidence.target_source == SOURCE_PROBE else self.evidence.net
        if self.evidence.target_ms is not None and shape.two_sided(body=not self._capped_whole()):
            # Two-sided jitter (the mean sits inside the range, as when both legs
            # vary alike): one leg's spread is bounded by the symmetric estimate
            # too, and the smaller of two bounds holds. One-sided spikes (mean
            # near the minimum, a long tail: queueing on the way in) keep the
            # per-request bound, which the symmetric estimate would under-cover.
            # A direct estimate gets the 1 ms grain every bound carries: at a few ms
            # of spread, timers and busy loops are jitter too, one leg at a time.
            cap = max(self.value_ms, self._floor_ms) + (
                self.margin_ms if self.evidence.target_direct else 0.0
            )
            return max(self._floor_ms, self._trial_cap(cap))
        if self.narrowing:
            # Probing on one-sided evidence: the tail itself is what is tried.
            tail = (spread_ms + self.margin_ms) * self._remaining.factor
            return max(self._floor_ms, self._trial_cap(tail))
        return None

    def _margin(self, spread_ms: float) -> float:
        """On top of an answer's own bound: the rejection-driven margin, plus 5% of the
        spread or the doubt about the minimum round trip, whichever is more."""
        return self.margin_ms + max(0.05 * spread_ms, self.evidence.net.lo_doubt * 1000.0)

    def _capped_whole(self) -> bool:
        """Every slot takes the cap, spikes too, unless the cap comes from hints: while
        probing on purpose, and whenever the round trips carry server time (the
        round-trip and probe estimates), whose spikes are mostly the server's and
        whose cap is the whole range's."""
        return self.budget.narrowing or self.evidence.target_source != SOURCE_HINTS

    def _trial_cap(self, ms: float) -> float:
        """`ms` under the budget prober's cap, if it holds one. Only answered slots
        take it: the fallback (`value_ms`, which unanswered slots and the limit
        learner read) stays with the evidence."""
        cap = self.budget.cap_ms
        return cap if cap is not None and cap < ms else ms

    # -- control
    def set_fixed(self, ms: float) -> None:
        """Live override: hold exactly `ms` until set adaptive again."""
        self.adaptive = False
        self._set(max(0.0, float(ms)))
        self._publish()

    def set_adaptive(self) -> None:
        self.adaptive = True
        self._publish()

    # -- evidence
    def observe_rtt(
        self,
        rtt_s: float,
        now: float,
        server_s: float | None = None,
        remaining: int | None = None,
        rejected: bool = False,
    ) -> None:
        """Record one answered request: its round trip, and the server's hints if it sent any.

        `server_s`: the server time it reported (used only if it fits,
        `hint_fits`); `remaining`: the server's remaining count after it;
        `rejected`: it was a rate-limit rejection (429). Every one counts
        against the rejection budget, whatever else the engine makes of it
        (a limit learned from it, say), so the budget is kept whatever
        decides the widening.
        """
        if rejected:
            self._count_rejection(now)
            self._counted_at = now
        self.evidence.observe(rtt_s, now, server_s, self._last_t, 0.5 * self.policy_window_s)
        if self.adaptive and self.measured() is not (self.figures.pace_scale != 1.0):
            self._publish()  # the headroom came to stand on measurement, or stopped: the pace follows
        if remaining is not None:
            self._remaining.observe(remaining)
        self._step(now)

    def observe_network(self, rtt_s: float, now: float) -> None:
        """Record one probe round trip (the network's alone, on its own connection)."""
        self.evidence.observe_network(rtt_s, now, self._last_t)

    def observe_rejection(self, now: float) -> None:
        """A rate-limit rejection the headroom should answer for: widen at once.

        While the budget prober holds a narrower cap, it steps back to the
        last clean value instead; once the budget is spent, it returns to the
        evidence for good. A rejection already counted from its answer
        (`observe_rtt(..., rejected=True)` at the same instant) is not
        counted twice.
        """
        if self._counted_at != now:
            self._count_rejection(now)
        self._counted_at = None
        if self.budget.narrowing:
            return  # the prober answered when it was counted
        if not self.adaptive or now < self._hold_until:
            return
        # Answers to requests already in flight may still be rejections of the
        # same burst; give them a round trip (generously) before widening again.
        self._hold_until = now + max(0.5, 2.0 * max(self.evidence.net.hi, 0.0))
        widened = max(self.value_ms * 1.5, self.value_ms + 10.0)
        self._floor_ms = self._clamp(widened)
        self.margin_ms = min(self.max_ms, max(self.margin_ms * 1.5, self.margin_ms + 10.0))
        self._set(self._floor_ms)

    def _count_rejection(self, now: float) -> None:
        """Count one 429 against the budget; the prober steps back (first of a burst)."""
        self.rejections += 1
        budget = self.budget
        budget.spent += 1
        self._prior = False
        self._remaining.rejected()
        if not budget.active:
            return
        if budget.spent_out:
            budget.retreat()
            self._set(max(self.value_ms, self._goal()))
            self._rewiden()
            # What is still on its way was sent narrow: no widening beyond the evidence for it.
            self._hold_until = now + max(0.5, 2.0 * max(self.evidence.net.hi, 0.0)) + self.policy_window_s
            return
        if not self.adaptive or now < self._hold_until or not budget.narrowing:
            return
        # Probing on purpose: back to the last clean value, no wider. Slots
        # granted at the failed value keep it for up to a window: their
        # rejections belong to this burst too.
        self._hold_until = now + max(0.5, 2.0 * max(self.evidence.net.hi, 0.0)) + self.policy_window_s
        budget.rejected(now)
        self._rewiden()

    def _goal(self) -> float:
        target = self.evidence.target_ms if self.evidence.target_ms is not None else self.value_ms
        return self._clamp(max(target * self._remaining.factor, self._floor_ms))

    def _step(self, now: float) -> None:
        last, self._last_t = self._last_t, now
        if not self.adaptive or self.evidence.target_ms is None:
            return
        first_t = self.evidence.first_t
        settled = first_t is not None and now - first_t >= self.settle_s
        if settled and self.evidence.net.n >= SETTLE_ANSWERS:
            # A change shows a window and a round trip later; then watch it for a while.
            stretch = self.policy_window_s + 2.0 * max(self.evidence.net.hi, 0.0) + 1.5
            if self.budget.active and self._floor_ms <= self.min_ms:
                shape = (
                    self.evidence.probe if self.evidence.target_source == SOURCE_PROBE else self.evidence.net
                )
                two_sided = shape.two_sided(body=not self._capped_whole())
                if two_sided:  # trials start from the body's estimate: a start, not a promise
                    body = shape.body_spread * 1000.0 * self.evidence.jitter_share * self.evidence.safety
                    start = min(self.evidence.target_ms, body) if body > 0 else self.evidence.target_ms
                else:
                    start = self.evidence.net.spread * 1000.0 + self.margin_ms
                self.budget.step(now, stretch, start)
            if self.evidence.target_direct:
                # A direct estimate is the network's own spread, measured: remaining counts
                # do not narrow it. Below it some ways in are longer than the cap, and the 0
                # that takes a step back comes with sends already made (10 keys x 100/1s with
                # Server-Timing and X-RateLimit-*, virtual: a step to x0.81, a 0 a tenth of a
                # second later, a 429 a second after that).
                self._remaining.stop()
            elif not self.budget.narrowing:
                self._remaining.step(now, stretch)
        goal = self._goal()
        if goal >= self.value_ms:
            self._set(goal)
        elif self._prior or (self.evidence.target_direct and not self._direct_seen):
            if settled or (self.evidence.target_direct and self.evidence.net.n >= SETTLE_ANSWERS):
                # The initial value was a guess, and a round-trip estimate second
                # best: settled, or more direct, evidence replaces it at once.
                self._prior = False
                self._direct_seen = self._direct_seen or self.evidence.target_direct
                self._set(goal)
                self._rebound(now)
            elif last is not None:
                self._set(max(goal, self.value_ms - self.narrow_ms_per_s * max(0.0, now - last)))
        elif last is not None:
            step = self.narrow_ms_per_s * max(0.0, now - last)
            if self.narrowing:
                step *= 10.0  # a probing step is meant to take effect within its stretch
            self._set(max(goal, self.value_ms - step))

    def _clamp(self, ms: float) -> float:
        return max(self.min_ms, min(self.max_ms, ms))

    def _set(self, ms: float) -> None:
        if ms == self.value_ms:
            return  # most answers step to where it stands
        self.value_ms = ms
        self._publish()
        if ms < self.seen_min_ms:
            self.seen_min_ms = ms
        if ms > self.seen_max_ms:
            self.seen_max_ms = ms
