"""What the run spends in US dollars, and the `--max-cost` cap on admission.

Spend comes from the answers, never from the estimate: each answer's `Usage`
(engine/llm/usage.py: its body parsed once, either provider's shape) at the price of the
model its request named, added per model and per key. A model with no price
is said once (one event) and its spend is unknown (`SpendRow.usd` None),
never counted as 0. A request without a JSON body naming a `model` is not an
LLM call and costs nothing here.

The estimate is the reservation. With a cap (`max_cost`), a job's source asks
`admit` before it queues a request: the request's most possible cost (its
input tokens as engine/limits/costs.py estimates them, plus its whole output
ceiling, at its model's price) is reserved until the request ends; it is
admitted while spent + reserved + its own reservation stay within the cap.
When they would not, admission waits for a reservation to end (a settled
answer usually costs less than its ceiling), and stops for good when nothing
is reserved any more and the request still does not fit, or when its model
has no price (its cost cannot be bounded). In-flight requests finish; the
source stops making requests, so a file's remaining lines are not sent and a
store's stay pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ratedeck.core.numbers import usd
from ratedeck.core.vocab import EventKind, OutcomeKind
from ratedeck.engine.limits.costs import CostModel
from ratedeck.engine.llm.prices import Price, PriceTable, cost_usd, estimate_range_usd
from ratedeck.engine.llm.usage import usage_of
from ratedeck.engine.snapshot import Spend, SpendRow

if TYPE_CHECKING:
    from ratedeck.core.vocab import Ending
    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.ports import EventSink
    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import EngineSettings

__all__ = ["SpendMeter", "merge_spend", "model_of", "price_table"]


def price_table(prices: Mapping[str, Price]) -> PriceTable:
    """The engine's prices (`EngineSettings.prices`) as a `PriceTable`."""
    return PriceTable(prices)


def model_of(body: Any) -> str | None:
    """The `model` a JSON request body names, or None (not an LLM call)."""
    if isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and model:
            return model
    return None


def _body_of(req: Request) -> Any:
    shape = req.shape
    return shape.body if shape is not None else None


class _Tally:
    """One (model, key) row as it adds up."""

    __slots__ = ("answers", "input_tokens", "output_tokens", "usd", "unmetered")

    def __init__(self) -> None:
        self.answers = self.input_tokens = self.output_tokens = self.unmetered = 0
        self.usd = 0.0


class SpendMeter:
    """Spend per model and key from the answers' usage; reservations and the cap on admission.

    `answered` is called once per answer (engine/path/request_path.py), `admit`
    by a job's source before it queues a request (`gating`: only with a cap),
    `finished` (a finish watcher) ends a request's reservation.
    """

    __slots__ = (
        "prices",
        "by_key",
        "costs",
        "cap",
        "event",
        "spent",
        "reserved",
        "capped",
        "_rows",
        "_unpriced",
        "_holds",
        "_freed",
    )

    def __init__(
        self,
        prices: PriceTable,
        costs: CostModel,
        events: EventSink,
        cap: float | None = None,
        by_key: Mapping[str, PriceTable] | None = None,
    ) -> None:
        self.prices = prices
        # A pool's keys whose endpoint has prices of its own: their answers cost those
        self.by_key = dict(by_key or {})
        self.costs = costs
        self.cap = cap
        self.event = events.event
        self.spent = 0.0  # USD of the priced answers
        self.reserved = 0.0  # USD held by requests admitted and not ended
        self.capped = False
        self._rows: dict[tuple[str, str], _Tally] = {}
        self._unpriced: dict[str, None] = {}  # models said to have no price, in order
        self._holds: dict[int, float] = {}  # request id -> its reservation
        self._freed: asyncio.Event | None = None

    @classmethod
    def from_settings(cls, cfg: EngineSettings, events: EventSink) -> SpendMeter:
        costs = CostModel(cfg.costs.estimate, cfg.costs.max_tokens)
        table = price_table(cfg.prices)
        by_key = {
            k.label: table.merged(k.endpoint.prices)
            for k in cfg.keys
            if k.endpoint is not None and k.endpoint.prices
        }
        return cls(table, costs, events, cfg.max_cost, by_key)

    @property
    def gating(self) -> bool:
        """Whether a source must ask `admit` before queueing: a cap is set."""
        return self.cap is not None

    # ------------------------------------------------------------ prices
    def _price(self, model: str, key: str | None = None) -> Price | None:
        """`model`'s price at `key`'s endpoint (None: the run's); the first missing one is said."""
        table = self.by_key.get(key, self.prices) if key is not None else self.prices
        price = table.price_for(model)
        if price is None and model not in self._unpriced:
            self._unpriced[model] = None
            self.event(
                EventKind.ERROR,
                f'no price for model {model!r}: its spend is unknown (add [prices."{model}"] to the config)',
            )
        return price

    def ceiling_usd(self, body: Any) -> float | None:
        """The most a request with `body` may cost: its estimated input and whole output ceiling
        at its model's price; 0.0 for a body naming no model, None for a model with no price."""
        model = model_of(body)
        if model is None:
            return 0.0
        price = self._price(model)
        if price is None:
            return None
        units = self.costs.units(body)
        # not sent yet, so not known where: the dearest endpoint's price holds it
        prices = [price, *(p for t in self.by_key.values() if (p := t.price_for(model)) is not None)]
        return max(estimate_range_usd(p, units["input_tokens"], units["output_tokens"])[1] for p in prices)

    # ------------------------------------------------------------ admission
    async def admit(self, req: Request) -> bool:
        """Reserve `req`'s ceiling within the cap, waiting for reservations to end while it does
        not fit; False (and `capped`) when it never can: the source stops."""
        if self.capped:
            return False
        cap = self.cap
        need = self.ceiling_usd(_body_of(req))
        if cap is None or need == 0.0:
            return True
        if need is None:
            return self._stop(f"model {model_of(_body_of(req))!r} has no price, so its cost cannot be capped")
        while self.spent + self.reserved + need > cap + 1e-12:
            if not self._holds:
                return self._stop(
                    f"the next request may cost up to {usd(need)}, and {usd(self.spent)} is spent"
                )
            if self._freed is None:
                self._freed = asyncio.Event()
            self._freed.clear()
            await self._freed.wait()
        self._holds[req.id] = need
        self.reserved += need
        return True

    def _stop(self, why: str) -> bool:
        self.capped = True
        self.event(
            EventKind.INFO,
            f"cost cap {usd(self.cap)} reached: {why}; no new requests, those in flight finish",
        )
        return False

    def finished(self, req: Request, ending: Ending) -> None:
        """`req` ended: its reservation is given up (its answers are counted already)."""
        held = self._holds.pop(req.id, None)
        if held is None:
            return
        self.reserved = max(0.0, self.reserved - held) if self._holds else 0.0
        if self._freed is not None:
            self._freed.set()

    # ------------------------------------------------------------ answers
    def answered(self, req: Request, result: Outcome) -> None:
        """One answer: its usage at its model's price, added to its model's and key's row."""
        body = _body_of(req)
        model = model_of(body)
        if model is None:
            return
        usage = usage_of(result) if result.status is not None else None
        if usage is None:
            if result.kind is OutcomeKind.OK:  # a success that reported no usage: its cost is not known
                self._row(model, req.key or result.key or "").unmetered += 1
            return
        row = self._row(model, req.key or result.key or "")
        row.answers += 1
        row.input_tokens += usage.input
        row.output_tokens += usage.output
        price = self._price(model, req.key or result.key)
        if price is not None:
            usd = cost_usd(price, usage)
            row.usd += usd
            self.spent += usd

    def _row(self, model: str, key: str) -> _Tally:
        row = self._rows.get((model, key))
        if row is None:
            row = self._rows[(model, key)] = _Tally()
        return row

    # ------------------------------------------------------------ reading
    def view(self) -> Spend | None:
        """The bill so far; None when no answer named a model and no cap is set."""
        if not self._rows and self.cap is None:
            return None
        rows = tuple(
            SpendRow(
                model,
                key,
                t.answers,
                t.input_tokens,
                t.output_tokens,
                None if model in self._unpriced else round(t.usd, 9),
                t.unmetered,
            )
            for (model, key), t in sorted(self._rows.items())
        )
        return Spend(
            rows,
            round(self.spent, 9),
            tuple(m for m in self._unpriced if any(r.model == m for r in rows)),
            round(self.reserved, 9),
            self.cap,
            self.capped,
        )


def merge_spend(parts: list[Spend | None]) -> Spend | None:
    """Several processes' bills as one (`--procs`): rows, totals and reservations add up."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    unpriced = tuple(dict.fromkeys(m for p in known for m in p.unpriced))
    return Spend(
        tuple(sorted((r for p in known for r in p.rows), key=lambda r: (r.model, r.key))),
        sum(p.total_usd for p in known),
        unpriced,
        sum(p.reserved_usd for p in known),
        known[0].cap_usd,
        any(p.capped for p in known),
    )
