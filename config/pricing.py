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
either, or a target named without a preset that speaks either API. A price
is checked by the engine's own `parse_price` (engine/llm/prices.py), the one
place prices are validated; the engine receives the `Price` objects.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratedeck.core.numbers import show
from ratedeck.engine.llm.prices import Price, PriceError, PriceTable, parse_price
from ratedeck.engine.settings import ConfigError

#: The shipped price files, one per provider.
PRICE_DIR = Path(__file__).parent / "prices"


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
        where = f'{section}."{model}"'
        try:
            prices[model] = parse_price(fields)
        except PriceError as exc:
            raise ConfigError(source, f"{where}.{exc.field}" if exc.field else where, exc.problem) from None
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


def user_prices(prices: Mapping[str, Price]) -> dict[str, dict[str, float]]:
    """The models of a run's prices that the shipped tables do not hold as they are: what a
    saved config writes as its `[prices."model"]` tables."""
    shipped = _shipped().prices
    return {model: price.fields() for model, price in prices.items() if shipped.get(model) != price}
