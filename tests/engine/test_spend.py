"""The spend meter: each answer's usage at its model's price per model and key, a model with no
price said once and never counted as 0, and the --max-cost cap on admission (reserve the
ceiling, wait for a reservation to end, stop when nothing can fit)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from ratedeck.core.numbers import usd, usd_range
from ratedeck.core.vocab import Ending, EventKind
from ratedeck.engine.http.outcome import OK, RATE_LIMITED, Outcome
from ratedeck.engine.http.transport import Response
from ratedeck.engine.limits.costs import CostModel
from ratedeck.engine.llm.prices import Price, PriceTable, cost_usd
from ratedeck.engine.observe.spend import SpendMeter, merge_spend, price_table
from ratedeck.engine.request import Request
from ratedeck.engine.snapshot import Spend, SpendRow
from ratedeck.engine.sources.workload import take_shape
from tests.engine.test_images import data_uri, png

MINI = Price(input=0.15, output=0.60)
SONNET = Price(input=3.00, cached_input=0.30, cache_write=3.75, output=15.00)
PRICES = PriceTable({"gpt-4o-mini": MINI, "claude-sonnet-4-5": SONNET, "gpt-4o": Price(2.5, 10.0)})


class Events:
    def __init__(self) -> None:
        self.lines: list[tuple[EventKind, str]] = []

    def event(self, kind: EventKind, text: str) -> None:
        self.lines.append((kind, text))


_ids = iter(range(1, 1_000_000))


def request(body: object, key: str = "k1") -> Request:
    req = Request(next(_ids), 0.0, math.inf)
    req.shape = take_shape({"_body": body})
    req.key = key
    return req


def answer(body: object, kind=OK, status: int = 200) -> Outcome:
    return Outcome(kind, status, response=Response(status, {}, json.dumps(body).encode()))


def chat(model: str, text: str = "x" * 400, max_tokens: int = 100) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


def meter(cap: float | None = None) -> tuple[SpendMeter, Events]:
    events = Events()
    return SpendMeter(PRICES, CostModel(), events, cap), events


def test_each_answers_usage_is_priced_per_model_and_key():
    spend, _ = meter()
    openai = {"prompt_tokens": 1000, "completion_tokens": 500}
    anthropic = {"input_tokens": 200, "cache_read_input_tokens": 1000, "output_tokens": 300}
    spend.answered(request(chat("gpt-4o-mini"), "k1"), answer({"usage": openai}))
    spend.answered(request(chat("gpt-4o-mini"), "k2"), answer({"usage": openai}))
    spend.answered(request(chat("gpt-4o-mini"), "k2"), answer({"usage": openai}))
    spend.answered(request(chat("claude-sonnet-4-5"), "k1"), answer({"usage": anthropic}))
    view = spend.view()
    assert view is not None
    rows = {(r.model, r.key): r for r in view.rows}
    assert rows["gpt-4o-mini", "k2"].answers == 2
    assert rows["gpt-4o-mini", "k2"].usd == pytest.approx(2 * cost_usd(MINI, openai))
    assert rows["gpt-4o-mini", "k2"].input_tokens == 2000 and rows["gpt-4o-mini", "k2"].output_tokens == 1000
    assert rows["claude-sonnet-4-5", "k1"].usd == pytest.approx((200 * 3 + 1000 * 0.3 + 300 * 15) / 1e6)
    assert rows["claude-sonnet-4-5", "k1"].input_tokens == 1200  # cache reads are input too
    assert view.total_usd == pytest.approx(3 * cost_usd(MINI, openai) + cost_usd(SONNET, anthropic))
    assert view.by_model()["gpt-4o-mini"] == pytest.approx(3 * cost_usd(MINI, openai))


def test_a_model_with_no_price_is_said_once_and_its_spend_is_unknown_not_zero():
    spend, events = meter()
    for _ in range(3):
        spend.answered(
            request(chat("gpt-9")), answer({"usage": {"prompt_tokens": 10, "completion_tokens": 5}})
        )
    spend.answered(
        request(chat("gpt-4o-mini")), answer({"usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    )
    said = [text for _, text in events.lines if "gpt-9" in text]
    assert len(said) == 1 and "no price" in said[0] and '[prices."gpt-9"]' in said[0]
    view = spend.view()
    assert view is not None
    (row,) = [r for r in view.rows if r.model == "gpt-9"]
    assert row.usd is None and row.answers == 3
    assert view.unpriced == ("gpt-9",) and view.by_model()["gpt-9"] is None
    assert view.total_usd == pytest.approx(cost_usd(MINI, {"prompt_tokens": 10, "completion_tokens": 5}))
    assert "gpt-9 unknown" in view.line() and "no price: gpt-9" in view.line()


def test_a_success_without_usage_is_unmetered_and_an_error_or_a_non_llm_call_costs_nothing():
    spend, _ = meter()
    spend.answered(request(chat("gpt-4o-mini")), answer({"choices": []}))
    spend.answered(
        request(chat("gpt-4o-mini")), answer({"error": {"code": "rate_limit_exceeded"}}, RATE_LIMITED, 429)
    )
    spend.answered(request({"q": "not an llm"}), answer({"usage": {"prompt_tokens": 99}}))
    view = spend.view()
    assert view is not None
    (row,) = view.rows
    assert row.unmetered == 1 and row.answers == 0 and row.usd == 0.0
    assert view.total_usd == 0.0


def test_no_answer_with_a_model_and_no_cap_shows_no_bill():
    spend, _ = meter()
    spend.answered(request({"q": 1}), answer({"usage": {"prompt_tokens": 5}}))
    assert spend.view() is None


def test_the_cap_reserves_each_ceiling_waits_for_a_reservation_to_end_then_stops():
    body = chat("gpt-4o-mini", "x" * 4000, max_tokens=1000)  # 1000 in + 1000 out at most
    ceiling = (1000 * 0.15 + 1000 * 0.60) / 1e6
    usage = {"prompt_tokens": 200, "completion_tokens": 0}  # the real answer: far under
    spent_each = cost_usd(MINI, usage)

    async def main() -> tuple[list[bool], SpendMeter, Events]:
        spend, events = meter(cap=2.5 * ceiling)
        first, second, third = request(body), request(body), request(body)
        got = [await spend.admit(first), await spend.admit(second)]
        assert spend.reserved == pytest.approx(2 * ceiling)
        waiting = asyncio.ensure_future(spend.admit(third))  # 3 ceilings do not fit in 2.5
        await asyncio.sleep(0)
        assert not waiting.done()
        spend.answered(first, answer({"usage": usage}))
        spend.finished(first, Ending.SUCCEEDED)  # its ceiling is given up, its real cost stays
        got.append(await asyncio.wait_for(waiting, 1))
        assert spend.reserved == pytest.approx(2 * ceiling)
        for req in (second, third):
            spend.answered(req, answer({"usage": usage}))
            spend.finished(req, Ending.SUCCEEDED)
        assert spend.reserved == 0.0 and spend.spent == pytest.approx(3 * spent_each)
        # 3 answers spent 0.12 ceilings: two more fit; they spend their whole ceilings, and
        # with nothing reserved any more the next one cannot fit
        more = [request(body) for _ in range(3)]
        got += [await spend.admit(more[0]), await spend.admit(more[1])]
        blocked = asyncio.ensure_future(spend.admit(more[2]))
        await asyncio.sleep(0)
        for req in more[:2]:
            spend.answered(req, answer({"usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}))
            spend.finished(req, Ending.SUCCEEDED)
        got.append(await asyncio.wait_for(blocked, 1))
        got.append(await spend.admit(request(body)))  # stopped for good
        return got, spend, events

    got, spend, events = asyncio.run(asyncio.wait_for(main(), 5))
    assert got == [True, True, True, True, True, False, False]
    assert spend.capped and spend.spent <= spend.cap
    assert [text for kind, text in events.lines if "cost cap" in text]
    view = spend.view()
    assert view is not None and view.capped and view.cap_usd == spend.cap


def test_with_a_cap_a_model_with_no_price_stops_admission_and_a_non_llm_call_goes():
    async def main() -> list[bool]:
        spend, _ = meter(cap=1.0)
        return [await spend.admit(request({"q": 1})), await spend.admit(request(chat("gpt-9")))]

    assert asyncio.run(main()) == [True, False]


def test_a_1mb_png_is_reserved_at_its_providers_image_rule_not_its_bytes():
    """1600x1200 (a 1 MB PNG made here): OpenAI's tiles for gpt-4o, 85 + 4 x 170 = 765 tokens;
    Anthropic's w x h / 750 after its resize to ~1.15 MP, ~1,600 tokens. The reservation (the
    input's price with max_tokens 0) is within 10% of each; a quarter of the base64 would be ~350,000."""
    image = data_uri(png(1600, 1200, payload=1_000_000))
    assert len(image) > 1_300_000
    openai = {
        "model": "gpt-4o",
        "max_tokens": 0,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}],
    }
    source = {"type": "base64", "media_type": "image/png", "data": image.split(",", 1)[1]}
    anthropic = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 0,
        "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
    }
    spend, _ = meter(cap=10.0)
    for body, tokens, price in ((openai, 765, 2.5), (anthropic, 1600, 3.0)):
        req = request(body)
        assert asyncio.run(spend.admit(req))
        reserved = spend.reserved
        assert abs(reserved - tokens * price / 1e6) <= 0.1 * tokens * price / 1e6, (body["model"], reserved)
        spend.finished(req, Ending.SUCCEEDED)


def test_the_engines_plain_prices_make_the_table_and_processes_bills_add_up():
    table = price_table({"m": Price(1.0, 2.0, cached_input=0.5)})
    assert table.price_for("m") == Price(1.0, 2.0, cached_input=0.5)
    a = Spend((SpendRow("m", "k1", 1, 10, 10, 0.5),), 0.5, (), 0.1, 2.0, False)
    b = Spend(
        (SpendRow("m", "k2", 2, 20, 20, 1.0), SpendRow("x", "k2", 1, 1, 1, None)), 1.0, ("x",), 0.2, 2.0, True
    )
    merged = merge_spend([a, None, b])
    assert merged is not None
    assert merged.total_usd == 1.5 and merged.reserved_usd == pytest.approx(0.3) and merged.capped
    assert [r.key for r in merged.rows] == ["k1", "k2", "k2"] and merged.unpriced == ("x",)
    assert merge_spend([None, None]) is None


def test_dollars_read_as_people_read_them():
    assert usd(12.4) == "$12.40" and usd(0.47) == "$0.47" and usd(0.0036) == "$0.0036"
    assert usd(0) == "$0.00" and usd(None) == "unknown" and usd(1234.5) == "$1,234.50"
    assert usd_range(0.09, 0.47) == "$0.09–$0.47" and usd_range(None, 1) == "unknown"
