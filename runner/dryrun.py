"""`ratedeck --dry-run`: the bill and the least time of a job before anything is sent.

The whole workload file is read and checked as a run reads it (a bad line is
one message naming the file and line, exit 2), and nothing is sent. Per model
it says the requests, their input tokens (estimated as the token budgets
estimate them, engine/limits/costs.py, images by their provider's rule), the
output ceiling (`max_tokens`, else `max_completion_tokens`, else
`[costs] max_tokens`) and the cost as a range: the input alone (the model
writes nothing) to the input plus the whole ceiling. A model with no price is
"unknown", never $0.

The least time is what the limits told (flags, config) or set by the preset
allow for the whole job with the keys given (engine/observe/makespan.py
`least_time`, bursts counted, no round trip): each key's own limits count
requests (or weight), each named budget what the job spends from it. A token
budget counts what admission reserves (the input and the whole ceiling); a
budget that gives back unused output (`settle`) may let the job finish
sooner, so its figure is an upper bound.

`--report FILE` writes the same as JSON (`-`: stdout).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from ratedeck.config import ConfigError, RunConfig
from ratedeck.core.exits import ExitCode
from ratedeck.core.files import private_write_text
from ratedeck.core.numbers import usd_range
from ratedeck.core.policy import Policy
from ratedeck.engine.api_rules import BudgetSpec, PathTable
from ratedeck.engine.limits.costs import CostModel
from ratedeck.engine.llm.prices import Price, PriceTable, estimate_range_usd
from ratedeck.engine.observe.makespan import Limits, least_time
from ratedeck.engine.observe.spend import model_of, price_table
from ratedeck.engine.settings import EngineSettings, KeySpec
from ratedeck.engine.sources.workload import Workload, take_shape

#: The row of lines whose body names no model (not LLM calls: they cost nothing here).
NO_MODEL = "(no model)"


@dataclass
class ModelBill:
    """One model's share of the job."""

    model: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens_max: int = 0
    usd_min: float | None = 0.0  # None: no price
    usd_max: float | None = 0.0


@dataclass
class DryRun:
    """What a job would cost and the least time its limits allow; nothing sent."""

    file: str
    requests: int = 0
    models: list[ModelBill] = field(default_factory=list)
    usd_min: float = 0.0  # the priced models' sum
    usd_max: float = 0.0
    unpriced: list[str] = field(default_factory=list)
    keys: int = 0
    least_s: float | None = None  # None: a key's limit is not known before its first answer
    learned: bool = False  # the limits are a start the keys correct from their first answers
    sent: int = 0  # always 0: a dry run sends nothing

    def report(self) -> dict[str, Any]:
        return {"dry_run": True, **asdict(self)}


class _Units:
    """What the job spends from each budget: the keys' own limits and each named budget."""

    def __init__(self, cfg: EngineSettings) -> None:
        self.cfg = cfg
        self.paths = PathTable(cfg.paths)
        self.key_units = 0
        self.requests = 0
        self.budgets: dict[str, int] = dict.fromkeys((b.name for b in cfg.budgets), 0)

    def add(self, path: str, weight: int, named: Sequence[str], units: dict[str, int]) -> None:
        rule = self.paths.lookup(path)
        if rule is not None and weight == 1:
            weight = rule.weight
        names = set(named) | set(rule.budgets if rule is not None else ())
        chosen = [b for b in self.cfg.budgets if b.name in names or not b.paths or b.covers(path)]
        self.requests += 1
        if not any(b.exclusive for b in chosen):
            self.key_units += weight if self.cfg.key_weighted else 1
        for b in chosen:
            self.budgets[b.name] += _cost(b, weight, units)

    def least_s(self) -> float | None:
        cfg = self.cfg
        if not cfg.keys or any(not k.policies for k in cfg.keys):
            return None
        keys = [Limits(_told(k) or k.policies) for k in cfg.keys]
        demands: list[tuple[Sequence[Limits], float]] = [(keys, self.key_units)]
        if cfg.host_policies:
            demands.append(([Limits(cfg.host_policies)], self.requests))
        for b in cfg.budgets:
            if b.scope == "host":
                group = [Limits(b.policies)]
            else:
                group = [Limits(_told(k, b.name) or b.policies) for k in cfg.keys]
            demands.append((group, self.budgets[b.name]))
        return least_time(demands)


def _prices_of(cfg: EngineSettings, prices: PriceTable, model: str) -> list[Price]:
    """`model`'s price, or in a pool its price at each endpoint that serves it (an endpoint's
    own `prices` over the run's); empty when it has none."""
    if not cfg.endpoints:
        price = prices.price_for(model)
        return [price] if price is not None else []
    at = (prices.merged(e.prices).price_for(model) for e in cfg.endpoints if e.serves(model))
    return [p for p in at if p is not None]


def _told(key: KeySpec, budget: str | None = None) -> tuple[Policy, ...]:
    """A pool endpoint's limits for `key` (`EndpointSpec.told`); () outside a pool."""
    return key.endpoint.told(budget) if key.endpoint is not None else ()


def _cost(spec: BudgetSpec, weight: int, units: dict[str, int]) -> int:
    if spec.unit == "requests":
        return 1
    if spec.unit == "weight":
        return weight
    return units.get(spec.unit, 0)


def _lines(cfg: EngineSettings) -> Iterator[dict[str, Any]]:
    """The workload's lines, every one checked first (a `ConfigError` names a bad one)."""
    items = Workload.from_config(cfg, random.Random(0)).items
    assert items is not None
    return items


def plan(cfg: EngineSettings) -> DryRun:
    """Read the whole workload and add up what it would cost; raises `ConfigError` on a bad line."""
    assert cfg.workload.file is not None
    prices = price_table(cfg.prices)
    costs = CostModel(cfg.costs.estimate, cfg.costs.max_tokens)
    target_path = _target_path(cfg.target.url)
    bills: dict[str, ModelBill] = {}
    spent = _Units(cfg)
    for params in _lines(cfg):
        params.pop("_pool", None)
        params.pop("_key", None)
        params.pop("_id", None)
        shape = take_shape(params)
        body = shape.body if shape is not None else None
        try:
            units = costs.units(body)
        except ValueError as exc:  # a cost hook that returned no count
            raise ConfigError(cfg.workload.file, "costs.estimate", str(exc)) from None
        model = model_of(body)
        bill = bills.setdefault(model or NO_MODEL, ModelBill(model or NO_MODEL))
        bill.requests += 1
        if model is not None:
            bill.input_tokens += units["input_tokens"]
            bill.output_tokens_max += units["output_tokens"]
        path = shape.path if shape is not None and shape.path else target_path
        weight = shape.weight if shape is not None else 1
        spent.add(path, weight, shape.budgets if shape is not None else (), units)
    out = DryRun(cfg.workload.file, spent.requests, keys=len(cfg.keys), learned=cfg.engine.learn_first)
    for bill in bills.values():
        if bill.model != NO_MODEL:
            found = _prices_of(cfg, prices, bill.model)
            if not found:
                bill.usd_min = bill.usd_max = None
                out.unpriced.append(bill.model)
            else:
                # in a pool, any endpoint that serves it may answer: the cheapest one's least to the dearest's most
                ranges = [estimate_range_usd(p, bill.input_tokens, bill.output_tokens_max) for p in found]
                bill.usd_min, bill.usd_max = min(r[0] for r in ranges), max(r[1] for r in ranges)
                out.usd_min += bill.usd_min
                out.usd_max += bill.usd_max
        out.models.append(bill)
    out.least_s = spent.least_s()
    return out


def _target_path(url: str | None) -> str:
    from urllib.parse import urlsplit

    if not url:
        return "/"
    try:
        return urlsplit(url).path or "/"
    except ValueError:
        return "/"


def table(run: DryRun) -> list[str]:
    """The printed dry run: one line per model, the total, the least time."""
    lines = [f"ratedeck dry run: {run.file}, {run.requests:,} requests; nothing sent", ""]
    rows = [("model", "requests", "input tokens", "output ceiling", "cost")]
    for b in run.models:
        cost = usd_range(b.usd_min, b.usd_max)
        if b.usd_min is None:
            cost += f' (no price: add [prices."{b.model}"])'
        rows.append((b.model, f"{b.requests:,}", f"{b.input_tokens:,}", f"{b.output_tokens_max:,}", cost))
    total = usd_range(run.usd_min, run.usd_max)
    if run.unpriced:
        total += f" + {', '.join(run.unpriced)} unknown"
    rows.append(
        (
            "total",
            f"{run.requests:,}",
            f"{sum(b.input_tokens for b in run.models):,}",
            f"{sum(b.output_tokens_max for b in run.models):,}",
            total,
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append(
            f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]}"
        )
    lines.append("")
    lines.append(_least_line(run))
    return lines


def _least_line(run: DryRun) -> str:
    keys = f"{run.keys} key{'' if run.keys == 1 else 's'}"
    if run.least_s is None:
        return (
            f"least time   not known: a key's limit is learned from its first answer ({keys}; give --limit)"
        )
    line = f"least time   {_duration(run.least_s)} with {keys}, by the limits told or the preset's (bursts counted)"
    if run.learned:
        # The preset's limits are where a key starts: its tier comes with its first answer.
        line += (
            "\n             the keys learn their tier from their first answers: unless these limits are"
            "\n             your tier's (told with --limit and [[budgets]]), the real time differs"
        )
    return line


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def dry_run(cfg: RunConfig, out: TextIO | None = None) -> int:
    """Check the workload, print the bill and the least time, write `--report`; send nothing."""
    out = out or (sys.stderr if cfg.runner.report == "-" else sys.stdout)
    es = cfg.engine_settings
    if es.workload.file is None:
        print("ratedeck: --dry-run: needs a workload file (--workload FILE)", file=sys.stderr)
        return ExitCode.USAGE
    try:
        run = plan(es)
    except ConfigError as exc:
        print(f"ratedeck: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print("\n".join(table(run)), file=out)
    report = cfg.runner.report
    if report is not None:
        text = json.dumps(run.report(), indent=2) + "\n"
        try:
            if report == "-":
                sys.stdout.write(text)
            else:
                private_write_text(report, text)
        except (OSError, ValueError) as exc:
            print(
                f"ratedeck: --report {report}: cannot write: {getattr(exc, 'strerror', None) or exc}",
                file=sys.stderr,
            )
            return ExitCode.OUTPUT
    return ExitCode.OK
