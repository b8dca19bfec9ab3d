"""admit as a table: what a key's limits, lanes, leases and pools say of one request, as a value.

`admit` only reads its view, so the view here is made of plain stand-ins: limiters that
say when they are free, a route, a model's lane, a lease holder. Each row is one case
of "can this key send this request now", and the decision it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ratedeck.engine.path.admit import PASS, Hold, KeyView, Pass, Plan, Send, admit
from ratedeck.engine.request import Request

NOW = 1.0
TURN = 7


@dataclass(eq=False)
class Lim:
    """A limiter that is free at `free_at` (whatever the cost)."""

    name: str
    free_at: float = 0.0

    def next_free(self, now: float, cost: int = 1) -> float:
        return max(now, self.free_at)

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Spec:
    name: str
    tokens: bool = False
    exclusive: bool = False
    cost: int = 1


@dataclass
class Route:
    weight: int
    budgets: tuple[Spec, ...]

    def cost(self, spec: Spec) -> int:
        return spec.cost


@dataclass
class Budgets:
    route_: Route

    def route(self, req: Request) -> Route:
        return self.route_

    def limiter_for(self, spec: Spec, key_budgets: dict[str, Lim]) -> Lim:
        return key_budgets[spec.name]


@dataclass(eq=False)
class Slots:
    """A lease holder: a granted time at `at` (inf: none held), no fetch before `retry_at`."""

    at: float = math.inf
    retry_at: float = 0.0
    fetching: bool = False

    def next_at(self, now: float) -> float:
        return self.at


@dataclass
class Leases:
    slots: Slots
    default: Slots = field(default_factory=Slots)
    fetching: int = 0

    def for_plan(self, spends: list[tuple[Lim, int]], tokens: bool) -> Slots:
        return self.slots


OWN, HOST, TOK, TPM = Lim("own"), Lim("host"), Lim("tok"), Lim("tpm")


def view(
    *,
    free: dict[str, float] | None = None,
    budgets: tuple[Spec, ...] | None = None,
    weight: int = 1,
    weighted: bool = False,
    host: bool = False,
    gates: tuple[str, ...] = (),
    pool_full: bool | None = None,
    lane: Any = None,
    leases: Leases | None = None,
) -> KeyView:
    """A key's view: limiters free at the times in `free` (by name), the route's `budgets`
    (None: requests do not route), token budgets every request spends from (`gates`)."""
    lims = {lim.name: Lim(lim.name, (free or {}).get(lim.name, 0.0)) for lim in (OWN, HOST, TOK, TPM)}
    limits = SimpleNamespace(
        limiter=lims["own"],
        limiters=(lims["own"], lims["host"]) if host else (lims["own"],),
        key_budgets={"tok": lims["tok"], "tpm": lims["tpm"]},
        key_weighted=weighted,
        token_gates=frozenset(lims[name] for name in gates),
        lanes=SimpleNamespace(lane=lambda req: lane) if lane is not None else None,
        leases=leases,
    )
    if lane is not None:
        lane.limiter, lane.budgets = lims["own"], {"tok": lims["tok"], "tpm": lims["tpm"]}
        lane.own = {"tpm": lims["tpm"]}
    route = Budgets(Route(weight, budgets)) if budgets is not None else None
    pool_room = (lambda pool: not pool_full) if pool_full is not None else None
    default = Send(Plan(((lims["own"], 1),)))
    return KeyView(limits, route, pool_room, default)  # type: ignore[arg-type]


def a_lane(*, open_at: float = 0.0, first_out: bool = False, held_turn: int = -1, served: bool = True) -> Any:
    return SimpleNamespace(
        gate=SimpleNamespace(open_at=open_at), first_out=first_out, held_turn=held_turn, served=served
    )


def spent(decision: Send | Hold | Pass) -> list[tuple[str, int]]:
    assert isinstance(decision, Send)
    return [(lim.name, cost) for lim, cost in decision.plan.spends]


TOKENS = Spec("tok", tokens=True, cost=120)


@pytest.mark.parametrize(
    "case, key, expected",
    [
        # -- requests that spend alike: the key's one plan, or the pool's veto
        ("no routes, no pools: the key's plan", view(), "default"),
        ("a full pool: the next request may go", view(pool_full=True), PASS),
        ("a pool with room: the key's plan", view(pool_full=False), "default"),
        ("budgets, but the pool is full", view(budgets=(TOKENS,), pool_full=True), PASS),
        # -- routed budgets: every limiter the request spends, and how much
        ("all free: own 1 and the tokens' cost", view(budgets=(TOKENS,)), [("own", 1), ("tok", 120)]),
        ("the host's limit is spent too", view(budgets=(), host=True), [("own", 1), ("host", 1)]),
        ("a weighted key spends the weight", view(budgets=(), weight=5, weighted=True), [("own", 5)]),
        ("an unweighted key spends 1", view(budgets=(), weight=5), [("own", 1)]),
        (
            "an exclusive budget replaces the key's",
            view(budgets=(Spec("tok", exclusive=True),)),
            [("tok", 1)],
        ),
        # -- held: until the latest limiter frees
        ("own limit full", view(budgets=(TOKENS,), free={"own": 2.0}), Hold(2.0)),
        ("latest of two wins", view(budgets=(TOKENS,), free={"own": 2.0, "tok": 3.0}), Hold(3.0)),
        (
            "a token budget every request spends: the ones behind wait too",
            view(budgets=(TOKENS,), free={"tok": 3.0}, gates=("tok",)),
            Hold(3.0, behind=True),
        ),
        (
            "a token budget not every request spends: only this one waits",
            view(budgets=(TOKENS,), free={"tok": 3.0}),
            Hold(3.0),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_admit_table(case: str, key: KeyView, expected: Any) -> None:
    decision = admit(Request(1, 0.0, 10.0), key, NOW, TURN)
    if expected == "default":
        assert decision is key.default
    elif isinstance(expected, list):
        assert spent(decision) == expected
    else:
        assert decision == expected


@pytest.mark.parametrize(
    "case, lane, free, expected",
    [
        ("its gate is closed: until it opens", a_lane(open_at=4.0), {}, Hold(4.0)),
        ("the key's endpoint does not serve its model: another key's will", a_lane(served=False), {}, PASS),
        ("its first answer is awaited", a_lane(first_out=True), {}, Hold(math.inf, answer=True)),
        ("an earlier request held it this turn", a_lane(held_turn=TURN), {}, PASS),
        ("held in an earlier turn: it may go", a_lane(held_turn=TURN - 1), {}, "send"),
        ("its own token bucket is full: the lane is held", a_lane(), {"tpm": 5.0}, "held-lane"),
        ("its request bucket is full: only this one", a_lane(), {"own": 5.0}, Hold(5.0)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_admit_table_per_model_lanes(case: str, lane: Any, free: dict[str, float], expected: Any) -> None:
    key = view(budgets=(Spec("tpm", tokens=True, cost=50),), lane=lane, free=free)
    decision = admit(Request(1, 0.0, 10.0), key, NOW, TURN)
    if expected == "send":
        assert isinstance(decision, Send) and decision.plan.lane is lane and decision.plan.tokens
    elif expected == "held-lane":
        assert decision == Hold(5.0, lane=lane)
    else:
        assert decision == expected


def test_admit_table_leases() -> None:
    """With a shared store, a plan goes only at a time it granted (`Plan.slots`)."""
    budgets = (TOKENS,)
    held = Slots(at=NOW)
    d = admit(Request(1, 0.0, 10.0), view(budgets=budgets, leases=Leases(held)), NOW, TURN)
    assert isinstance(d, Send) and d.plan.slots is held
    later = Slots(at=1.5)
    d = admit(Request(1, 0.0, 10.0), view(budgets=budgets, leases=Leases(later)), NOW, TURN)
    assert d == Hold(1.5)
    none = Slots(retry_at=2.5)  # none held, the store said full until 2.5: ask, then wait
    d = admit(Request(1, 0.0, 10.0), view(budgets=budgets, leases=Leases(none)), NOW, TURN)
    assert d == Hold(2.5, ask=none)
    none = Slots()  # none held, nothing known: ask; a token gate holds the ones behind too
    d = admit(Request(1, 0.0, 10.0), view(budgets=budgets, leases=Leases(none), gates=("tok",)), NOW, TURN)
    assert d == Hold(math.inf, behind=True, ask=none) and d.stop
    leased_elsewhere = Request(1, 0.0, 10.0)
    leased_elsewhere.leasing = Slots(fetching=True)  # another key is getting its slot
    assert admit(leased_elsewhere, view(budgets=budgets, leases=Leases(held)), NOW, TURN) is PASS


def test_what_the_queue_reads_of_each_decision() -> None:
    """`take` and `stop` (ports.Admission): a Send takes, a Hold of every request stops."""
    assert (Send(Plan(())).take, Send(Plan(())).stop) == (True, False)
    assert (Hold(2.0).take, Hold(2.0).stop, Hold(2.0, behind=True).stop) == (False, False, True)
    assert (PASS.take, PASS.stop) == (False, False)
