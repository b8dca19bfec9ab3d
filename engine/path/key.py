"""What one key knows of its limits, and the one place it learns from an answer.

`KeyLimits` owns a key's limiter and budgets, its limit estimate, what the
server says of its counts, whether its limit is still to be discovered, and
the leases a shared store grants it. `learn` takes an answer's facts before
the verdict (`settle.decide`) and `judged` the verdict's tally after it:
nothing else writes to what a key knows.

It sits on the request path (beside the sender loop, `worker.py`) because
learning reads the wire's answer (`http`) and spends from the budgets
(`limits`), two folders that know nothing of each other.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ratedeck.core.policy import MAX_LIMIT, Policy
from ratedeck.core.vocab import EventKind, OutcomeKind, PolicyKind
from ratedeck.engine.http.delays import advertised_policies
from ratedeck.engine.limits.estimate import ADDITIVE, KeyEstimate
from ratedeck.engine.limits.leases import LeasedSlots
from ratedeck.engine.llm.usage import field as usage_field

from .settle import Tally

if TYPE_CHECKING:
    from ratedeck.engine.http.delays import Quota
    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.headroom import HeadroomController
    from ratedeck.engine.limits.in_flight import InFlightSizing
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import BudgetWatcher, EventSink, SendStamp
    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import KeySpec

    from .lanes import ModelLane, ModelLanes

#: What a key with no limit given enforces until the server advertises one: nothing (it sends
#: one request at a time meanwhile, `KeyLimits.discovering`).
UNKNOWN_LIMIT = Policy(MAX_LIMIT, 1.0)

#: How many send times a key keeps, for the estimate's count of a window.
_SENDS_KEPT = 4096
#: The first and the longest a key sits out for 429s in a row (`KeyLimits.cool_off`).
COOL_FIRST_S = 2.0
COOL_CAP_S = 300.0


class Learning:
    """What every key's learning shares: the run's budgets, the rules, and whom it tells.

    `discovered()` is called when a key adopts a limit its server advertises;
    `no_limit(text)` when no limit was given and the server advertises none
    (the run cannot pace itself). `watcher` is a cluster member, told what the
    server charged and counted for budgets a store shares.
    """

    __slots__ = (
        "budgets",
        "weighted_host",
        "learn_policy",
        "free_statuses",
        "headroom",
        "event",
        "discovered",
        "no_limit",
        "watcher",
    )

    def __init__(
        self,
        *,
        budgets: Budgets,
        headroom: HeadroomController,
        events: EventSink,
        learn_policy: bool = True,
        free_statuses: tuple[int, ...] = (),
        weighted_host: WindowLimiter | None = None,
        discovered: Callable[[], None] | None = None,
        no_limit: Callable[[str], None] | None = None,
        watcher: BudgetWatcher | None = None,
    ) -> None:
        self.budgets = budgets
        self.weighted_host = weighted_host  # the host budget a weight quota names, if any
        self.learn_policy = learn_policy
        self.free_statuses = frozenset(free_statuses)
        self.headroom = headroom
        self.event = events.event
        self.discovered = discovered
        self.no_limit = no_limit
        self.watcher = watcher


class KeyLeases:
    """The send times a shared store grants one key: the default plan's and each plan's.

    `store_names` names each of the key's limiters' budget in the store;
    `want(worker, now, slots)` asks the store for more (a cluster member).
    """

    __slots__ = ("default", "plans", "store_names", "want", "fetching")

    def __init__(
        self, store_names: dict[WindowLimiter, str], want: Callable[[Any, float, LeasedSlots], None]
    ) -> None:
        self.default = LeasedSlots()
        self.plans: dict[tuple[tuple[str, int], ...], LeasedSlots] = {}
        self.store_names = store_names
        self.want = want
        self.fetching = 0  # lease fetches in flight for this key (one at a time with budgets)

    def all(self) -> list[LeasedSlots]:
        return [self.default, *self.plans.values()]

    def for_plan(self, plan: list[tuple[WindowLimiter, int]], single: bool) -> LeasedSlots:
        """The leases held for `plan` (a new, empty holder the first time)."""
        names = self.store_names
        sig = tuple((names.get(lim, "?"), cost) for lim, cost in plan)
        slots = self.plans.get(sig)
        if slots is None:
            if len(self.plans) > 64:  # plans of one request each (tokens): forget the spent ones
                for k in [k for k, s in self.plans.items() if not len(s) and not s.fetching]:
                    del self.plans[k]
            slots = self.plans[sig] = LeasedSlots(plan, single=single)
            slots.valid_until = self.default.valid_until
        return slots


class ServerCounts:
    """The server's own view of a key's main budget, from the last answer that gave it."""

    __slots__ = ("remaining", "limit", "reset_at")

    def __init__(self) -> None:
        self.remaining: int | None = None
        self.limit: int | None = None
        self.reset_at: float | None = None

    def note(self, quota: Quota, reset_at: float | None) -> None:
        if quota.name not in (None, "core", "default", "requests") or quota.weight:
            return
        if quota.remaining is not None:
            self.remaining = quota.remaining
        elif quota.used is not None and quota.limit is not None:
            self.remaining = max(0, quota.limit - quota.used)
        if quota.limit is not None:
            self.limit = quota.limit
        if reset_at is not None:
            self.reset_at = reset_at


class SendLog:
    """A key's recent send times, the one send the others wait for (a probe: beyond the
    estimate's confirmed level, or the first after a 429), and its 429s in a row."""

    __slots__ = (
        "times",
        "failed",
        "probe_out",
        "probe_at",
        "probe_level",
        "probe_plain",
        "catch_up",
        "lone_next",
        "last_429_at",
        "cool_s",
    )

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=_SENDS_KEPT)
        self.failed: deque[float] = deque(maxlen=_SENDS_KEPT)  # send times of answers not accepted
        self.probe_out = False  # a send beyond the confirmed level is in flight: wait for it
        self.probe_at = -1.0  # its send time
        self.probe_level = 0  # and our count in the window with it
        self.probe_plain = 0  # the same over the window alone, as the server counts it
        self.catch_up = 0  # sends the even pace held back while a probe was out, that may go at once
        self.lone_next = False  # a 429 came back: the next send goes alone
        self.last_429_at = -math.inf  # when the last 429 came back (-inf: none since a success)
        self.cool_s = 0.0  # the last cool-off for 429s in a row (0: none since a success)


class KeyLimits:
    """One key's limits and what it learned of them (see the module's docstring).

    `limiter` is the key's own budget; `limiters` every budget a send spends
    (key, host); `key_budgets` the key's named budgets (key scope). A key built
    with `leases` sends only at times a shared store granted. With limits per
    key and model, `lanes` holds each model's buckets (`lanes.py`): an answer
    teaches the lane of the model its request named.
    """

    __slots__ = (
        "label",
        "told",
        "limiter",
        "limiters",
        "key_budgets",
        "key_weighted",
        "token_gates",
        "estimate",
        "estimated",
        "discovering",
        "first_pending",
        "max_in_flight",
        "full_in_flight",
        "sizing",
        "window_bound",
        "server",
        "sends",
        "leases",
        "learning",
        "lanes",
        "_policy_header",
        "next_free",
    )

    def __init__(
        self,
        spec: KeySpec,
        limiter: WindowLimiter,
        learning: Learning,
        *,
        max_in_flight: int,
        shared: tuple[WindowLimiter, ...] = (),
        key_budgets: dict[str, WindowLimiter] | None = None,
        key_weighted: bool = False,
        climb: str = ADDITIVE,
        slow_start: bool = False,
        learn_first: bool = False,
        leases: KeyLeases | None = None,
        lanes: ModelLanes | None = None,
        sizing: InFlightSizing | None = None,
    ) -> None:
        """`max_in_flight` is the pinned number, or with `sizing` (no number pinned) the
        ceiling: the size then follows the key's rate and round trip (`resize`)."""
        self.label = spec.label
        self.lanes = lanes
        self.told = ", ".join(str(p) for p in spec.policies)  # the limits given, as the user wrote them
        self.limiter = limiter
        self.limiters = (limiter, *shared)
        # The earliest time a send keeps every limit (asked two or three times per send): with
        # one limiter, its own method, one Python call less each time.
        self.next_free: Callable[[float], float] = limiter.next_free if not shared else self._next_free_all
        self.key_budgets = key_budgets or {}
        self.key_weighted = key_weighted  # the key's budget counts weight, not requests
        self.learning = learning
        budgets = learning.budgets
        # Token budgets every request spends from: one that holds a request back holds all.
        self.token_gates: frozenset[WindowLimiter] = frozenset(
            budgets.limiter_for(b, self.key_budgets)
            for b in budgets.covering
            if b.tokens and budgets.routing and not b.per_model
        )
        if lanes is not None:
            learn_first = False  # each model's lane waits for its own first answer
        # No limit given: one request in flight until the server's answers advertise one.
        self.discovering = not spec.policies
        # An LLM API's tier is in its answers' headers: one request until the first answer.
        self.first_pending = learn_first
        self.sizing = sizing
        self.full_in_flight = sizing.last if sizing is not None else max_in_flight
        self.max_in_flight = 1 if self.discovering or learn_first else self.full_in_flight
        self.window_bound = math.inf  # the shortest refill window the server's buckets proved (`_follow`)
        self.server = ServerCounts()
        self.sends = SendLog()
        self.leases = leases
        self._policy_header: str | None = None  # the last RateLimit-Policy seen, to parse once
        # The key's limit as an estimate that moves both ways (limits/estimate.py): the tightest
        # sliding window it was told, enforced by the limiter's meter of that policy.
        # (none when the key's limits hold per model: each lane follows its server's headers)
        per_model = lanes is not None and lanes.per_model_requests
        sliding = [p for p in spec.policies if p.kind is PolicyKind.SLIDING and not per_model]
        self.estimated: Policy | None = min(sliding, key=lambda p: p.rate) if sliding else None
        self.estimate: KeyEstimate | None = (
            KeyEstimate(self.estimated.limit, self.estimated.window_s, climb=climb, slow_start=slow_start)
            if self.estimated is not None
            else None
        )

    def all_leases(self) -> list[LeasedSlots]:
        """Every lease holder of this key (none without a shared store)."""
        return self.leases.all() if self.leases is not None else []

    # ------------------------------------------------------------ what a send may spend
    def _next_free_all(self, now: float) -> float:
        return max(lim.next_free(now) for lim in self.limiters)

    def live_rate(self, h: float) -> float:
        """Requests per second this key lets through now: its own limit's, or fewer where a
        token budget every request spends from binds (its refill over what one request has
        cost once settled, on average so far)."""
        lanes = self.lanes
        if lanes is not None and lanes.per_model_requests and len(lanes):
            return sum(self._lane_rate(lane, h) for lane in lanes)
        rate = self.limiter.live_rate(h)
        for lim in self.token_gates:
            cost = lim.settled_cost()
            if cost:
                rate = min(rate, lim.live_rate(h) / cost)
        return rate

    @staticmethod
    def _lane_rate(lane: ModelLane, h: float) -> float:
        """Requests per second one model's lane lets through (its token buckets at their cost so far)."""
        assert lane.limiter is not None
        rate = lane.limiter.live_rate(h)
        for lim in lane.own.values():
            cost = lim.settled_cost()
            if cost:
                rate = min(rate, lim.live_rate(h) / cost)
        return rate

    def resize(self, h: float, full: bool, now: float) -> int:
        """No number pinned: as many in flight as the key's rate now (`live_rate`, `h` the
        headroom) times its round trip needs (`InFlightSizing`; `full`: the key has as many in
        flight as it may while work waits); returns the size before."""
        before = self.full_in_flight
        sizing = self.sizing
        if sizing is not None:
            room = full and self.next_free(now) <= now
            self.full_in_flight = size = sizing.size(self.live_rate(h), full, room)
            if not (self.discovering or self.first_pending):
                self.max_in_flight = size
        return before

    def note_send(self, now: float) -> None:
        """A send went at `now`: counted for the estimate; one beyond the level that held
        goes alone (the next wait for its answer)."""
        sends = self.sends
        sends.times.append(now)
        est = self.estimate
        if sends.catch_up:
            self._catch_up(now)
        if sends.lone_next:
            # The first send after a 429 goes alone: were the server holding the key in a
            # penalty, company sent beside it would only lengthen it (`cool_off`).
            sends.lone_next = False
            sends.probe_out, sends.probe_at = True, now
            sends.probe_level, sends.probe_plain = self._counts_in_window(now) if est is not None else (0, 0)
        elif est is not None and est.value > est.confirmed:
            # Beyond the confirmed level when the send `confirmed` before this one is still
            # in the window: one look, not a count of the window (this runs for every send).
            times, beyond = sends.times, est.confirmed + 1
            # A slow start counts as the server does, over the window alone (`confirm`).
            start = now - est.window_s if est.reason == "told" else self._window_start(now)
            if len(times) >= beyond and times[-beyond] > start:
                sends.probe_out, sends.probe_at = True, now
                sends.probe_level, sends.probe_plain = self._counts_in_window(now)

    def _catch_up(self, now: float) -> None:
        """After a probe's success, the sends its wait held back go at once, not at the even
        pace, while our count in the window, widened by the headroom, stays under the
        confirmed level (the server sees no more than that). Paced, the window only refilled
        where the window before had a gap: a slow start climbed about one level a window, not
        one a round trip (issue 44)."""
        sends, est = self.sends, self.estimate
        assert est is not None  # a catch-up is only set by a probe's answer, which an estimate has
        if self._count_in_window(now) < est.confirmed:
            sends.catch_up -= 1
            self.limiter.release_pace()
        else:
            sends.catch_up = 0

    def _window_start(self, now: float) -> float:
        assert self.estimate is not None
        return now - self.estimate.window_s - self.limiter.headroom_s()

    def _counts_in_window(self, now: float) -> tuple[int, int]:
        """Our sends in the estimate's window up to `now`, in one pass: widened by the headroom
        as the limiter's meter counts them (the server sees at most these in its window), and
        over the window alone, as the server counts them."""
        assert self.estimate is not None
        plain_start = now - self.estimate.window_s
        start = plain_start - self.limiter.headroom_s()
        widened = plain = 0
        for t in reversed(self.sends.times):
            if t <= start:
                break
            widened += 1
            if t > plain_start:
                plain += 1
        return widened, plain

    def _count_in_window(self, now: float) -> int:
        """Our sends in the estimate's window up to `now`, widened by the headroom."""
        return self._counts_in_window(now)[0]

    # ------------------------------------------------------------ learning from an answer
    def learn(self, result: Outcome, req: Request, stamps: tuple[SendStamp, ...], now: float) -> None:
        """Take what an answer says of the key's limits, before its verdict: the first answer,
        an advertised limit, what the server did not charge, its own counts."""
        status = result.status
        learning = self.learning
        lane = self.lanes.lane(req) if self.lanes is not None else None
        if status is not None:
            if lane is not None and lane.first_pending:
                lane.first_pending = lane.first_out = False  # the model's limits are known now
            if self.first_pending:
                self._first_answered()
            # Only an answer that went through (2xx) or was rate-limited (429) speaks for the limit:
            # a 404 or a 401 says something else (a wrong URL, a refused key).
            if self.discovering and (status < 300 or status == 429):
                self._discover(result, now)
        if result.policy_header is not None and learning.learn_policy:
            for policy in self.adopt_advertised(result.policy_header, now):
                learning.event(EventKind.SETTING, f"{self.label}: server advertises {policy}; adopted it")
        if stamps and status is not None and (learning.budgets.settled or learning.free_statuses):
            self._give_back(req, result, stamps[0], now, lane)
        if result.quotas:
            self._sync_quotas(req, result, now, lane)

    def judged(self, tally: Tally, sent_at: float | None, now: float) -> bool:
        """The verdict's tally for a send at `sent_at`: a success may let the estimate climb,
        a 429 lowers it. True when the 429 is explained by the limit (not the timing)."""
        sends = self.sends
        succeeded = tally is Tally.SUCCEEDED
        if sent_at is not None and sent_at == sends.probe_at:
            sends.probe_out, sends.probe_at = False, -1.0  # the send beyond the confirmed level is answered
            est = self.estimate
            if succeeded and est is not None:
                est.confirm(sends.probe_level, sends.probe_plain)
                # What the even pace would have sent while the others waited may go now.
                sends.catch_up = round((now - sent_at) * est.value / est.window_s)
                if sends.catch_up:
                    self.limiter.release_pace()
        if not succeeded and sent_at is not None:
            sends.failed.append(sent_at)
        learning = self.learning
        if not learning.learn_policy:
            return False
        if succeeded:
            if self.climb(now):
                self._estimate_moved()
        elif tally is Tally.REJECTED_429 and sent_at is not None and not learning.headroom.narrowing:
            # A 429 while the headroom deliberately narrows (a rejection budget, remaining
            # counts) is about timing, not the limit: learn nothing from it.
            moved, explained = self.learn_from_rejection(sent_at, learning.headroom.seconds(), now)
            if moved:
                self._estimate_moved()
            return explained
        return False

    def cool_off(self, tally: Tally, sent_at: float | None, now: float, told_wait: bool) -> float:
        """How long the key sits out after this answer, in seconds (0: not at all).

        A 429 for a send that went after the key's last 429 had come back, with no success
        between (the send went alone: `note_send`), is no count the window will free: the
        server holds the key in a penalty, and some lengthen it for every request sent into
        it (told 100/1s where the server allows 80 and escalates: 268 429s, 265 of them into
        its cooldown, and 508 accepted of the 2,880 it allows in 12 s, before this). The key
        cools off two of its windows (`COOL_FIRST_S` at most: a minute's window would sit a
        key out two minutes at the first), four times as long for each more in a row (up to
        `COOL_CAP_S`), so its wait outgrows a penalty that doubles. `told_wait`: the answer said how long
        (Retry-After), and that wait is the server's to set."""
        sends = self.sends
        if sent_at is None:
            return 0.0
        if tally is Tally.SUCCEEDED:
            if sent_at > sends.last_429_at:  # sent after the last 429 came back, and through
                sends.last_429_at, sends.cool_s = -math.inf, 0.0
            return 0.0
        if tally is not Tally.REJECTED_429:
            return 0.0
        again = sent_at > sends.last_429_at > -math.inf
        # Where the server said how long to wait, its wait is the whole of it: no send alone after.
        sends.last_429_at, sends.lone_next = now, not told_wait
        if not again or told_wait:
            return 0.0
        base = min(COOL_FIRST_S, 2.0 * min((p.window_s for p in self.limiter.policies), default=1.0))
        sends.cool_s = min(COOL_CAP_S, sends.cool_s * 4.0 if sends.cool_s else base)
        return sends.cool_s

    def answered_all(self) -> None:
        """Nothing of this key is in flight: no probe is waited for."""
        self.sends.probe_out = False
        if self.lanes is not None:
            for lane in self.lanes:  # an attempt that never reached the server taught nothing
                lane.first_out = False

    def _first_answered(self) -> None:
        """The key's first answer came: its limits are known, send as they allow."""
        self.first_pending = False
        if not self.discovering:
            self.max_in_flight = self.full_in_flight

    def _discover(self, result: Outcome, now: float) -> None:
        """No limit was given for this key: its first answer must advertise one, or the run stops."""
        learning = self.learning
        policy = self.discover(advertised_limits(result), now)
        if policy is not None:
            learning.event(
                EventKind.SETTING,
                f"{self.label}: no limit given; the server advertises {policy}: adopted it",
            )
            if learning.discovered is not None:
                learning.discovered()
        elif learning.no_limit is not None:
            learning.no_limit("the server advertises no rate limit on its answers; give one with --limit N/W")

    def discover(self, policies: tuple[Policy, ...], now: float) -> Policy | None:
        """No limit was given: adopt what the server advertises (its tightest window becomes the
        key's estimate) and send as the limits allow from now on; None when it advertises none."""
        if not policies:
            return None
        for policy in policies:
            self.limiter.add_policy(policy, now)
        tightest = min(policies, key=lambda p: p.rate)
        self.discovering = False
        if not self.first_pending:
            self.max_in_flight = self.full_in_flight
        if tightest.kind is PolicyKind.SLIDING:
            self.estimated = tightest
            self.estimate = KeyEstimate(None, tightest.window_s, advertised=tightest.limit)
            self.estimate.moved_at = now
        return tightest

    def adopt_advertised(self, header: str, now: float = 0.0) -> list[Policy]:
        """Adopt advertised limits (RateLimit-Policy) tighter than ours; returns those adopted."""
        if header == self._policy_header:
            return []
        self._policy_header = header
        policies = advertised_policies(header)
        self._advertise(policies, now)
        return [p for p in policies if self.limiter.add_policy(p)]

    def _advertise(self, policies: tuple[Policy, ...], now: float = 0.0) -> bool:
        """The estimate's ceiling from what the server advertises in its window; True if it moved."""
        est = self.estimate
        if est is None:
            return False
        same = [p.limit for p in policies if abs(p.window_s - est.window_s) < 1e-6]
        if same and est.advertise(min(same), now):
            self._retune()
            return True
        return False

    # -- the server's counts
    def _sync_quotas(self, req: Request, result: Outcome, now: float, lane: ModelLane | None) -> None:
        """Take the server's own counts: a budget it names, a weight budget, else the key's own.

        What this key spent after the answered request was sent is added, since
        the server cannot have counted it yet (`spent_since`). An LLM API's
        buckets are followed both ways (`_follow`).
        """
        sent_at = req.last_sent_at if req.last_sent_at is not None else now
        quotas = result.quotas
        if quotas[0].follow if len(quotas) == 1 else any(quota.follow for quota in quotas):
            self._follow(quotas, sent_at, now, lane)
        watcher = self.learning.watcher
        for quota in quotas:
            if quota.follow:
                continue
            limiter = self._limiter_for_quota(quota, lane)
            if limiter is None:
                continue
            reset_at = now + quota.reset_in_s if quota.reset_in_s is not None else None
            extra = limiter.sync(
                now,
                used=quota.used,
                remaining=quota.remaining,
                limit=quota.limit,
                reset_at=reset_at,
                window_s=quota.window_s,
                sent_at=sent_at,
            )
            self.server.note(quota, reset_at)
            if watcher is not None:
                used = quota.used
                if used is None and quota.remaining is not None and quota.limit is not None:
                    used = max(0, quota.limit - quota.remaining)
                if used is not None:
                    policy = limiter.policy_for(quota.window_s)
                    watcher.synced(self, limiter, policy, used, sent_at, reset_at)
            if extra > 0 and limiter is self.limiter and self.note_shared(extra, quota.limit, now):
                share = self.estimate.shared_share if self.estimate is not None else None
                self.learning.event(
                    EventKind.SETTING,
                    f"{self.label}: shared: someone else used {share or 0:.0%} of this window "
                    "(the server counted more than we sent); using what is left",
                )

    def _follow(
        self, quotas: tuple[Quota, ...], sent_at: float, now: float, lane: ModelLane | None = None
    ) -> None:
        """An LLM API's buckets as its answer states them: size, refill and count, adopted
        lower or higher than ours (the tier, learned; nobody needs to know theirs).

        A bucket that refills fully in `reset` from `remaining` refills
        `(limit - remaining) / reset` per second. Every unit refills over the same
        window, so the window comes from whichever unit is busy (a full one says
        nothing). Each reading is a bound never shorter than the true window (the
        remaining count less one, the reset's last figure rounded up, a wall-clock
        reset given back the round trip it may have spent reaching us); the key
        keeps the shortest bound seen. The count corrects ours where it proves it
        wrong (`_Bucket.follow`). With limits per model, all of this is the lane's
        of the model the request named.
        """
        owner: KeyLimits | ModelLane = lane if lane is not None else self
        bound = owner.window_bound
        transit = now - sent_at  # a wall-clock reset lost at most the round trip on its way here
        for q in quotas:
            if q.follow and q.limit and q.remaining is not None and q.reset_in_s:
                short = q.limit - q.remaining
                if short >= 2:
                    reset = q.reset_in_s + transit if q.reset_from_time else q.reset_in_s
                    bound = min(bound, q.limit * reset / (short - 1))
        first_window = bound < math.inf and owner.window_bound == math.inf
        owner.window_bound = bound
        window = bound if bound < math.inf else None
        watcher = self.learning.watcher
        moved = []
        for q in quotas:
            if not q.follow or q.remaining is None:
                continue
            limiter = self._limiter_for_follow(q.name, lane)
            if limiter is None:
                continue
            before = limiter.bucket()
            # A server that says what is left but not of what (Azure OpenAI): left of the limit
            # told, so the count follows the server's (a resumed job's drained buckets, others).
            limit = q.limit if q.limit is not None else before.limit if before is not None else None
            if limit is None:
                continue
            # What the server may not have counted: ours sent since the answered request, and
            # since a headroom before it (one sent earlier may have reached it later: a new
            # connection's handshake, a late loop).
            since = limiter.spent_since(sent_at - self.learning.headroom.seconds())
            if limiter.follow(now, limit, max(0, limit - q.remaining), since, window):
                bucket = limiter.bucket()
                if watcher is not None and bucket is not None:
                    watcher.synced(self, limiter, bucket, max(0, limit - q.remaining), sent_at, None)
                if before is not None and (before.limit != limit or first_window):
                    was = f" (was {before.limit:,})" if before.limit != limit else ""
                    moved.append(f"{q.name} {limit:,}{was}")
            reset_at = now + q.reset_in_s if q.reset_in_s is not None else None
            if lane is None:
                self.server.note(q, reset_at)
            elif q.name == "requests":
                lane.remaining, lane.limit, lane.reset_at = q.remaining, limit, reset_at
        if moved:
            refill = f", refilled over {bound:.1f} s" if bound < math.inf else ""
            who = f"{self.label} {lane.model}" if lane is not None else self.label
            self.learning.event(
                EventKind.SETTING, f"{who}: the server's limits: {', '.join(moved)}{refill}; adopted"
            )

    def _limiter_for_follow(self, unit: str | None, lane: ModelLane | None = None) -> WindowLimiter | None:
        if lane is not None:
            if unit == "requests" and lane.limiter is not None:
                return lane.limiter
            if unit in lane.budgets:
                return lane.budgets[unit]
        if unit == "requests":
            return self.limiter
        if unit in self.key_budgets:
            return self.key_budgets[unit]
        return self.learning.budgets.host.get(unit) if unit is not None else None

    def _limiter_for_quota(self, quota: Quota, lane: ModelLane | None = None) -> WindowLimiter | None:
        name = quota.name
        budgets = self.learning.budgets
        if lane is not None and name is not None and name in lane.own:
            return lane.own[name]
        if name is not None:
            if name in self.key_budgets:
                return self.key_budgets[name]
            if name in budgets.host:
                return budgets.host[name]
        if quota.weight:
            return self.learning.weighted_host
        if name in (None, "core", "default") or not budgets.specs:
            return self.limiter
        return None

    def _give_back(
        self, req: Request, result: Outcome, stamp: SendStamp, now: float, lane: ModelLane | None = None
    ) -> None:
        """Give back what the server did not charge: all of it for a status the API documents
        as free (`target.free_statuses`), else the part of a settled budget's reservation
        beyond the real use the answer reports (`settle`, like usage.output_tokens)."""
        learning = self.learning
        budgets = learning.budgets
        route = budgets.route(req)
        ticket = getattr(stamp, "ticket", None)
        watcher = learning.watcher if ticket is not None else None
        key_budgets = lane.budgets if lane is not None else self.key_budgets
        if result.status in learning.free_statuses:
            back = []
            if not any(b.exclusive for b in route.budgets):
                own = lane.limiter if lane is not None and lane.limiter is not None else self.limiter
                back.append((own, route.weight if self.key_weighted else 1))
            for spec in route.budgets:
                back.append((budgets.limiter_for(spec, key_budgets), route.cost(spec)))
            for lim, units in back:
                lim.refund(stamp, units, now)
                if watcher is not None:
                    watcher.gave_back(self, lim, ticket, units)
            return
        if result.kind is not OutcomeKind.OK:
            return
        for spec in route.budgets:
            if spec.settle is None:
                continue
            lim = budgets.limiter_for(spec, key_budgets)
            used = usage_field(result, spec.settle)
            reserved = route.cost(spec)
            if used is not None and used < reserved:
                lim.refund(stamp, reserved - used, now)
                if req.units is not None:  # what it cost, for the makespan's count of the job's units
                    req.units = {**req.units, spec.unit: used}
                if watcher is not None:
                    watcher.gave_back(self, lim, ticket, reserved - used)

    # -- the estimate
    @property
    def learned_limit(self) -> Policy | None:
        """The estimate as a policy while it is below the limit told (None otherwise)."""
        est, told = self.estimate, self.estimated
        if est is None or told is None or est.value >= told.limit:
            return None
        return Policy(est.value, told.window_s)

    def _retune(self) -> None:
        if self.estimate is not None and self.estimated is not None:
            self.limiter.retune(self.estimated, self.estimate.value)

    def learn_from_rejection(self, sent_at: float, h: float, now: float) -> tuple[bool, bool]:
        """A 429 for a send at `sent_at`: evidence for the estimate. Returns (moved, explained).

        A rate limit at `sent_at` means the server had, in the window before
        it, as many accepted requests as it allows: count ours that succeeded
        in that window (widened by the headroom, for their arrival times). The
        estimate falls to that count (by at most half), or back to the level
        that held when a probe above it drew the 429 (limits/estimate.py).
        """
        est = self.estimate
        if est is None:
            return False, False
        # Our sends in the window before it, less those answered with anything but a success:
        # a 429 is answered at once, and overtakes successes still being served.
        start = sent_at - est.window_s
        accepted = sum(1 for t in self.sends.times if start < t < sent_at)
        accepted -= sum(1 for t in self.sends.failed if start < t < sent_at)
        moved, explained = est.rejected(sent_at, accepted, now)
        if moved:
            self._retune()
        return moved, explained

    def adopt_estimate(self, value: int, reason: str, now: float) -> bool:
        """Another member's estimate of this shared key (newer than ours): take it, within the
        ceiling; a level above what held here is unconfirmed (probed one at a time). True if it moved."""
        est = self.estimate
        if est is None:
            return False
        value = max(1, min(int(value), est.ceiling))
        if value == est.value:
            return False
        est.value = value
        est.confirmed = min(est.confirmed, value)
        est.reason, est.moved_at = reason[:80], now
        self._retune()
        return True

    def climb(self, now: float) -> bool:
        """Let the estimate climb (a window without a 429); True when it moved."""
        est = self.estimate
        if est is None or not est.tick(now):
            return False
        self._retune()
        return True

    def note_shared(self, extra: int, limit: int | None, now: float) -> bool:
        """The server counted `extra` we did not send: the key is shared. True the first time."""
        est = self.estimate
        if est is None:
            return False
        return est.note_shared(extra, limit or est.value, now)

    def _estimate_moved(self) -> None:
        est = self.estimate
        if est is not None and est.reason != "climbing":  # each step up would flood the log
            self.learning.event(
                EventKind.SETTING, f"{self.label}: told {self.told}, limit estimate {est.describe()}"
            )

    # ------------------------------------------------------------ reading
    def estimate_fields(self, now: float) -> tuple[str | None, str, float | None, str, float | None]:
        """(estimate, reason, moved this many seconds ago, climb, someone else's share) for the row."""
        est = self.estimate
        if est is None or self.estimated is None:
            return None, "", None, "", None
        ago = round(now - est.moved_at, 1) if est.moved_at is not None else None
        return str(Policy(est.value, est.window_s)), est.reason, ago, est.climb, est.shared_share

    def followed(self) -> str:
        """The key's buckets as the server's headers set them, once its refill window is known;
        with limits per model, each model's ("gpt-4o: requests 500, tokens 30,000 per 6.0 s; ...",
        the model left out when there is one)."""
        if self.lanes is not None and len(self.lanes):
            own = dict(self.key_budgets)
            shown = []
            for lane in self.lanes:
                if lane.window_bound < math.inf:
                    text = _buckets_text([*lane.buckets(), *own.items()], lane.window_bound)
                    shown.append((lane.model, text))
            if len(shown) == 1:
                return shown[0][1]
            return "; ".join(f"{model}: {text}" for model, text in shown if text)
        if self.window_bound == math.inf:
            return ""
        return _buckets_text([("requests", self.limiter), *self.key_budgets.items()], self.window_bound)

    def binding(self, now: float) -> str:
        """Of the key's own limit and its budgets, the one nearest full now ("" with no budgets);
        with limits per model, every model's buckets count (the unit is named, not the model)."""
        lanes = self.lanes
        if not self.key_budgets and not lanes:
            return ""
        buckets = [("requests", self.limiter), *self.key_budgets.items()]
        if lanes is not None:
            for lane in lanes:
                buckets.extend(lane.buckets())
        best, fill = "", -1.0
        for name, lim in buckets:
            used, limit = lim.used(now)
            if limit > 0 and used / limit > fill:
                best, fill = name, used / limit
        return best


def _buckets_text(buckets: list[tuple[str, WindowLimiter]], window_s: float) -> str:
    """ "requests 500, tokens 30,000 per 6.0 s": each bucket's size, and the refill window."""
    parts = [f"{name} {b.limit:,}" for name, lim in buckets if (b := lim.bucket()) is not None]
    return f"{', '.join(parts)} per {window_s:.1f} s" if parts else ""


def advertised_limits(result: Outcome) -> tuple[Policy, ...]:
    """The limits an answer advertises for its key: RateLimit-Policy, else a count with a known
    window (`RateLimit` with its policy, X-RateLimit-Limit with the seconds to its reset as the
    window, at least 1 s; the limiter then follows the server's own counts)."""
    policies = advertised_policies(result.policy_header)
    if policies:
        return policies
    found = []
    for quota in result.quotas:
        if quota.limit is None or quota.weight or quota.name not in (None, "core", "default"):
            continue
        window = quota.window_s or (
            max(1.0, float(math.ceil(quota.reset_in_s))) if quota.reset_in_s else None
        )
        if window is not None and quota.limit >= 1:
            found.append(Policy(quota.limit, window))
    return tuple(found)
