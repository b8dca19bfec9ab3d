"""The Azure OpenAI stub (server/stubs/azure.py) plays one resource's documented behaviour, checked with aiohttp.

Each test runs on loopback with a FakeClock the test moves by hand: nothing sleeps on wall time
(a test that waits for the stub to see a request polls the ledger, as tests/server/test_llm_stubs.py does).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from ratedeck.server.stubs.azure import start_azure
from ratedeck.server.stubs.common import FakeClock
from ratedeck.server.stubs.llm_common import StreamOptions, mask
from ratedeck.server.stubs.openai import start_openai

from .test_llm_stubs import post, run  # the same loopback helpers

T0 = 1_700_000_000.0
KEY1 = "key1-az-0123456789"
KEY2 = "key2-az-0123456789"
H = {"api-key": KEY1}
VERSION = "2024-10-21"
DEP = "chat"


def url(stub: Any, deployment: str = DEP, version: str | None = VERSION) -> str:
    query = f"?api-version={version}" if version else ""
    return f"{stub.url}/openai/deployments/{deployment}/chat/completions{query}"


def chat(chars: int, max_tokens: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * chars}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def deployments(tpm: int = 100_000, rpm: int | None = None, model: str = "gpt-4o-mini") -> dict[str, Any]:
    spec: dict[str, Any] = {"model": model, "tpm": tpm}
    if rpm is not None:
        spec["rpm"] = rpm
    return {DEP: spec}


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 3
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.002)


def test_a_missing_or_unknown_key_is_401_and_both_keys_and_bearer_are_taken() -> None:
    async def body() -> None:
        stub = await start_azure(clock=FakeClock(T0), keys=[KEY1, KEY2], deployments=deployments())
        async with stub, aiohttp.ClientSession() as s:
            for headers in ({}, {"api-key": "key9-az-0123456789"}, {"Authorization": "Bearer nope-0123456"}):
                status, err, _ = await post(s, url(stub), chat(8, 4), headers)
                assert status == 401 and err["error"]["code"] == "401"
                assert err["error"]["message"].startswith("Access denied due to invalid subscription key")
            for headers in (H, {"api-key": KEY2}, {"Authorization": f"Bearer {KEY2}"}):
                assert (await post(s, url(stub), chat(8, 4), headers))[0] == 200
            assert stub.ledger.counts() == {"unauthorized": 3, "ok": 3}
            assert {r.key for r in stub.ledger.accepted()} == {mask(KEY1), mask(KEY2)}
            assert all(KEY1 != r.key != KEY2 for r in stub.ledger.records)

    run(body)


def test_both_paths_answer_a_chat_completion_with_only_the_remaining_headers() -> None:
    async def body() -> None:
        stub = await start_azure(
            clock=FakeClock(T0), keys=[KEY1], deployments=deployments(tpm=1000, rpm=60, model="gpt-4o")
        )
        async with stub, aiohttp.ClientSession() as s:
            status, answer, h = await post(s, url(stub), chat(40, 8), H)
            assert status == 200 and answer["object"] == "chat.completion" and answer["model"] == "gpt-4o"
            assert answer["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
            assert answer["choices"][0]["message"]["content"] == "stub " * 4
            assert h["x-ratelimit-remaining-tokens"] == str(1000 - 18)
            assert h["x-ratelimit-remaining-requests"] == "9"  # 60 RPM: 10 in any 10 s
            assert h["apim-request-id"] and h["x-request-id"]
            names = {k.lower() for k in h if k.lower().startswith("x-ratelimit-")}
            assert names == {"x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"}
            assert "retry-after" not in h

            v1 = f"{stub.url}/openai/v1/chat/completions"
            status, answer, h = await post(s, v1, {**chat(40, 8), "model": DEP}, H)
            assert status == 200 and answer["model"] == "gpt-4o"
            assert h["x-ratelimit-remaining-tokens"] == str(1000 - 36)
            assert h["x-ratelimit-remaining-requests"] == "8"
            assert [r.bucket for r in stub.ledger.accepted()] == [DEP, DEP]
            assert stub.ledger.charged(bucket=DEP) == 36

    run(body)


def test_an_unknown_deployment_and_a_missing_api_version_are_404() -> None:
    async def body() -> None:
        stub = await start_azure(clock=FakeClock(T0), keys=[KEY1], deployments=deployments())
        async with stub, aiohttp.ClientSession() as s:
            status, err, _ = await post(s, url(stub, "gpt-5-nowhere"), chat(8, 4), H)
            assert status == 404 and err["error"]["code"] == "DeploymentNotFound"
            assert err["error"]["message"].startswith("The API deployment for this resource does not exist.")
            v1 = f"{stub.url}/openai/v1/chat/completions"
            status, err, _ = await post(s, v1, {**chat(8, 4), "model": "gpt-5-nowhere"}, H)
            assert status == 404 and err["error"]["code"] == "DeploymentNotFound"
            status, err, _ = await post(s, url(stub, version=None), chat(8, 4), H)
            assert (status, err) == (404, {"error": {"code": "404", "message": "Resource not found"}})
            assert stub.ledger.counts() == {"deployment_not_found": 2, "not_found": 1}
            assert stub.ledger.charged() == 0

    run(body)


def test_the_token_bucket_refuses_with_retry_after_until_the_request_fits() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_azure(clock=clock, keys=[KEY1, KEY2], deployments=deployments(tpm=1000, rpm=600))
        async with stub, aiohttp.ClientSession() as s:
            status, _, h = await post(s, url(stub), chat(40, 590), H)  # 10 + 590 = 600 of 1000
            assert status == 200 and h["x-ratelimit-remaining-tokens"] == "400"
            # KEY2 shares the resource's quota: 600 more need 200 more, at 1000/60 a second: 12 s
            status, err, h = await post(s, url(stub), chat(40, 590), {"api-key": KEY2})
            assert status == 429 and err["error"]["code"] == "429"
            assert (h["retry-after"], h["retry-after-ms"]) == ("12", "12000")
            message = err["error"]["message"]
            assert f"Azure OpenAI API version {VERSION} have exceeded token rate limit" in message
            assert "Please retry after 12 seconds." in message
            assert h["x-ratelimit-remaining-tokens"] == "400"  # the refusal charged nothing
            clock.advance(11.9)
            status, _, h = await post(s, url(stub), chat(40, 590), H)
            assert status == 429 and (h["retry-after"], h["retry-after-ms"]) == ("1", "100")
            clock.advance(0.1)
            status, _, h = await post(s, url(stub), chat(40, 590), {"api-key": KEY2})
            assert status == 200 and h["x-ratelimit-remaining-tokens"] == "0"
            # best_of multiplies max_tokens: 10 + 2 * 100 = 210, 12.6 s of refill
            status, _, h = await post(s, url(stub), chat(40, 100, best_of=2), H)
            assert status == 429 and h["retry-after-ms"] == "12600"

            audit = stub.state.audit(DEP)
            assert audit["tokens_charged"] == 1200 and audit["accepted"] == 2
            assert audit["rate_limited"] == 3
            assert audit["capacity"] == pytest.approx(1000 + 1000 * 12 / 60)
            assert stub.allowed_capacity(T0, T0 + 60, bucket=DEP) == pytest.approx(2000)
            assert [r.cost for r in stub.ledger.refused("rate_limited")] == [0, 0, 0]

    run(body)


def test_requests_are_limited_over_a_sliding_10_second_window() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_azure(clock=clock, keys=[KEY1], deployments=deployments(rpm=12))  # 2 per 10 s
        async with stub, aiohttp.ClientSession() as s:
            status, _, h = await post(s, url(stub), chat(8, 4), H)
            assert status == 200 and h["x-ratelimit-remaining-requests"] == "1"
            clock.advance(4)
            status, _, h = await post(s, url(stub), chat(8, 4), H)
            assert status == 200 and h["x-ratelimit-remaining-requests"] == "0"
            clock.advance(1)
            status, err, h = await post(s, url(stub), chat(8, 4), H)
            assert status == 429 and "exceeded call rate limit" in err["error"]["message"]
            assert (h["retry-after"], h["retry-after-ms"]) == ("5", "5000")
            clock.advance(5)  # the first request leaves the window
            assert (await post(s, url(stub), chat(8, 4), H))[0] == 200
            clock.advance(0.5)  # t+4 and t+10 are in the window: wait until t+14
            status, _, h = await post(s, url(stub), chat(8, 4), H)
            assert status == 429 and (h["retry-after"], h["retry-after-ms"]) == ("4", "3500")
            assert stub.ledger.counts() == {"ok": 3, "rate_limited": 2}
            assert [r.detail for r in stub.ledger.refused()] == ["requests", "requests"]
            assert stub.state.allowed_capacity(T0, T0 + 20, bucket=DEP, unit="requests") == 4

    run(body)


def test_the_default_rpm_is_6_per_1000_tpm() -> None:
    async def body() -> None:
        stub = await start_azure(clock=FakeClock(T0), keys=[KEY1], deployments=deployments(tpm=5000))
        async with stub, aiohttp.ClientSession() as s:
            statuses = [(await post(s, url(stub), chat(4, 1), H))[0] for _ in range(6)]
            assert statuses == [200] * 5 + [429]  # 30 RPM: 5 in any 10 s

    run(body)


def test_streaming_ends_with_a_usage_chunk_when_asked() -> None:
    async def body() -> None:
        stub = await start_azure(
            clock=FakeClock(T0), keys=[KEY1], deployments=deployments(), streaming=StreamOptions(event_s=0.0)
        )
        async with stub, aiohttp.ClientSession() as s:
            payload = chat(40, 6, stream=True, stream_options={"include_usage": True})
            async with s.post(url(stub), json=payload, headers=H) as resp:
                assert resp.status == 200 and resp.content_type == "text/event-stream"
                assert "x-ratelimit-remaining-tokens" in resp.headers
                text = await resp.text()
            datas = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            assert datas[-1] == "[DONE]"
            chunks = [json.loads(d) for d in datas[:-1]]
            assert chunks[-1]["choices"] == [] and chunks[-1]["model"] == "gpt-4o-mini"
            assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
            assert all(c["usage"] is None for c in chunks[:-1])
            assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "stub " * 3

    run(body)


def test_go_dark_refuse_drops_connections_and_come_back_listens_on_the_same_port() -> None:
    async def body() -> None:
        stub = await start_azure(clock=FakeClock(T0), keys=[KEY1], deployments=deployments())
        host, port = stub.state.address
        async with stub, aiohttp.ClientSession() as s:
            assert (await post(s, url(stub), chat(8, 4), H))[0] == 200
            reader, writer = await asyncio.open_connection(host, port)  # an idle keep-alive connection
            await until(lambda: len(stub.runner.server.connections) >= 2)
            await stub.state.go_dark("refuse")
            assert await reader.read() == b""  # dropped by the server
            writer.close()
            with pytest.raises(OSError):  # nothing listens: refused
                await asyncio.open_connection(host, port)
            with pytest.raises(aiohttp.ClientConnectionError):
                await post(s, url(stub), chat(8, 4), H)
            await stub.state.come_back()
            status, _, _ = await post(s, url(stub), chat(8, 4), H)
            assert status == 200 and stub.url.endswith(f":{port}")
            assert stub.ledger.counts() == {"ok": 2}

    run(body)


def test_go_dark_hang_accepts_and_never_answers_until_it_comes_back() -> None:
    async def body() -> None:
        stub = await start_azure(clock=FakeClock(T0), keys=[KEY1], deployments=deployments())
        async with stub, aiohttp.ClientSession() as s:
            await stub.state.go_dark("hang")
            hung = asyncio.ensure_future(post(s, url(stub), chat(8, 4), H))
            await until(lambda: stub.ledger.counts().get("unanswered") == 1)
            await asyncio.sleep(0)
            assert not hung.done()
            await stub.state.come_back()
            with pytest.raises(aiohttp.ClientConnectionError):  # the parked request is dropped, unanswered
                await hung
            assert (await post(s, url(stub), chat(8, 4), H))[0] == 200
            await stub.state.go_dark("hang")
            parked = asyncio.ensure_future(post(s, url(stub), chat(8, 4), H))
            await until(lambda: stub.ledger.counts().get("unanswered") == 2)
        # the stub closed with a request still parked, and promptly
        with pytest.raises(aiohttp.ClientConnectionError):
            await parked
        assert stub.ledger.charged() == 2 + 4  # the one answered

    run(body)


def test_go_dark_takes_only_refuse_or_hang() -> None:
    async def body() -> None:
        async with await start_azure(clock=FakeClock(T0), keys=[KEY1]) as stub:
            with pytest.raises(ValueError, match="go_dark"):
                await stub.state.go_dark("flicker")

    run(body)


def test_the_openai_stub_can_leave_out_every_rate_limit_header() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        key = "sk-compat-0123456789"
        stub = await start_openai(clock=clock, keys=[key], rpm=1, limit_headers=False, minute_s=6.0)
        auth = {"Authorization": f"Bearer {key}"}
        async with stub, aiohttp.ClientSession() as s:
            where = f"{stub.url}/v1/chat/completions"
            payload = {**chat(8, 4), "model": "gpt-4o-mini"}
            for expected in (200, 429):
                status, _, h = await post(s, where, payload, auth)
                assert status == expected
                assert not [k for k in h if k.lower().startswith("x-ratelimit-")]
        default = await start_openai(clock=clock, keys=[key])
        async with default, aiohttp.ClientSession() as s:
            _, _, h = await post(s, f"{default.url}/v1/chat/completions", payload, auth)
            assert h["x-ratelimit-limit-requests"] == "500"

    run(body)
