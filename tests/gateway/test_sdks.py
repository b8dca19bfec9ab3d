"""The official SDKs as real clients of the gateway, against the API stubs."""

from __future__ import annotations

import asyncio

import aiohttp
import anthropic
import openai
import pytest

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.github import start_github
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

OPENAI_KEYS = ["sk-sdk-aaaaaaaaaaaaaaaa", "sk-sdk-bbbbbbbbbbbbbbbb", "sk-sdk-cccccccccccccccc"]
MESSAGES = [{"role": "user", "content": "Say hi"}]


def openai_client(gw, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=kw.pop("api_key", TOKEN), max_retries=0, **kw)


async def until(condition, limit_s: float = 5.0) -> None:
    """Wait for `condition()` on the loop (bounded): the engine settles a withdrawn request in a turn or two."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@run_async
async def test_openai_sdk_plain_calls_and_a_key_without_quota():
    async with await start_openai(
        keys=OPENAI_KEYS, rpm=1000, tpm=1_000_000, no_quota=OPENAI_KEYS[:1]
    ) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS)) as gw:
            async with openai_client(gw) as client:
                for _ in range(4):
                    answer = await client.chat.completions.create(
                        model="gpt-4o-mini", messages=MESSAGES, max_tokens=8
                    )
                    assert answer.choices[0].message.content.startswith("stub")
                    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert len(stub.ledger.accepted()) == 4
    assert not stub.ledger.accepted(key=OPENAI_KEYS[0])


@pytest.mark.slow
@run_async
async def test_openai_sdk_sees_no_429_at_five_times_what_the_limits_allow():
    # Two keys with quota, 10 requests per 0.5 s each: 100 at once are 5x a window's worth.
    async with await start_openai(
        keys=OPENAI_KEYS, rpm=10, tpm=1_000_000, minute_s=0.5, no_quota=OPENAI_KEYS[:1]
    ) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS)) as gw:
            async with openai_client(gw) as client:
                answers = await asyncio.gather(
                    *(
                        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=8)
                        for _ in range(100)
                    ),
                    return_exceptions=True,
                )
            snap = gw.snapshot()
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert not errors, errors[:3]
    assert len(stub.ledger.accepted()) == 100
    assert snap.clients is not None and dict(snap.clients.statuses) == {200: 100}


@run_async
async def test_openai_sdk_with_a_wrong_token_gets_authentication_error_and_the_stub_sees_nothing():
    async with await start_openai(keys=OPENAI_KEYS, rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS)) as gw:
            async with openai_client(gw, api_key="not-the-token") as client:
                with pytest.raises(openai.AuthenticationError):
                    await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert stub.ledger.records == []


@run_async
async def test_openai_sdk_timeout_cancels_the_queued_request():
    # One key, one request per minute: the second call waits, and its client gives up first.
    async with await start_openai(keys=OPENAI_KEYS[1:2], rpm=1, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS[1:2])) as gw:
            async with openai_client(gw) as client:
                await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=8)
                with pytest.raises(openai.APITimeoutError):
                    await client.chat.completions.create(
                        model="gpt-4o-mini", messages=MESSAGES, max_tokens=8, timeout=0.3
                    )
                engine = gw.engine
                await until(lambda: engine.parts.metrics.shed == 1)
                assert (len(engine.parts.queues), engine.parts.path.in_flight) == (0, 0)
                assert gw.source.view().waiting == 0
    assert len(stub.ledger.records) == 1  # the abandoned call never reached the API


@run_async
async def test_anthropic_sdk_plain_calls_and_a_529_retried_inside():
    keys = ["sk-ant-sdk-aaaaaaaaaaaa"]
    async with await start_anthropic(keys=keys, overload_pattern=[False, True, False]) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, keys)) as gw:
            async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=TOKEN, max_retries=0) as client:
                for _ in range(2):
                    message = await client.messages.create(
                        model="claude-stub", max_tokens=16, messages=MESSAGES
                    )
                    assert message.content[0].type == "text"
    outcomes = [r.outcome for r in stub.ledger.records]
    assert outcomes == ["ok", "overloaded", "ok"]  # the 529 never reached the SDK


@run_async
async def test_github_preset_through_the_gateway_with_plain_requests():
    tokens = ["ghp_gatewaytest000000000001", "ghp_gatewaytest000000000002"]
    async with await start_github(tokens=tokens) as stub:
        async with running_gateway(gateway_config("github", stub.url, tokens)) as gw:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
                for path in ("/user", "/repos/octo/demo", "/search/code?q=x"):
                    async with s.get(gw.url + path) as r:
                        assert r.status == 200, (path, await r.text())
                        assert not [h for h in r.headers if h.lower().startswith("x-ratelimit")]
    assert len(stub.ledger.records) == 3
    assert {r.key for r in stub.ledger.records} <= set(tokens)


@run_async
async def test_openai_sdk_streams_through_the_gateway_and_the_budget_settles_on_usage():
    async with await start_openai(keys=OPENAI_KEYS[1:2], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS[1:2])) as gw:
            async with openai_client(gw) as client:
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=MESSAGES, max_tokens=8, stream=True
                )
                chunks = [chunk async for chunk in stream]
            snap = gw.snapshot()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("stub")
    # The gateway asked for usage (its token budget settles on it) and kept that chunk from the
    # client, which did not ask.
    assert chunks and all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    tokens = [b for b in snap.budgets if b.name == "tokens"]
    assert tokens and sum(b.settled for b in tokens) > 0
    assert snap.clients is not None and dict(snap.clients.statuses) == {200: 1}


@run_async
async def test_openai_sdk_that_asks_for_usage_gets_it():
    async with await start_openai(keys=OPENAI_KEYS[1:2], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, OPENAI_KEYS[1:2])) as gw:
            async with openai_client(gw) as client:
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=MESSAGES,
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


@run_async
async def test_anthropic_sdk_streams_through_the_gateway():
    keys = ["sk-ant-sdk-bbbbbbbbbbbb"]
    async with await start_anthropic(keys=keys) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, keys)) as gw:
            async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=TOKEN, max_retries=0) as client:
                async with client.messages.stream(
                    model="claude-stub", max_tokens=16, messages=MESSAGES
                ) as stream:
                    text = "".join([t async for t in stream.text_stream])
                    final = await stream.get_final_message()
    assert text.startswith("stub") and final.usage.output_tokens > 0
    assert [r.outcome for r in stub.ledger.records] == ["ok"]
