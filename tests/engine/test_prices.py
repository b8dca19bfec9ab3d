"""Prices: a model's price (a dated snapshot takes its family's), an answer's cost in either
provider's usage shape, the range a request may cost before it is sent."""

from __future__ import annotations

import dataclasses

import pytest

from ratedeck.engine.llm.prices import Price, PriceTable, cost_usd, estimate_range_usd

GPT_4O = Price(input=2.50, cached_input=1.25, output=10.00)
OLD_4O = Price(input=5.00, output=15.00)
SONNET = Price(input=3.00, cached_input=0.30, cache_write=3.75, cache_write_1h=6.00, output=15.00)
TABLE = PriceTable({"gpt-4o": GPT_4O, "gpt-4o-2024-05-13": OLD_4O, "claude-sonnet-4-5": SONNET})


def test_a_model_has_its_price_and_a_snapshot_its_familys_unless_listed():
    assert TABLE.price_for("gpt-4o") is GPT_4O
    assert TABLE.price_for("gpt-4o-2024-08-06") is GPT_4O
    assert TABLE.price_for("gpt-4o-2024-05-13") is OLD_4O  # listed itself
    assert TABLE.price_for("claude-sonnet-4-5-20250929") is SONNET
    assert TABLE.price_for("claude-sonnet-4-5-latest") is SONNET


def test_a_model_with_no_price_is_none_never_zero():
    assert TABLE.price_for("gpt-9") is None
    assert TABLE.price_for("gpt-9-2030-01-01") is None
    assert TABLE.price_for("gpt-4o-mini") is None  # not a snapshot of gpt-4o
    assert TABLE.price_for(None) is None
    assert TABLE.price_for("") is None


def test_the_table_is_frozen_and_overrides_make_a_new_one():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TABLE.prices = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        TABLE.prices["x"] = GPT_4O  # type: ignore[index]
    cheaper = TABLE.merged({"gpt-4o": OLD_4O})
    assert cheaper.price_for("gpt-4o-2024-08-06") is OLD_4O
    assert TABLE.price_for("gpt-4o") is GPT_4O


def test_a_bad_price_is_refused():
    for bad in (-1, float("nan"), float("inf"), "2.5", True, None):
        with pytest.raises(ValueError, match="USD per million tokens"):
            Price(input=bad, output=1.0)  # type: ignore[arg-type]


def test_openai_chat_usage_prices_cached_prompt_tokens_apart():
    usage = {
        "prompt_tokens": 1_000_000,
        "completion_tokens": 200_000,
        "prompt_tokens_details": {"cached_tokens": 400_000},
    }
    # 600k x 2.50 + 400k x 1.25 + 200k x 10.00, per million
    assert cost_usd(GPT_4O, usage) == pytest.approx(1.50 + 0.50 + 2.00)
    assert cost_usd(GPT_4O, {"prompt_tokens": 1000, "completion_tokens": 0}) == pytest.approx(0.0025)


def test_openai_responses_usage_prices_cached_input_tokens_apart():
    usage = {
        "input_tokens": 12033,
        "input_tokens_details": {"cached_tokens": 11904},
        "output_tokens": 44,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12077,
    }
    expected = (129 * 2.50 + 11904 * 1.25 + 44 * 10.00) / 1e6
    assert cost_usd(GPT_4O, usage) == pytest.approx(expected)


def test_cached_tokens_with_no_cached_price_cost_the_full_input_price():
    usage = {"prompt_tokens": 1000, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 1000}}
    assert cost_usd(OLD_4O, usage) == pytest.approx(1000 * 5.00 / 1e6)


def test_anthropic_usage_prices_cache_reads_and_writes_apart_from_input():
    usage = {
        "input_tokens": 100_000,
        "cache_read_input_tokens": 500_000,
        "cache_creation_input_tokens": 200_000,
        "output_tokens": 10_000,
    }
    # input excludes the cache: 100k x 3 + 500k x 0.30 + 200k x 3.75 (5-minute writes) + 10k x 15
    assert cost_usd(SONNET, usage) == pytest.approx(0.30 + 0.15 + 0.75 + 0.15)
    split = {
        **usage,
        "cache_creation": {"ephemeral_5m_input_tokens": 50_000, "ephemeral_1h_input_tokens": 150_000},
    }
    assert cost_usd(SONNET, split) == pytest.approx(
        0.30 + 0.15 + 50_000 * 3.75 / 1e6 + 150_000 * 6.00 / 1e6 + 0.15
    )


def test_anthropic_cache_writes_with_no_listed_price_follow_the_documented_multipliers():
    plain = Price(input=2.00, output=8.00)
    usage = {"input_tokens": 0, "cache_creation_input_tokens": 1_000_000, "output_tokens": 0}
    assert cost_usd(plain, usage) == pytest.approx(2.50)  # 1.25 x input
    one_hour = {"input_tokens": 0, "cache_creation": {"ephemeral_1h_input_tokens": 1_000_000}}
    assert cost_usd(plain, one_hour) == pytest.approx(4.00)  # 2 x input


def test_a_usage_with_no_counts_costs_nothing_and_junk_is_not_counted():
    assert cost_usd(GPT_4O, None) == 0.0
    assert cost_usd(GPT_4O, {}) == 0.0
    assert cost_usd(GPT_4O, {"prompt_tokens": "many", "completion_tokens": None}) == 0.0
    # More cached tokens than prompt tokens cannot make the input cheaper than nothing.
    assert cost_usd(GPT_4O, {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}) >= 0


def test_the_range_before_sending_is_input_alone_to_input_plus_the_output_ceiling():
    low, high = estimate_range_usd(GPT_4O, 1_000_000, 100_000)
    assert low == pytest.approx(2.50)
    assert high == pytest.approx(2.50 + 1.00)
    assert estimate_range_usd(SONNET, 0, 0) == (0.0, 0.0)
