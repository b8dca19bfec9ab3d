"""The LLM API stubs (server/stubs/openai.py, anthropic.py) enforce their documented limits, checked with aiohttp.

Each test runs on loopback with small limits, a scaled minute (``minute_s=6``) and a
FakeClock the test moves by hand: nothing sleeps on wall time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import aiohttp

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.common import FakeClock
from ratedeck.server.stubs.openai import duration, parse_duration, start_openai

T0 = 1_700_000_000.0
OAI = "sk-org-a-0123456789"
ANT = "sk-ant-a-0123456789"


def run(body: Callable[[], Awaitable[None]]) -> None:
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(body(), timeout=10))
    assert time.monotonic() - started < 5


async def post(
    s: aiohttp.ClientSession, url: str, payload: Any, headers: dict[str, str]
) -> tuple[int, Any, Any]:
    async with s.post(url, json=payload, headers=headers) as resp:
        return resp.status, json.loads(await resp.text()), resp.headers


def chat(chars: int, max_tokens: int | None = None, text: str = "x") -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text * chars}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


# -- OpenAI ----------------------------------------------------------------------------


def test_openai_durations_read_like_the_docs_samples() -> None:
    assert duration(0.012) == "12ms"
    assert duration(1.4) == "1.4s"
    assert duration(360) == "6m0s"
    assert duration(0) == "0s"
    for text, seconds in (("12ms", 0.012), ("1.4s", 1.4), ("6m0s", 360.0), ("1h2m3s", 3723.0)):
        assert abs(parse_duration(text) - seconds) < 1e-9
    assert abs(parse_duration(duration(2.3456)) - 2.346) < 1e-9


def test_openai_headers_fall_as_tokens_are_charged_and_refill_with_the_clock() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_openai(clock=clock, keys=[OAI], rpm=3, tpm=100, minute_s=6.0)
        auth = {"Authorization": f"Bearer {OAI}"}
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            status, answer, h = await post(s, url, chat(40, max_tokens=20), auth)  # 10 + 20 tokens
            assert status == 200 and answer["object"] == "chat.completion"
            usage = answer["usage"]
            assert usage["prompt_tokens"] == 10 and 0 < usage["completion_tokens"] <= 20
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-limit-tokens"]) == ("3", "100")
            assert h["openai-processing-ms"] == "0"  # its time on the request, on its (stopped) clock
            assert (h["x-ratelimit-remaining-requests"], h["x-ratelimit-remaining-tokens"]) == ("2", "70")
            assert parse_duration(h["x-ratelimit-reset-requests"]) == 2.0  # 1 request at 3 per 6 s
            assert abs(parse_duration(h["x-ratelimit-reset-tokens"]) - 1.8) < 1e-9  # 30 at 100 per 6 s

            _, _, h = await post(s, url, chat(40, max_tokens=20), auth)
            assert h["x-ratelimit-remaining-tokens"] == "40"
            assert abs(parse_duration(h["x-ratelimit-reset-tokens"]) - 3.6) < 1e-9

            clock.advance(0.6)  # refills 10 tokens and 0.3 request
            _, _, h = await post(s, url, chat(40, max_tokens=15), auth)  # 10 + 15 tokens
            assert h["x-ratelimit-remaining-tokens"] == "25"  # 40 + 10 refilled - 25
            assert h["x-ratelimit-remaining-requests"] == "0"  # 1 + 0.3 refilled - 1
            assert stub.ledger.units(key=OAI) == 30 + 30 + 25

    run(body)


def test_openai_empty_token_bucket_refuses_with_rate_limit_exceeded_and_a_matching_wait() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_openai(clock=clock, keys=[OAI], rpm=100, tpm=100, minute_s=6.0)
        auth = {"Authorization": f"Bearer {OAI}"}
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            big = chat(200, max_tokens=50)  # 50 + 50 = the whole bucket
            status, _, h = await post(s, url, big, auth)
            assert status == 200 and h["x-ratelimit-remaining-tokens"] == "0"
            clock.advance(1.5)
            status, err, h = await post(s, url, big, auth)
            assert status == 429
            assert err["error"]["code"] == "rate_limit_exceeded" and err["error"]["type"] == "tokens"
            message = err["error"]["message"]
            assert message.startswith("Rate limit reached for ") and OAI not in message
            wait = message.split("Please try again in ")[1].split(". ")[0]
            assert parse_duration(wait) == parse_duration(h["x-ratelimit-reset-tokens"]) == 4.5
            assert h["x-ratelimit-remaining-tokens"] == "25"
            clock.advance(4.5)
            status, _, _ = await post(s, url, big, auth)
            assert status == 200
            assert stub.ledger.counts(key=OAI) == {"ok": 2, "rate_limited": 1}
            assert stub.ledger.charged(key=OAI) == 200  # the refused one cost no token
            assert stub.state.book.refusals[OAI] == {"rate_limit_exceeded": 1}
            assert stub.state.book.duplicates(OAI) == 1

    run(body)


def test_openai_requests_bucket_refuses_first_with_type_requests() -> None:
    async def body() -> None:
        stub = await start_openai(clock=FakeClock(T0), keys=[OAI], rpm=1, tpm=10_000, minute_s=6.0)
        auth = {"Authorization": f"Bearer {OAI}"}
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            assert (await post(s, url, chat(4, 1), auth))[0] == 200
            status, err, h = await post(s, url, chat(4, 1), auth)
            assert status == 429 and err["error"]["type"] == "requests"
            assert "try again in 6s." in err["error"]["message"] and h["x-ratelimit-reset-requests"] == "6s"

    run(body)


def test_openai_a_refused_request_counts_against_the_requests_per_minute() -> None:
    """OpenAI: "unsuccessful requests contribute to your per-minute limit, so continuously
    resending a request won't work". The wait a refusal tells counts the refusal itself: a
    client that waits as told gets through, one that resends sooner is refused again."""

    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_openai(clock=clock, keys=[OAI], rpm=1, tpm=10_000, minute_s=6.0)
        auth = {"Authorization": f"Bearer {OAI}"}
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            assert (await post(s, url, chat(4, 1), auth))[0] == 200
            clock.advance(3.0)
            status, err, h = await post(s, url, chat(4, 1), auth)  # half a request refilled: refused
            assert status == 429 and "try again in 6s." in err["error"]["message"]
            assert h["x-ratelimit-reset-requests"] == "6s"  # the refusal spent the half refilled
            clock.advance(3.0)  # a full request would be back by now, had the refusal cost nothing
            assert (await post(s, url, chat(4, 1), auth))[0] == 429
            clock.advance(6.0)  # as the second refusal told
            assert (await post(s, url, chat(4, 1), auth))[0] == 200
            assert stub.ledger.counts(key=OAI) == {"ok": 2, "rate_limited": 2}

    run(body)


def test_openai_no_quota_key_always_gets_insufficient_quota_and_unknown_key_401() -> None:
    async def body() -> None:
        stub = await start_openai(clock=FakeClock(T0), keys=[OAI, "sk-broke"], no_quota=["sk-broke"])
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            for _ in range(2):
                status, err, h = await post(s, url, chat(8, 4), {"Authorization": "Bearer sk-broke"})
                assert status == 429 and "x-ratelimit-limit-tokens" in h
                assert err["error"]["code"] == err["error"]["type"] == "insufficient_quota"
                assert err["error"]["message"].startswith("You exceeded your current quota")
            status, err, _ = await post(s, url, chat(8, 4), {"Authorization": "Bearer sk-nobody-known"})
            assert status == 401 and err["error"]["code"] == "invalid_api_key"
            assert "sk-nobody-known" not in err["error"]["message"]
            assert stub.state.book.refusals["sk-broke"] == {"insufficient_quota": 2}
            assert stub.ledger.accepted() == []

    run(body)


def test_openai_ledger_counts_duplicate_prompts_per_key() -> None:
    async def body() -> None:
        stub = await start_openai(clock=FakeClock(T0), keys=[OAI, "sk-org-b-999999"])
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/chat/completions"
            for key, text in ((OAI, "a"), (OAI, "a"), (OAI, "b"), (OAI, "a"), ("sk-org-b-999999", "a")):
                assert (await post(s, url, chat(8, 4, text), {"Authorization": f"Bearer {key}"}))[0] == 200
            book = stub.state.book
            assert book.duplicates(OAI) == 2 and book.duplicates("sk-org-b-999999") == 0
            assert book.duplicates() == 3
            assert sorted(book.prompts[OAI].values()) == [1, 3]
            assert (await post(s, url, chat(8), {"Authorization": f"Bearer {OAI}"}))[0] == 200
            assert stub.ledger.records[-1].cost == 2 + 256  # no max_tokens: the default is charged

    run(body)


# -- Anthropic -------------------------------------------------------------------------


def msg(chars: int, max_tokens: int, text: str = "x") -> dict[str, Any]:
    return {
        "model": "claude",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text * chars}],
    }


AH = {"x-api-key": ANT, "anthropic-version": "2023-06-01"}


def test_anthropic_requires_the_version_header_and_a_known_key() -> None:
    async def body() -> None:
        stub = await start_anthropic(clock=FakeClock(T0), keys=[ANT])
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/messages"
            status, err, _ = await post(s, url, msg(8, 4), {"x-api-key": ANT})
            assert status == 400 and err["type"] == "error"
            assert (
                err["error"]["type"] == "invalid_request_error"
                and "anthropic-version" in err["error"]["message"]
            )
            status, err, _ = await post(s, url, msg(8, 4), {**AH, "x-api-key": "sk-ant-other"})
            assert status == 401 and err["error"]["type"] == "authentication_error"
            status, answer, _ = await post(s, url, msg(8, 4), AH)
            assert status == 200 and answer["type"] == "message"
            assert answer["usage"]["input_tokens"] == 2 and answer["usage"]["output_tokens"] <= 4

    run(body)


def test_anthropic_settle_returns_the_unused_output_tokens() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        gate = asyncio.Event()
        stub = await start_anthropic(
            clock=clock, keys=[ANT], rpm=10, itpm=1000, otpm=100, minute_s=6.0, output_ratio=0.25, hold=gate
        )
        out = stub.state.buckets[ANT]["output-tokens"]
        async with stub, aiohttp.ClientSession() as s:
            task = asyncio.ensure_future(post(s, f"{stub.url}/v1/messages", msg(40, 40), AH))
            deadline = time.monotonic() + 2
            while not stub.state.book.prompts[ANT]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.002)
            assert out.remaining(clock()) == 60  # max_tokens reserved while in flight
            gate.set()
            status, answer, h = await task
            assert status == 200 and answer["usage"]["output_tokens"] == 10
            assert h["anthropic-ratelimit-output-tokens-limit"] == "100"
            assert (
                h["anthropic-ratelimit-output-tokens-remaining"] == "90"
            )  # limit - actual, not - max_tokens
            assert h["anthropic-ratelimit-input-tokens-remaining"] == str(1000 - 10)
            assert h["anthropic-ratelimit-requests-remaining"] == "9"
            reset = datetime.fromisoformat(h["anthropic-ratelimit-output-tokens-reset"]).timestamp()
            assert abs(reset - (T0 + 0.6)) < 1e-3  # 10 tokens at 100 per 6 s
            assert stub.ledger.units(key=ANT) == 10 + 10

    run(body)


def test_anthropic_full_output_bucket_answers_429_with_retry_after() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_anthropic(clock=clock, keys=[ANT], otpm=100, minute_s=6.0, output_ratio=1.0)
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/messages"
            status, _, h = await post(s, url, msg(8, 100), AH)
            assert status == 200 and h["anthropic-ratelimit-output-tokens-remaining"] == "0"
            clock.advance(2.0)
            status, err, h = await post(s, url, msg(8, 100), AH)
            assert status == 429 and err == {
                "type": "error",
                "error": {"type": "rate_limit_error", "message": err["error"]["message"]},
            }
            assert h["retry-after"] == "4"
            reset = datetime.fromisoformat(h["anthropic-ratelimit-output-tokens-reset"]).timestamp()
            assert abs(reset - (T0 + 6.0)) < 1e-3
            clock.advance(4.0)
            assert (await post(s, url, msg(8, 100), AH))[0] == 200
            assert stub.state.book.refusals[ANT] == {"rate_limit_error": 1}
            assert stub.state.book.duplicates(ANT) == 1

    run(body)


def test_anthropic_529_overloaded_charges_nothing() -> None:
    async def body() -> None:
        stub = await start_anthropic(
            clock=FakeClock(T0),
            keys=[ANT],
            rpm=5,
            otpm=100,
            minute_s=6.0,
            overload_pattern=[True, True, False],
        )
        async with stub, aiohttp.ClientSession() as s:
            url = f"{stub.url}/v1/messages"
            for _ in range(2):
                status, err, h = await post(s, url, msg(8, 50), AH)
                assert status == 529 and err["error"]["type"] == "overloaded_error"
                assert h["anthropic-ratelimit-requests-remaining"] == "5"
                assert h["anthropic-ratelimit-output-tokens-remaining"] == "100"
            status, _, h = await post(s, url, msg(8, 50), AH)
            assert status == 200 and h["anthropic-ratelimit-requests-remaining"] == "4"
            assert stub.ledger.counts(key=ANT) == {"overloaded": 2, "ok": 1}
            assert stub.ledger.charged(key=ANT) == 2 + 25

    run(body)


def test_anthropic_overload_share_is_seeded() -> None:
    async def body() -> None:
        stub = await start_anthropic(clock=FakeClock(T0), keys=[ANT], rpm=1000, overload_share=0.5, seed=7)
        async with stub, aiohttp.ClientSession() as s:
            statuses = [(await post(s, f"{stub.url}/v1/messages", msg(4, 2), AH))[0] for _ in range(40)]
            assert set(statuses) == {200, 529} and 8 <= statuses.count(529) <= 32

    run(body)


def test_the_openai_stub_limits_each_model_on_its_own_and_refuses_an_unknown_one():
    asyncio.run(_per_model())


async def _per_model():
    models = {"small": {"rpm": 2, "tpm": 10_000}, "large": {"rpm": 50, "tpm": 10_000}}
    async with await start_openai(keys=["sk-m"], models=models) as stub, aiohttp.ClientSession() as http:

        async def ask(model):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            async with http.post(
                stub.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-m"}
            ) as r:
                return r.status, r.headers.get("x-ratelimit-limit-requests"), await r.json()

        assert [(await ask("small"))[0] for _ in range(3)] == [200, 200, 429]  # the small one's 2 a minute
        status, limit, _ = await ask("large")  # the large one's bucket is its own
        assert (status, limit) == (200, "50")
        status, _, body = await ask("nope")
        assert status == 404 and body["error"]["code"] == "model_not_found"
