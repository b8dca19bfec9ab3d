"""What an LLM request costs in US dollars: validated prices, a price table, the arithmetic.

Prices are USD per million tokens, as both providers publish them. A `Price` is checked
here and only here (`parse_price`: a table of fields from a price file or a user's
config; `Price(...)` itself checks its values): the config layer reads the shipped files
(config/prices/*.toml) and the user's overrides, and hands the engine `Price` objects.

- `PriceTable.price_for(model)`: the model's price, or its family's for a dated
  snapshot (`gpt-4o-2024-08-06` -> `gpt-4o`, `claude-sonnet-4-5-20250929` ->
  `claude-sonnet-4-5`) unless the snapshot is listed itself; None for a model
  with no price (never 0: an unknown price is not a free one).
- `cost_usd(price, usage)`: an answer's cost from its `Usage` (engine/llm/usage.py: the
  shapes of OpenAI's and Anthropic's answers), or from a raw `usage` object.
- `estimate_range_usd(price, input_tokens, max_output_tokens)`: before sending,
  the cost if the model writes nothing .. if it writes its whole ceiling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ratedeck.core.numbers import show
from ratedeck.engine.llm.usage import Usage

#: Tokens per price unit: prices are per million tokens.
MILLION = 1_000_000

#: Anthropic prices cache writes as multiples of the base input price
#: (platform.claude.com/docs/en/about-claude/pricing, "Prompt caching"): a
#: 5-minute write 1.25x, a 1-hour write 2x. Used when a price lists no write price.
CACHE_WRITE_5M = 1.25
CACHE_WRITE_1H = 2.0

# A dated snapshot's suffix: -2024-08-06 (OpenAI), -20250929 (Anthropic), or -latest.
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model."""

    input: float
    output: float
    #: A cached input token (OpenAI's cached input, Anthropic's cache hit); None: billed as input.
    cached_input: float | None = None
    #: Anthropic's 5-minute cache write; None: CACHE_WRITE_5M x input.
    cache_write: float | None = None
    #: Anthropic's 1-hour cache write; None: CACHE_WRITE_1H x input.
    cache_write_1h: float | None = None

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if value is None and name not in REQUIRED:
                continue
            if not _is_price(value):
                raise PriceError(
                    name, f"must be a price in USD per million tokens (a number >= 0), got {show(value)}"
                )

    def fields(self) -> dict[str, float]:
        """The price as a table of fields (a config's `[prices."model"]`), unset ones left out."""
        return {name: value for name in FIELDS if (value := getattr(self, name)) is not None}


#: A price's fields, as a price file and a config name them; `REQUIRED` must be there.
FIELDS = ("input", "cached_input", "cache_write", "cache_write_1h", "output")
REQUIRED = ("input", "output")


class PriceError(ValueError):
    """A price that cannot be used: `field` (None: the whole table) and what is wrong with it."""

    def __init__(self, field: str | None, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}" if field else problem)


def parse_price(fields: Any) -> Price:
    """One model's price from a table of fields ({input = 2.5, output = 10}), checked field by
    field; `PriceError` names the field and the value."""
    if not isinstance(fields, Mapping):
        raise PriceError(
            None, f"must be a table of prices like {{input = 2.5, output = 10}}, got {show(fields)}"
        )
    for name in fields:
        if name not in FIELDS:
            raise PriceError(name, f"unknown field; known: {', '.join(FIELDS)}")
    for name in REQUIRED:
        if name not in fields:
            raise PriceError(name, "missing: a price in USD per million tokens")
    price = Price(**fields)
    return Price(**{name: float(value) for name, value in price.fields().items()})


def _is_price(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class PriceTable:
    """Prices by model name; a dated snapshot falls back to its family's price."""

    prices: Mapping[str, Price] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A read-only copy: the table is shared by every request that asks it.
        object.__setattr__(self, "prices", MappingProxyType(dict(self.prices)))

    def price_for(self, model: Any) -> Price | None:
        """The model's price, else its family's (a dated snapshot), else None."""
        if not isinstance(model, str) or not model:
            return None
        price = self.prices.get(model)
        if price is not None:
            return price
        family = _SNAPSHOT.sub("", model)
        if family != model:
            return self.prices.get(family)
        return None

    def merged(self, overrides: Mapping[str, Price]) -> PriceTable:
        """This table with `overrides` replacing (or adding) models."""
        return PriceTable({**self.prices, **overrides})


def cost_usd(price: Price, usage: Usage | Mapping[str, Any] | None) -> float:
    """The USD cost of one answer's usage (a `Usage`, or a `usage` object in either provider's shape)."""
    if not isinstance(usage, Usage):
        usage = Usage.of(usage)
        if usage is None:
            return 0.0
    cached_rate = price.input if price.cached_input is None else price.cached_input
    write_5m_rate = price.cache_write if price.cache_write is not None else CACHE_WRITE_5M * price.input
    write_1h_rate = price.cache_write_1h if price.cache_write_1h is not None else CACHE_WRITE_1H * price.input
    return (
        usage.uncached * price.input
        + usage.cached * cached_rate
        + usage.written_5m * write_5m_rate
        + usage.written_1h * write_1h_rate
        + usage.output * price.output
    ) / MILLION


def estimate_range_usd(price: Price, input_tokens: int, max_output_tokens: int) -> tuple[float, float]:
    """(low, high) USD before sending: the input alone .. the input plus the whole output ceiling."""
    low = max(0, input_tokens) * price.input / MILLION
    return low, low + max(0, max_output_tokens) * price.output / MILLION
