"""A key's limits per model: one lane of buckets for each model its requests name.

OpenAI and Anthropic limit requests and tokens per organisation *and per
model*: a key at its limit for one model still has the whole of another's.
A budget with `scope = "key+model"` (and the key's own request limit with
`[keys] scope = "key+model"`) is one bucket per key and model, the model read
from the request body's `target.model_field`. Each model's lane also has its
own cooldown gate (a model's 429 pauses that model only), its own first
answer to wait for (`engine.learn_first`), its own refill window and server
counts, all learned from the answers to that model's requests.

Lanes are made on first use, from the key's policies and the budgets' specs:
a request costs one dict lookup to find its lane.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ratedeck.engine.gate import CooldownGate

if TYPE_CHECKING:
    from ratedeck.core.policy import Policy
    from ratedeck.engine.api_rules import BudgetSpec
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import EndpointSpec

#: A request whose body names no model (or not as text) spends from this lane.
NO_MODEL = "-"
#: A model name is kept to this many characters (a lane's label, the report's row).
MODEL_CHARS = 80
#: Lanes a key keeps at most; a request naming yet another model spends from the last one
#: (a workload naming thousands of models is a mistake, not a use).
MAX_LANES = 256


def lane_model(body: Any, field: tuple[str, ...]) -> str:
    """The lane a request body spends from: the model it names at `field` (the parts of
    `target.model_field`), cut to `MODEL_CHARS`; `NO_MODEL` when it names none."""
    node = body
    for part in field:
        if not isinstance(node, dict):
            return NO_MODEL
        node = node.get(part)
    return node[:MODEL_CHARS] if isinstance(node, str) and node else NO_MODEL


class ModelLane:
    """One model's buckets on one key: its request limiter (None when the key's own limit is
    not per model), its budgets by name (the key's plain ones too, so a route finds every
    budget it spends in one table), its gate, and what its answers taught."""

    __slots__ = (
        "model",
        "limiter",
        "budgets",
        "own",
        "gate",
        "first_pending",
        "first_out",
        "window_bound",
        "held_turn",
        "remaining",
        "limit",
        "reset_at",
        "sent",
        "rejected_429",
        "served",
    )

    def __init__(
        self,
        model: str,
        limiter: WindowLimiter | None,
        budgets: dict[str, WindowLimiter],
        own: dict[str, WindowLimiter],
        gate: CooldownGate,
        first_pending: bool,
        served: bool = True,
    ) -> None:
        self.model = model
        self.served = served  # the key's endpoint serves this model (False: its requests pass it by)
        self.limiter = limiter
        self.budgets = budgets
        self.own = own  # the budgets that are this model's alone (scope key+model)
        self.gate = gate
        self.first_pending = first_pending  # its first answer (its tier's headers) is awaited
        self.first_out = False  # that first request is in flight: the model's others wait
        self.window_bound = math.inf  # the shortest refill window its buckets proved
        self.held_turn = -1  # the worker's turn in which a token bucket held this model back
        self.remaining: int | None = None  # the server's requests count for this model
        self.limit: int | None = None
        self.reset_at: float | None = None
        self.sent = 0
        self.rejected_429 = 0

    def buckets(self) -> list[tuple[str, WindowLimiter]]:
        """(unit, limiter) for each bucket of this model: requests first, then its budgets."""
        out = [("requests", self.limiter)] if self.limiter is not None else []
        out.extend(self.own.items())
        return out


class ModelLanes:
    """A key's lanes by model, made on first use (see the module's docstring).

    `make(policies)` makes a limiter; `policies` are the key's own limits
    (None: the key's own limit is not per model); `specs` the budgets with
    scope key+model; `key_budgets` the key's plain key-scope budgets.
    """

    __slots__ = (
        "label",
        "field",
        "by_model",
        "_make",
        "_policies",
        "_specs",
        "_key_budgets",
        "learn_first",
        "for_answer",
        "_store_names",
        "_store_name",
        "endpoint",
    )

    def __init__(
        self,
        label: str,
        field: str,
        make: Callable[[tuple[Policy, ...]], WindowLimiter],
        *,
        policies: tuple[Policy, ...] | None,
        specs: tuple[BudgetSpec, ...],
        key_budgets: dict[str, WindowLimiter],
        learn_first: bool,
        store_names: dict[WindowLimiter, str] | None = None,
        store_name: Callable[[str, str], str] | None = None,
        endpoint: EndpointSpec | None = None,
    ) -> None:
        self.label = label
        self.field = tuple(field.split("."))
        self.by_model: dict[str, ModelLane] = {}
        self._make = make
        self._policies = policies
        self._specs = specs
        self._key_budgets = key_budgets
        self.learn_first = learn_first
        self.for_answer = False  # this turn, a model's first answer held its work back
        # With a shared store: the key's limiters' names there (`KeyLeases.store_names`), to
        # which each new lane adds its own, named by `store_name(unit, model)`, so every
        # member that uses the key spends one budget per model.
        self._store_names = store_names
        self._store_name = store_name
        # In a pool of endpoints: the models the key's endpoint serves, their limits told
        # there, and its preset's starting limits (settings.EndpointSpec).
        self.endpoint = endpoint

    @property
    def per_model_requests(self) -> bool:
        """The key's own request limit holds per model (`[keys] scope = "key+model"`)."""
        return self._policies is not None

    def model_of(self, req: Request) -> str:
        """The model `req`'s body names at the model field (`NO_MODEL` when none)."""
        shape = req.shape
        return lane_model(shape.body if shape is not None else None, self.field)

    def lane(self, req: Request) -> ModelLane:
        """The lane `req` spends from (made the first time its model is seen)."""
        model = self.model_of(req)
        lane = self.by_model.get(model)
        return lane if lane is not None else self._new(model)

    def _new(self, model: str) -> ModelLane:
        if len(self.by_model) >= MAX_LANES:
            return next(reversed(self.by_model.values()))
        make, policies, learn_first, served = self._make, self._policies, self.learn_first, True
        starts: Mapping[str, tuple[Policy, ...]] = {}
        endpoint = self.endpoint
        if endpoint is not None:
            served = endpoint.serves(model)
            starts = endpoint.starts
            route = endpoint.route(model)
            learn_first = endpoint.learn_first
            if route is not None:
                if route.requests and policies is not None:
                    policies = route.requests
                starts = {**starts, **route.budgets}
        limiter = make(policies) if policies else None
        own = {spec.name: make(starts.get(spec.name) or spec.policies) for spec in self._specs}
        gate = CooldownGate(f"{self.label} {model}")
        budgets = {**self._key_budgets, **own}
        lane = ModelLane(model, limiter, budgets, own, gate, learn_first and served, served)
        names, name_of = self._store_names, self._store_name
        if names is not None and name_of is not None:
            for unit, lim in lane.buckets():
                names[lim] = name_of(unit, model)
        self.by_model[model] = lane
        return lane

    def __iter__(self) -> Any:
        return iter(self.by_model.values())

    def __len__(self) -> int:
        return len(self.by_model)
