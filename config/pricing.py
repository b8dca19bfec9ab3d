"""Price tables: the shipped files (config/prices/*.toml) and the user's overrides, built into a `PriceTable`.

A shipped file names its source page and the date it was read (`source`,
`read`) and lists `[models."name"]` tables of `input`, `cached_input`,
`cache_write`, `cache_write_1h` and `output`, USD per million tokens. A user
overrides or adds models with the same fields in a `[prices."model-name"]`
table of their config; a model they name replaces the shipped price whole.

Every problem is one `ConfigError` naming the file, the model and the value.

Every run gets both providers' tables, whatever its preset: a model name says
its provider (no model is in two files, `shipped_prices` checks it), so one
table prices an OpenAI preset, an Anthropic one, a gateway in front of
either, or a target named without a preset that speaks either API. The
engine receives the table as plain data (`price_data`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratedeck.core.numbers import show
from ratedeck.engine.limits.prices import Price, PriceTable
from ratedeck.engine.settings import ConfigError

#: The shipped price files, one per provider.
PRICE_DIR = Path(__file__).parent / "prices"

_FIELDS = ("input", "cached_input", "cache_write", "cache_write_1h", "output")
_REQUIRED = ("input", "output")


def parse_price(fields: Any, source: str, where: str) -> Price:
    """One model's price table checked field by field."""
    if not isinstance(fields, Mapping):
        raise ConfigError(
            source, where, f"must be a table of prices like {{input = 2.5, output = 10}}, got {show(fields)}"
        )
    for name in fields:
        if name not in _FIELDS:
            raise ConfigError(source, f"{where}.{name}", f"unknown field; known: {', '.join(_FIELDS)}")
    for name in _REQUIRED:
        if name not in fields:
            raise ConfigError(source, f"{where}.{name}", "missing: a price in USD per million tokens")
    for name, value in fields.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(
                source,
                f"{where}.{name}",
                f"must be a price in USD per million tokens (a number >= 0), got {show(value)}",
            )
    return Price(**{name: float(value) for name, value in fields.items()})


def parse_prices(models: Any, source: str, section: str) -> dict[str, Price]:
    """`{model: Price}` from a table of model tables (`[models."x"]` or `[prices."x"]`)."""
    if not isinstance(models, Mapping):
        raise ConfigError(
            source, section, f'must be a table of models, like [{section}."gpt-4o"], got {show(models)}'
        )
    prices: dict[str, Price] = {}
    for model, fields in models.items():
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(source, section, f"a model name must be text, got {show(model)}")
        prices[model] = parse_price(fields, source, f'{section}."{model}"')
    return prices


def read_price_file(path: str | Path) -> dict[str, Price]:
    """One shipped price file: its `source`, its `read` date and its `[models."x"]` tables."""
    shown = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(shown, "file", "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, "file", f"not valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(shown, "file", f"cannot read: {exc}") from None
    for name in ("source", "read"):
        if name not in data:
            raise ConfigError(
                shown, name, "missing: a price file says where its prices come from and when they were read"
            )
    return parse_prices(data.get("models", {}), shown, "models")


@functools.cache
def _shipped() -> PriceTable:
    return shipped_prices()


def shipped_prices(directory: str | Path = PRICE_DIR) -> PriceTable:
    """Every shipped price file merged (files in name order; no model is in two)."""
    prices: dict[str, Price] = {}
    for file in sorted(Path(directory).glob("*.toml")):
        for model, price in read_price_file(file).items():
            if model in prices:
                raise ConfigError(str(file), f'models."{model}"', "already priced by another price file")
            prices[model] = price
    return PriceTable(prices)


def load_prices(config: Mapping[str, Any] | None = None, source: str = "config") -> PriceTable:
    """The shipped prices with the `[prices."model"]` tables of a user's config over them."""
    table = _shipped()
    if not config or "prices" not in config:
        return table
    return table.merged(parse_prices(config["prices"], source, "prices"))


def price_data(table: PriceTable) -> dict[str, dict[str, float]]:
    """A table as the engine's plain data: {model: {field: USD per million tokens}}, unset fields left out."""
    return {
        model: {k: v for k, v in dataclasses.asdict(price).items() if v is not None}
        for model, price in table.prices.items()
    }


def user_prices(prices: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """The models of a run's plain-data prices that the shipped tables do not hold as they are:
    what a saved config writes as its `[prices."model"]` tables."""
    shipped = price_data(_shipped())
    return {model: dict(fields) for model, fields in prices.items() if shipped.get(model) != fields}
