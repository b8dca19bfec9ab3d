"""engine/llm: an answer's usage parsed once into a `Usage` (every shape the engine reads), and a
price checked in one place (a bad one is one line naming the file, the key and the value)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from ratedeck.config.pricing import read_price_file
from ratedeck.core.vocab import OutcomeKind
from ratedeck.engine.http.outcome import UNREAD, Outcome
from ratedeck.engine.llm.prices import Price, PriceError, cost_usd, parse_price
from ratedeck.engine.llm.usage import Usage, answer_doc, field, usage_of
from ratedeck.engine.settings import ConfigError

# (what the answer's `usage` says, the Usage read from it): input, output, uncached, cached, written 5m / 1h
SHAPES = [
    pytest.param(  # server/stubs/openai.py's chat completion, sent whole or as a stream's last chunk
        {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18},
        Usage(10, 8, 10),
        id="openai-chat",
    ),
    pytest.param(
        {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 400}, "completion_tokens": 50},
        Usage(1000, 50, 600, 400),
        id="openai-chat-cached",
    ),
    pytest.param(  # more cached than prompted: never a negative uncached count
        {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}},
        Usage(10, 0, 0, 10),
        id="openai-chat-cached-past-prompt",
    ),
    pytest.param(
        {"input_tokens": 300, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 20},
        Usage(300, 20, 200, 100),
        id="openai-responses",
    ),
    pytest.param(  # server/stubs/anthropic.py's message
        {"input_tokens": 12, "output_tokens": 8}, Usage(12, 8, 12), id="anthropic"
    ),
    pytest.param(  # the stub's stream: message_start's usage, message_delta's merged over it
        {"input_tokens": 12, "output_tokens": 1} | {"output_tokens": 8},
        Usage(12, 8, 12),
        id="anthropic-stream",
    ),
    pytest.param(
        {
            "input_tokens": 100,
            "cache_read_input_tokens": 500,
            "cache_creation_input_tokens": 200,
            "output_tokens": 40,
        },
        Usage(800, 40, 100, 500, 200, 0),
        id="anthropic-cache",
    ),
    pytest.param(
        {
            "input_tokens": 100,
            "cache_creation_input_tokens": 300,
            "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
            "output_tokens": 1,
        },
        Usage(400, 1, 100, 0, 100, 200),
        id="anthropic-cache-lifetimes",
    ),
    pytest.param(
        {"prompt_tokens": "many", "completion_tokens": None}, Usage(0, 0, 0), id="not-numbers-are-0"
    ),
    pytest.param({"input_tokens": -5, "output_tokens": 2.9}, Usage(0, 2, 0), id="negative-and-fractions"),
    pytest.param({}, Usage(0, 0, 0), id="empty"),
    pytest.param(None, None, id="none"),
    pytest.param([1, 2], None, id="not-an-object"),
]


@pytest.mark.parametrize(("usage", "expected"), SHAPES)
def test_usage_reads_every_shape(usage, expected):
    assert Usage.of(usage) == expected


def _outcome(body) -> Outcome:
    out = Outcome(OutcomeKind.OK, 200)
    out.response = SimpleNamespace(body=body if isinstance(body, bytes) else json.dumps(body).encode())
    return out


@pytest.mark.parametrize(("usage", "expected"), SHAPES)
def test_an_answers_body_is_parsed_once_for_usage_pricing_and_settle(usage, expected, monkeypatch):
    out = _outcome({"id": "x", "usage": usage})
    loads = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text: loads.append(1) or real(text))
    got = usage_of(out)
    settled = field(out, "usage.output_tokens")
    assert got == expected and len(loads) == 1  # spend, pricing and a budget's settle read the one parse
    if expected is not None:
        price = Price(2.0, 8.0)
        assert cost_usd(price, got) == pytest.approx(cost_usd(price, usage))
        raw = usage.get("output_tokens", -1)
        assert settled == (math.ceil(raw) if raw >= 0 else None)  # the field as written, rounded up


def test_a_body_without_usage_is_not_parsed_and_one_not_json_is_none():
    out = _outcome(b'{"id": "x", "choices": []}')
    assert usage_of(out) is None and out.doc is UNREAD  # no "usage" in it: not worth a parse
    bad = _outcome(b'{"usage": {')
    assert usage_of(bad) is None and answer_doc(bad) is None and field(bad, "usage.output_tokens") is None
    assert field(_outcome({"usage": {"output_tokens": 7.2}}), "usage.output_tokens") == 8  # rounded up
    assert field(_outcome({"usage": {"output_tokens": True}}), "usage.output_tokens") is None


# ---------------------------------------------------------------- prices: one validation


@pytest.mark.parametrize(
    ("fields", "where", "problem"),
    [
        ({"input": -1, "output": 2}, "input", "a number >= 0), got -1"),
        ({"input": "cheap", "output": 2}, "input", "got 'cheap'"),
        ({"input": 1, "output": True}, "output", "got True"),
        ({"input": 1, "output": float("nan")}, "output", "got nan"),
        ({"input": 1}, "output", "missing"),
        ({"input": 1, "output": 2, "outptu": 3}, "outptu", "unknown field"),
        (2.5, None, "must be a table of prices"),
    ],
)
def test_a_price_is_checked_in_one_place(fields, where, problem):
    with pytest.raises(PriceError) as caught:
        parse_price(fields)
    assert caught.value.field == where and problem in caught.value.problem


def test_a_price_built_in_code_is_checked_the_same_way():
    with pytest.raises(PriceError, match="USD per million tokens"):
        Price(-1.0, 2.0)
    assert parse_price({"input": 1, "output": 2, "cached_input": 0}) == Price(1.0, 2.0, cached_input=0.0)


def test_a_bad_price_file_is_one_line_naming_the_file_the_key_and_the_value(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('source = "x"\nread = "2025-01-01"\n[models."gpt-x"]\ninput = 1\noutput = -3\n')
    with pytest.raises(ConfigError) as caught:
        read_price_file(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f'{path}: models."gpt-x".output: must be a price in USD per million tokens (a number >= 0), got -3'
    )
