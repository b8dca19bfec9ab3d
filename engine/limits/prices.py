"""What an LLM request costs in US dollars: a price table and the arithmetic on an answer's usage.

Pure: the table arrives built (the config layer reads the shipped TOML files,
config/prices/*.toml, and the user's overrides). Prices are USD per million
tokens, as both providers publish them.

- `PriceTable.price_for(model)`: the model's price, or its family's for a dated
  snapshot (`gpt-4o-2024-08-06` -> `gpt-4o`, `claude-sonnet-4-5-20250929` ->
  `claude-sonnet-4-5`) unless the snapshot is listed itself; None for a model
  with no price (never 0: an unknown price is not a free one).
- `cost_usd(price, usage)`: an answer's cost from its `usage`, in either
  provider's shape (below).
- `estimate_range_usd(price, input_tokens, max_output_tokens)`: before sending,
  the cost if the model writes nothing .. if it writes its whole ceiling.

Usage shapes:
- OpenAI Chat Completions: `prompt_tokens` (cached ones included),
  `prompt_tokens_details.cached_tokens`, `completion_tokens` (reasoning included).
- OpenAI Responses: `input_tokens` (cached included),
  `input_tokens_details.cached_tokens`, `output_tokens`.
- Anthropic Messages: `input_tokens` (after the last cache breakpoint, so cache
  reads and writes are NOT in it), `cache_read_input_tokens`,
  `cache_creation_input_tokens` (optionally split by lifetime in
  `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`),
  `output_tokens`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

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
        for name in ("input", "output", "cached_input", "cache_write", "cache_write_1h"):
            value = getattr(self, name)
            if value is None and name not in ("input", "output"):
                continue
            if not _is_price(value):
                raise ValueError(f"{name} must be a price in USD per million tokens (>= 0), got {value!r}")


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


def _count(value: Any) -> int:
    """A token count from an answer; anything else (absent, null, text) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def _detail(usage: Mapping[str, Any], name: str, key: str) -> int:
    details = usage.get(name)
    return _count(details.get(key)) if isinstance(details, Mapping) else 0


def cost_usd(price: Price, usage: Any) -> float:
    """The USD cost of one answer's `usage`, in OpenAI's or Anthropic's shape."""
    if not isinstance(usage, Mapping):
        return 0.0
    cached_rate = price.input if price.cached_input is None else price.cached_input
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        # Chat Completions: prompt_tokens includes the cached ones.
        prompt = _count(usage.get("prompt_tokens"))
        cached = min(prompt, _detail(usage, "prompt_tokens_details", "cached_tokens"))
        out = _count(usage.get("completion_tokens"))
        return ((prompt - cached) * price.input + cached * cached_rate + out * price.output) / MILLION
    inp = _count(usage.get("input_tokens"))
    out = _count(usage.get("output_tokens"))
    if "input_tokens_details" in usage:
        # Responses API: input_tokens includes the cached ones.
        cached = min(inp, _detail(usage, "input_tokens_details", "cached_tokens"))
        return ((inp - cached) * price.input + cached * cached_rate + out * price.output) / MILLION
    # Anthropic: input_tokens excludes cache reads and writes, which are counted apart.
    read = _count(usage.get("cache_read_input_tokens"))
    write_5m_rate = price.cache_write if price.cache_write is not None else CACHE_WRITE_5M * price.input
    write_1h_rate = price.cache_write_1h if price.cache_write_1h is not None else CACHE_WRITE_1H * price.input
    split = usage.get("cache_creation")
    if isinstance(split, Mapping):
        write_5m = _count(split.get("ephemeral_5m_input_tokens"))
        write_1h = _count(split.get("ephemeral_1h_input_tokens"))
    else:
        # No split given: the default lifetime, 5 minutes.
        write_5m, write_1h = _count(usage.get("cache_creation_input_tokens")), 0
    return (
        inp * price.input
        + read * cached_rate
        + write_5m * write_5m_rate
        + write_1h * write_1h_rate
        + out * price.output
    ) / MILLION


def estimate_range_usd(price: Price, input_tokens: int, max_output_tokens: int) -> tuple[float, float]:
    """(low, high) USD before sending: the input alone .. the input plus the whole output ceiling."""
    low = max(0, input_tokens) * price.input / MILLION
    return low, low + max(0, max_output_tokens) * price.output / MILLION
