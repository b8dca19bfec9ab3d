"""The shipped price files and a user's [prices."model"] overrides, built into a PriceTable."""

from __future__ import annotations

import tomllib

import pytest

from ratedeck.config.pricing import PRICE_DIR, load_prices, read_price_file, shipped_prices
from ratedeck.engine.llm.prices import Price
from ratedeck.engine.settings import ConfigError


def test_each_shipped_file_names_its_source_and_the_date_it_was_read():
    files = sorted(PRICE_DIR.glob("*.toml"))
    assert [f.stem for f in files] == ["anthropic", "openai"]
    for file in files:
        data = tomllib.loads(file.read_text())
        assert data["source"].startswith("https://")
        assert str(data["read"]) == "2026-11-26"
        assert len(read_price_file(file)) >= 10


def test_the_shipped_prices_cover_the_common_models_and_their_snapshots():
    table = shipped_prices()
    for model in (
        "gpt-4o",
        "gpt-4o-2024-08-06",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-4.1-mini",
        "o3",
        "o4-mini",
        "claude-sonnet-4-5-20250929",
        "claude-opus-4-1",
        "claude-haiku-4-5",
        "claude-3-5-haiku-20241022",
    ):
        price = table.price_for(model)
        assert price is not None, model
        assert 0 < price.input < price.output
        assert price.cached_input is None or price.cached_input < price.input
    assert table.price_for("gpt-4o") == Price(input=2.50, cached_input=1.25, output=10.00)
    assert table.price_for("claude-sonnet-4-5") == Price(
        input=3.00, cached_input=0.30, cache_write=3.75, cache_write_1h=6.00, output=15.00
    )
    assert table.price_for("no-such-model") is None


def test_a_users_prices_override_and_add_models():
    table = load_prices(
        {"prices": {"gpt-4o": {"input": 1, "output": 4}, "my-finetune": {"input": 0.5, "output": 2}}}
    )
    assert table.price_for("gpt-4o-2024-08-06") == Price(input=1.0, output=4.0)  # replaced whole
    assert table.price_for("my-finetune") == Price(input=0.5, output=2.0)
    assert table.price_for("gpt-4o-mini") == shipped_prices().price_for("gpt-4o-mini")
    assert load_prices({}) == shipped_prices()
    assert load_prices(None) == shipped_prices()


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        (
            {"gpt-4o": {"input": -1, "output": 4}},
            'my.toml: prices."gpt-4o".input: must be a price in USD per million tokens (a number >= 0), got -1',
        ),
        (
            {"gpt-4o": {"input": "cheap", "output": 4}},
            "prices.\"gpt-4o\".input: must be a price in USD per million tokens (a number >= 0), got 'cheap'",
        ),
        ({"gpt-4o": {"input": 1, "output": True}}, 'prices."gpt-4o".output: must be a price'),
        ({"gpt-4o": {"input": 1, "output": float("nan")}}, 'prices."gpt-4o".output: must be a price'),
        ({"gpt-4o": {"input": 1}}, 'prices."gpt-4o".output: missing'),
        ({"gpt-4o": {"input": 1, "output": 2, "outptu": 3}}, 'prices."gpt-4o".outptu: unknown field'),
        ({"gpt-4o": 2.5}, 'prices."gpt-4o": must be a table of prices'),
        ("cheap", "prices: must be a table of models"),
    ],
)
def test_a_bad_price_is_one_line_naming_the_file_the_model_and_the_value(prices, message):
    with pytest.raises(ConfigError) as err:
        load_prices({"prices": prices}, "my.toml")
    text = str(err.value)
    assert text.startswith("my.toml: ")
    assert message in text
    assert "\n" not in text


def test_a_broken_price_file_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "https://x"\nread = 2026-11-26\n[models."m"]\ninput = -3\noutput = 1\n')
    with pytest.raises(ConfigError, match=r'bad\.toml: models\."m"\.input: must be a price'):
        read_price_file(bad)
    unsourced = tmp_path / "unsourced.toml"
    unsourced.write_text('[models."m"]\ninput = 1\noutput = 1\n')
    with pytest.raises(ConfigError, match=r"unsourced\.toml: source: missing"):
        read_price_file(unsourced)
    (tmp_path / "broken.toml").write_text("[models\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: file: not valid TOML"):
        read_price_file(tmp_path / "broken.toml")
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a", "b"):
        (twice / f"{name}.toml").write_text(
            'source = "https://x"\nread = 2026-11-26\n[models."m"]\ninput = 1\noutput = 2\n'
        )
    with pytest.raises(ConfigError, match=r'b\.toml: models\."m": already priced'):
        shipped_prices(twice)
