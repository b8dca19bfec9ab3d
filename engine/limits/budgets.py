"""Which budgets a request spends from, and how much of each.

Every request spends from its key's own budget and, with a host-wide limit,
the host's (one unit each, or its weight where the key's budget counts
weight). Named budgets (`[[budgets]]`) add more: a key-scope budget (one per
key, like GitHub's search limit per token) or a host-scope one (shared, like
Binance's weight per IP), or a key-and-model one (one per key and the model
the request names, like OpenAI's and Anthropic's limits); a request belongs to those whose `paths` match its
path, those its path rule names, and those its workload line names. All are
spent together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ratedeck.core.policy import Policy
from ratedeck.engine.api_rules import BudgetSpec, PathTable
from ratedeck.engine.request import Request
from ratedeck.engine.settings import EngineSettings

from .costs import CostModel, Units
from .limiter import WindowLimiter

MakeLimiter = Callable[[tuple[Policy, ...]], WindowLimiter]


@dataclass(frozen=True, slots=True)
class Route:
    """What one request spends: its weight, its tokens, and the named budgets it belongs to."""

    weight: int
    budgets: tuple[BudgetSpec, ...]
    units: Units | None = None  # its estimated tokens, when a budget counts tokens

    def cost(self, spec: BudgetSpec) -> int:
        """What it spends from `spec`: its weight, its tokens in the budget's unit, or 1."""
        unit = spec.unit
        if unit == "requests":
            return 1
        if unit == "weight":
            return self.weight
        return self.units.get(unit, 0) if self.units is not None else 0


_PLAIN = Route(1, ())


class Budgets:
    """The run's named budgets: host-scope limiters (shared) and the key-scope specs (one limiter per key)."""

    def __init__(self, cfg: EngineSettings, make_limiter: MakeLimiter):
        self.specs = {b.name: b for b in cfg.budgets}
        self.host = {b.name: make_limiter(b.policies) for b in cfg.budgets if b.scope == "host"}
        self.key_specs = tuple(b for b in cfg.budgets if b.scope == "key")
        self.model_specs = tuple(b for b in cfg.budgets if b.per_model)  # one per key and model
        self.paths = PathTable(cfg.paths)
        self.target_path = _path_of(cfg.target.url)
        # With no budgets and no path rules every request is alike: the workers skip routing.
        self.routing = bool(cfg.budgets or cfg.paths or cfg.key_weighted or cfg.key_per_model)
        self.covering = tuple(b for b in cfg.budgets if not b.paths)  # budgets every request spends
        # Token budgets: a request's tokens are estimated once from its body (engine/limits/costs.py).
        self.costs = (
            CostModel(cfg.costs.estimate, cfg.costs.max_tokens)
            if any(b.tokens for b in cfg.budgets)
            else None
        )
        self.settled = tuple(b for b in cfg.budgets if b.settle)  # budgets settled to the real use

    def units(self, req: Request) -> Units | None:
        """The request's estimated tokens (once per request: kept on it), or None with no token budget."""
        if self.costs is None:
            return None
        units = req.units
        if units is None:
            shape = req.shape
            units = req.units = self.costs.units(shape.body if shape is not None else None)
        return units

    def route(self, req: Request) -> Route:
        """The request's weight and named budgets (its shape, then its path's rule, then the budgets' paths)."""
        if not self.routing:
            return _PLAIN if req.shape is None else Route(req.shape.weight, ())
        shape = req.shape
        path = shape.path if shape is not None and shape.path else self.target_path
        rule = self.paths.lookup(path)
        weight = shape.weight if shape is not None and shape.weight != 1 else (rule.weight if rule else 1)
        names: list[str] = []
        if rule is not None:
            names.extend(rule.budgets)
        if shape is not None:
            names.extend(shape.budgets)
        chosen = [b for b in self.specs.values() if b.name in names or (b.paths and b.covers(path))]
        chosen.extend(b for b in self.covering if b not in chosen)
        return Route(weight, tuple(chosen), self.units(req))

    def limiter_for(self, spec: BudgetSpec, key_budgets: dict[str, WindowLimiter]) -> WindowLimiter:
        """`spec`'s limiter: the host's, else the key's in `key_budgets` (a model's lane's
        table for a budget per key and model, engine/path/lanes.py)."""
        return self.host[spec.name] if spec.scope == "host" else key_budgets[spec.name]


def _path_of(url: str | None) -> str:
    if not url:
        return "/"
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).path or "/"
    except ValueError:
        return "/"
