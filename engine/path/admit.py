"""Whether a key may send a request now: one pure decision that returns a plan.

`admit(req, key, now, turn)` reads the request and a view of the key (`KeyView`:
its limits, lanes, leases, the named budgets when requests route, the
connection pools' room) and changes nothing. It returns a value:

- `Send(plan)`: the key sends `req` now; the `Plan` says what the send spends
  (each limiter and its cost), the lease holder it takes a slot from, its
  model's lane, and whether a token budget routes it;
- `Hold(until)`: not before `until`; `behind` when what holds it holds every
  request behind it too (a token budget every request spends from), `ask` the
  lease holder to ask a shared store for, `lane` the model whose later requests
  wait behind this one for the rest of the turn, `answer` when the model waits
  for its first answer;
- `PASS`: not this request; the next may go.

The key worker carries the value out (`worker.py`), and the queue takes the
request a `Send` names (`WorkQueues.pick`). A key whose requests all spend
alike (no routed budgets, no pools) has one plan, computed once
(`KeyView.default`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.leases import LeasedSlots
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.request import Request

    from .key import KeyLimits
    from .lanes import ModelLane

__all__ = ["LEASE_EARLY_S", "PASS", "Hold", "KeyView", "Pass", "Plan", "Send", "admit", "default_plan"]

#: A lease may be used this much before its time: a timer fires up to the clock's resolution
#: early, and float sums of times differ in the last bits (a store's grants carry the margin).
LEASE_EARLY_S = 1e-6


@dataclass(frozen=True, slots=True)
class Plan:
    """What one send spends: `spends` each limiter and its cost (the first stamps the send,
    the others record it under that stamp), `slots` the lease holder it takes a granted
    time from (None without a shared store), `lane` its model's lane (limits per model),
    `tokens` whether a token budget routes it."""

    spends: tuple[tuple[WindowLimiter, int], ...]
    slots: LeasedSlots | None = None
    lane: ModelLane | None = None
    tokens: bool = False


@dataclass(frozen=True, slots=True)
class Send:
    """Send the request now, spending `plan`."""

    plan: Plan
    take: ClassVar[bool] = True  # the queue takes the request (`ports.Admission`)
    stop: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class Hold:
    """Not before `until` (inf: no time known). `behind`: the requests behind it wait too;
    `ask`: ask the store for a lease of this holder; `lane`: this model's later requests wait
    behind it this turn; `answer`: its model's first answer is awaited (an answer wakes the key)."""

    until: float
    behind: bool = False
    ask: LeasedSlots | None = None
    lane: ModelLane | None = None
    answer: bool = False
    take: ClassVar[bool] = False

    @property
    def stop(self) -> bool:
        """The requests behind it wait too: the queue looks no further."""
        return self.behind


@dataclass(frozen=True, slots=True)
class Pass:
    """Not this request (its pool is full, another key leases its slot): the next may go."""

    take: ClassVar[bool] = False
    stop: ClassVar[bool] = False


PASS = Pass()

#: A model whose first answer is awaited: its requests wait, and an answer wakes the key.
_FOR_ANSWER = Hold(math.inf, answer=True)


@dataclass(frozen=True, slots=True)
class KeyView:
    """What admission reads of one key: its `limits`, the run's `budgets` when requests
    route (None: every request spends alike), `pool_room(pool)` when connection pools
    bound the sends, and the `default` decision of a request that spends alike."""

    limits: KeyLimits
    budgets: Budgets | None
    pool_room: Callable[[str | None], bool] | None
    default: Send

    @property
    def per_request(self) -> bool:
        """Whether the decision depends on the request (routed budgets or pools)."""
        return self.budgets is not None or self.pool_room is not None


def default_plan(limits: KeyLimits) -> Plan:
    """The plan of a request that spends alike: one from each of the key's limiters (its own,
    the host's), and a slot of the default leases under a shared store."""
    leases = limits.leases
    return Plan(tuple((lim, 1) for lim in limits.limiters), leases.default if leases is not None else None)


def admit(req: Request, key: KeyView, now: float, turn: int) -> Send | Hold | Pass:
    """Whether `req` can go now with `key` (its pool has room, every budget it spends does).

    `turn` numbers the worker's look for work (a lane held in it by an earlier request
    stays held). A token budget every request spends from that holds `req` back holds the
    requests behind it too (a smaller prompt would only overtake it, and a big one could
    starve while small ones keep the bucket from filling).
    """
    pool_room = key.pool_room
    if pool_room is not None and not pool_room(req.pool):
        return PASS
    budgets = key.budgets
    if budgets is None:
        return key.default
    limits = key.limits
    route = budgets.route(req)
    lane = limits.lanes.lane(req) if limits.lanes is not None else None
    own, key_budgets = limits.limiter, limits.key_budgets
    if lane is not None:
        if not lane.served:
            return PASS  # the key's endpoint does not serve this model: another key's will
        open_at = lane.gate.open_at
        if open_at > now:
            return Hold(open_at)
        if lane.first_out:
            return _FOR_ANSWER
        if lane.held_turn == turn:
            return PASS
        own = lane.limiter if lane.limiter is not None else own
        key_budgets = lane.budgets
    spends: list[tuple[WindowLimiter, int]] = []
    if not any(spec.exclusive for spec in route.budgets):
        spends.append((own, route.weight if limits.key_weighted else 1))
    spends.extend((lim, 1) for lim in limits.limiters[1:])
    tokens = False
    for spec in route.budgets:
        spends.append((budgets.limiter_for(spec, key_budgets), route.cost(spec)))
        tokens = tokens or spec.tokens
    ready, holder = now, None
    for lim, cost in spends:
        free = lim.next_free(now, cost)
        if free > ready:
            ready, holder = free, lim
    token_gates = limits.token_gates
    if ready > now:
        if holder in token_gates:
            return Hold(ready, behind=True)
        if lane is not None and tokens and holder in lane.own.values():
            return Hold(ready, lane=lane)  # this model's next requests wait behind this one
        return Hold(ready)
    leases = limits.leases
    slots = None
    if leases is not None:
        # A shared store grants the plan's budgets together: a lease for this plan, or none
        slots = leases.for_plan(spends, tokens)
        other = req.leasing
        if other is not None and other is not slots and (other.fetching or other.next_at(now) < math.inf):
            return PASS  # another key is getting (or holds) its slot: the ones behind are ours
        lease_at = slots.next_at(now)
        if lease_at > now + LEASE_EARLY_S:
            ask = None
            if lease_at == math.inf:  # none held: ask for one (the worker asks once a turn)
                ask = slots
                lease_at = slots.retry_at if slots.retry_at > now else math.inf
            # a token budget every request spends from: the ones behind wait for this lease too
            return Hold(lease_at, behind=any(lim in token_gates for lim, _ in spends), ask=ask)
    return Send(Plan(tuple(spends), slots, lane, tokens))
