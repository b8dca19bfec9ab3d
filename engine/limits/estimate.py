"""A key's limit as an estimate that moves both ways (pure: every call is told the time).

A key starts at the limit it was told (the user's or a preset's). Evidence
moves the estimate:

- the server advertises its limit (RateLimit-Policy, X-RateLimit-Limit): the
  estimate never sits above the lower of the told and the advertised limit
  (the *ceiling*);
- a 429 while we sent at our estimate: the estimate falls to what the server
  accepted from us in the window before it, never by more than half in one
  step, so a single 429 never takes a key below half its told limit;
- rejections stop: after a quiet spell the estimate climbs back toward the
  ceiling, one step per window without a 429 (`additive`, +1; or `probing`,
  a tenth of the told limit per step, when the run spends a rejection
  budget). A level above the last one that held is *unconfirmed* until a
  whole window passes at it: the worker sends what goes beyond the
  confirmed level one at a time (`confirmed`), so a probe that draws a
  429 never has company in flight to walk into the server's cooldown; when
  it goes through, the sends its wait held back go at once, within the
  confirmed level (`KeyLimits._catch_up`). A slow start (a told limit not
  trusted until seen to hold: `SLOW_START_FROM` of it at once) counts that
  level over the window alone, as the server counts; paced with a
  headroom, a window holds one less than the limit as the server counts
  it, so a slow start one short of its told limit for `SUSTAINED_WINDOWS`
  windows without a 429 is done.
- a probe that draws a 429 puts the estimate back where it held and holds
  it there, twice as long each time (`hold_s`, doubling, up to
  `HOLD_CAP_S`), so a server that escalates its cooldowns sees few probes.
- a level that had held for a few windows, now failing, is most likely
  someone else on the key: the estimate remembers it (`recover_to`) and,
  every `RECOVER_WINDOWS` windows (one more every third failed round), goes
  straight back to it, the part above what holds now sent one probe at a
  time. A round that draws a 429 goes back to where it started; one that
  goes through is back where it held within a window or two of the other
  user leaving (issue 44: 0.89-0.90 of what they left on virtual time, where
  climbing one step a window after a 20 s hold gave 0.86). After
  `RECOVER_PROBES` failed rounds (about a minute) the probes space out as
  any probe's do.

The server's counts (used/remaining) against our own sends show usage that
is not ours: the key is *shared*. That lowers what is left of the current
window (the limiter absorbs it), not the estimate: `note_shared` records the
share for the console and the report.
"""

from __future__ import annotations

import math

#: The first quiet spell after a 429 lowered the estimate, in seconds, before it climbs.
HOLD_S = 20.0
#: Windows a level must be sent at without a 429 to count as one that held.
SUSTAINED_WINDOWS = 5
#: The quiet spell after a 429 at a level that never held (a told limit that was wrong).
HOLD_NEVER_HELD_S = 120.0
#: The longest a level that drew a 429 is held before it is probed again.
HOLD_CAP_S = 300.0
#: After a level that held was lowered (someone else on the key, most likely): windows
#: between probes back toward it, one more every third probe that draws a 429, for the
#: first `RECOVER_PROBES` of them (about a minute of someone else's use), then as any probe.
RECOVER_WINDOWS = 2
RECOVER_PROBES = 15
#: A slow start trusts this share of a told limit at once; sends beyond it go one at a time
#: until the server accepts them. A told limit is most often right or a little off (a plan's
#: tier, a limit that changed): each level beyond costs a round trip of waiting, so a start at
#: half cost a told limit that was right 0.02 of a minute on a 250 ms round trip (issue 44).
SLOW_START_FROM = 0.75

ADDITIVE = "additive"
PROBING = "probing"


class KeyEstimate:
    """One key's limit for one sliding window: told, advertised, current, why and since when.

    Attributes:
        told: the limit given (flag, config, preset); None when none was given.
        window_s: the window the limit counts in.
        advertised: the limit the server says it enforces, once it has said so.
        value: the current estimate: what the limiter enforces.
        confirmed: the highest level that held for a whole window (value when not climbing).
        reason: why the estimate is what it is ("told", "advertised", "lowered by a 429 at 25",
            "climbing", "climbed back").
        moved_at: when it last moved (loop time); None while it is what it was told.
        climb: "additive" (+1 per window) or "probing" (bigger steps, within a rejection budget).
        shared_share: the share of the last counted window someone else used (None: not seen).
    """

    __slots__ = (
        "told",
        "window_s",
        "advertised",
        "value",
        "confirmed",
        "reason",
        "moved_at",
        "climb",
        "shared_share",
        "shared_at",
        "quiet_until",
        "hold_s",
        "base_hold_s",
        "_last_429",
        "_step_at",
        "_level_since",
        "recover_to",
        "_recover_fails",
        "_recover_from",
        "top_plain",
    )

    def __init__(
        self,
        told: int | None,
        window_s: float,
        *,
        climb: str = ADDITIVE,
        hold_s: float = HOLD_S,
        advertised: int | None = None,
        slow_start: bool = False,
    ) -> None:
        if told is None and advertised is None:
            raise ValueError("an estimate needs a told or an advertised limit")
        self.told = told
        self.window_s = window_s
        self.advertised = advertised
        self.value = self.ceiling
        # With `slow_start` a told limit is not trusted until seen to hold: sends beyond
        # `SLOW_START_FROM` of it go one at a time until the server accepts them; an advertised
        # one is its word.
        self.confirmed = (
            self.value if told is None or not slow_start else max(1, math.ceil(self.value * SLOW_START_FROM))
        )
        self.reason = (
            "told" if told is not None and (advertised is None or told <= advertised) else "advertised"
        )
        self.moved_at: float | None = None
        self.climb = climb
        self.shared_share: float | None = None
        self.shared_at: float | None = None
        self.quiet_until = -math.inf
        self.base_hold_s = hold_s
        self.hold_s = hold_s  # the next hold after a probe that drew a 429 (doubles each time)
        self._last_429 = -math.inf
        self._step_at = -math.inf  # the last climb step (or lowering): one step per window
        self._level_since: float | None = None  # when the current value took effect (first seen)
        # The level that held before a 429 lowered it, while the estimate is below it: the
        # estimate probes back to it every few windows, and goes there at once when it may.
        self.recover_to: int | None = None
        self._recover_fails = 0  # probes toward `recover_to` that drew a 429
        self._recover_from: int | None = None  # the level the last probing round started from
        self.top_plain = 0  # the most of ours in a window (as the server counts) a probe found room beside

    # -- reading
    @property
    def ceiling(self) -> int:
        """The lower of the told and the advertised limit: the estimate never climbs above it.
        (Read with every success once the estimate stands at it: no list built.)"""
        told, advertised = self.told, self.advertised
        if advertised is None or (told is not None and told <= advertised):
            assert told is not None, "an estimate is told a limit, advertised one, or both"
            return told
        return advertised

    def describe(self) -> str:
        """One line: "20/1s (lowered by a 429 at 25)"."""
        return f"{self.value}/{_window(self.window_s)} ({self.reason})"

    # -- evidence
    def _move(self, value: int, reason: str, now: float) -> bool:
        value = max(1, value)
        if value == self.value and reason == self.reason:
            return False
        if value != self.value:
            self._level_since = now
        self.value, self.reason, self.moved_at = value, reason, now
        return True

    def advertise(self, limit: int, now: float) -> bool:
        """The server says it enforces `limit` in this window; True when the estimate moved."""
        if limit < 1 or limit == self.advertised:
            return False
        self.advertised = limit
        ceiling = self.ceiling
        if self.value > ceiling or (self.told is None and self.reason == "advertised"):
            self.confirmed = ceiling
            return self._move(ceiling, "advertised", now)
        return False

    def confirm(self, level: int, plain: int = 0) -> None:
        """The server accepted a send that made `level` of ours in a window: that level holds.
        `plain`: the same count over the window alone (no headroom), as the server counts.

        A slow start (the told limit not yet seen to hold) confirms `plain`: the count with
        the headroom runs a level or two above the server's, and a level confirmed there let
        the send that drew the first 429 go with another behind it, into the server's
        cooldown (issue 44: 1-2 sends into a cooldown per run on virtual time, none or one now)."""
        if plain > self.top_plain:
            self.top_plain = plain
        if self.reason == "told":
            level = plain
        if level > self.confirmed:
            self.confirmed = min(level, self.value)
            if self.recover_to is not None and self.confirmed >= self.recover_to:
                self.recover_to = None  # back where it held, and seen to hold there again
                if self.reason == "climbing back":
                    self.reason = "climbed back"

    def rejected(self, sent_at: float, accepted: int, now: float) -> tuple[bool, bool]:
        """A 429 for a request sent at `sent_at`, after `accepted` of ours were accepted in the
        window before it. Returns (moved, explained): `explained` when the 429 is about the
        limit (so the headroom need not widen for it)."""
        if self.moved_at is not None and sent_at < self.moved_at and self.reason.startswith("lowered"):
            return False, True  # sent before the last lowering: its echo, not new evidence
        if self.shared_at is not None and now - self.shared_at <= 2 * self.window_s:
            return False, True  # the server's counts showed someone else's use: theirs, not a lower limit
        level = self.value
        if self.value > self.confirmed:
            # A probe drew the 429: back to the level that held, held there longer each time.
            # (The told level itself, never seen to hold, was simply wrong: held long.)
            recovering = self.recover_to is not None and self._recover_fails < RECOVER_PROBES
            if recovering:
                hold = (RECOVER_WINDOWS + self._recover_fails // 3) * self.window_s
                self._recover_fails += 1
            else:
                self.hold_s = min(HOLD_CAP_S, self.hold_s * 2)
                hold = HOLD_NEVER_HELD_S if level >= self.ceiling and self.recover_to is None else self.hold_s
            self.quiet_until = max(self.quiet_until, now + hold)
            self._last_429 = self._step_at = now
            # Back to the level that held, or to what the server accepted of ours if that is
            # less, but not below the most of ours a probe found room beside (counted over the
            # window as the server counts it): one count of the window before the failed probe
            # comes out one short now and then, where the jitter moved an arrival across its
            # start (a slow start then settled 7 keys of 40 at 19 against a server's 20).
            if 1 <= accepted < self.confirmed:
                self.confirmed = max(accepted, min(self.top_plain, self.confirmed), math.ceil(level / 2))
            if recovering and self._recover_from is not None:
                # Probes that went through while the other user's slots happened to be free
                # prove little: back to where the round started, not to what those confirmed.
                self.confirmed = min(self.confirmed, self._recover_from)
            return self._move(self.confirmed, f"lowered by a 429 at {level}", now), True
        if accepted < 1 or accepted >= level:
            return False, False  # not sending at our estimate, or it held: timing, not the limit
        new = max(accepted, math.ceil(level / 2))
        # A told limit that never held (the server never accepted that many of ours for a few
        # windows) was simply wrong: hold it long, so climbing does not buy the server's
        # cooldowns. One that had held, or a level measured from the server's answers, failing
        # now is most likely someone else on the key: climb back after the base hold.
        since = self._level_since if self._level_since is not None else now
        held = self.confirmed >= level and now - since >= SUSTAINED_WINDOWS * self.window_s
        wrong = level >= self.ceiling and not held
        if held or self.recover_to is not None:
            # A level that held now failing: someone else on the key, most likely. Probe back
            # toward it every few windows, so the key is back soon after they leave.
            self.recover_to, self._recover_fails = max(level, self.recover_to or 0), 0
            hold = RECOVER_WINDOWS * self.window_s
        else:
            hold = HOLD_NEVER_HELD_S if wrong else self.base_hold_s
        self.quiet_until = max(self.quiet_until, now + hold)
        self.confirmed = new
        self._last_429 = self._step_at = now
        return self._move(new, f"lowered by a 429 at {level}", now), True

    def note_shared(self, extra: int, limit: int, now: float) -> bool:
        """The server counted `extra` more than we sent in a window of `limit`: someone else
        uses this key. Returns True the first time it is seen (for one event)."""
        if extra <= 0 or limit <= 0:
            return False
        first = self.shared_share is None
        self.shared_share = round(min(1.0, extra / limit), 3)
        self.shared_at = now
        # A 429 that lowered the estimate was then most likely theirs: the long hold of a told
        # limit that seemed wrong shrinks to the base hold.
        self.quiet_until = min(self.quiet_until, now + self.base_hold_s)
        return first

    def tick(self, now: float) -> bool:
        """Climb one step toward the ceiling when a window passed without a 429; confirm a
        level that held a whole window. True when the estimate moved."""
        if self._level_since is None:
            self._level_since = now
        if (  # a slow start one short of its told limit for a few windows: that limit holds
            self.reason == "told"
            and self.value - 1 <= self.confirmed < self.value
            and now - max(self._level_since, self._last_429) >= SUSTAINED_WINDOWS * self.window_s
        ):
            self.confirmed = self.value
        if now < self._step_at + self.window_s or now < self.quiet_until:
            return False
        ceiling = self.ceiling
        if self.value >= ceiling:
            if self.value > ceiling:
                return self._move(ceiling, "advertised", now)
            return False
        step = 1 if self.climb == ADDITIVE else max(1, round((self.told or ceiling) / 10))
        self._step_at = now
        value = min(ceiling, self.value + step)
        back = self.recover_to
        if back is not None:
            if back > value:
                # Straight back to the level that held: what goes beyond the confirmed level
                # is sent one at a time, so a probe that finds them still there goes alone.
                self._recover_from = self.value
                return self._move(min(ceiling, back), "climbing back", now)
            self.recover_to = None
        return self._move(value, "climbing" if value < ceiling else "climbed back", now)


def _window(seconds: float) -> str:
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds:g}s"
