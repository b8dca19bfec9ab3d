"""The LLM stubs stream as the real APIs do (``"stream": true``), checked with aiohttp on loopback.

OpenAI: ``chat.completion.chunk`` events, the usage chunk only with
``stream_options.include_usage``, ``data: [DONE]``. Anthropic: the Messages event
types in order, usage split between ``message_start`` and ``message_delta``. Both:
the tokens are charged exactly as for an answer sent whole, the ledger keeps the text
answered, and a stream can be cut after N events or held half-written.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.common import FakeClock
from ratedeck.server.stubs.llm_common import StreamOptions
from ratedeck.server.stubs.openai import start_openai

T0 = 1_700_000_000.0
OAI = "sk-org-a-0123456789"
ANT = "sk-ant-a-0123456789"
ANT_HEADERS = {"x-api-key": ANT, "anthropic-version": "2023-06-01"}
OAI_HEADERS = {"Authorization": f"Bearer {OAI}"}


def run(body: Any) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=10))


def chat(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "x" * 40}],
        "max_tokens": max_tokens,
        **extra,
    }


def message(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "y" * 40}],
        "max_tokens": max_tokens,
        **extra,
    }


def split_events(raw: bytes) -> list[dict[str, str]]:
    """Each SSE event as {"event": ..., "data": ...}."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            fields[name] = value
        out.append(fields)
    return out


async def post(url: str, payload: Any, headers: dict[str, str]) -> tuple[int, Any, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, json=payload, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


def openai_text(events: list[dict[str, str]]) -> str:
    text = ""
    for e in events:
        if e["data"] == "[DONE]":
            continue
        for choice in json.loads(e["data"])["choices"]:
            text += choice["delta"].get("content") or ""
    return text


def test_openai_streams_chunks_then_done_and_usage_only_when_asked() -> None:
    async def body() -> None:
        async with await start_openai(
            clock=FakeClock(T0), keys=[OAI], streaming=StreamOptions(event_s=0)
        ) as stub:
            url = stub.url + "/v1/chat/completions"
            status, headers, raw = await post(url, chat(stream=True), OAI_HEADERS)
            assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
            events = split_events(raw)
            assert events[-1] == {"data": "[DONE]"}
            chunks = [json.loads(e["data"]) for e in events[:-1]]
            assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            assert openai_text(events) == stub.state.answered[-1].text == "stub " * 4
            assert stub.state.answered[-1].ended == "done"

            _, _, raw = await post(
                url, chat(stream=True, stream_options={"include_usage": True}), OAI_HEADERS
            )
            events = split_events(raw)
            chunks = [json.loads(e["data"]) for e in events[:-1]]
            assert all(c["usage"] is None for c in chunks[:-1])  # the docs: null on every other chunk
            assert chunks[-1]["choices"] == []
            assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}

    run(body)


def test_openai_charges_a_stream_as_it_charges_an_answer_sent_whole() -> None:
    async def body() -> None:
        costs = []
        for stream in (False, True):
            async with await start_openai(
                clock=FakeClock(T0), keys=[OAI], streaming=StreamOptions(event_s=0)
            ) as stub:
                status, headers, _ = await post(
                    stub.url + "/v1/chat/completions", chat(stream=stream), OAI_HEADERS
                )
                assert status == 200
                costs.append((stub.ledger.units(key=OAI), headers["x-ratelimit-remaining-tokens"]))
        assert costs[0] == costs[1] == (18, str(30_000 - 18))

    run(body)


def test_anthropic_streams_the_messages_event_types_in_order_with_usage_split() -> None:
    async def body() -> None:
        async with await start_anthropic(
            clock=FakeClock(T0), keys=[ANT], streaming=StreamOptions(event_s=0)
        ) as stub:
            status, headers, raw = await post(stub.url + "/v1/messages", message(stream=True), ANT_HEADERS)
            assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
            events = split_events(raw)
            kinds = [e["event"] for e in events]
            assert kinds == [
                "message_start",
                "content_block_start",
                "ping",
                *["content_block_delta"] * 4,
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
            data = [json.loads(e["data"]) for e in events]
            assert [d["type"] for d in data] == kinds  # each data names its own event
            assert data[0]["message"]["usage"] == {"input_tokens": 10, "output_tokens": 1}
            assert data[-2]["usage"] == {"output_tokens": 4}
            text = "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta")
            assert text == stub.state.answered[-1].text == "stub " * 4

    run(body)


def test_anthropic_settles_a_stream_as_it_settles_an_answer_sent_whole() -> None:
    async def body() -> None:
        seen = []
        for stream in (False, True):
            async with await start_anthropic(
                clock=FakeClock(T0), keys=[ANT], streaming=StreamOptions(event_s=0)
            ) as stub:
                status, _, _ = await post(stub.url + "/v1/messages", message(stream=stream), ANT_HEADERS)
                assert status == 200
                bucket = stub.state.buckets[ANT]["output-tokens"]
                seen.append((stub.ledger.units(key=ANT), stub.state.output_used[ANT], bucket.remaining(T0)))
        assert seen[0] == seen[1] == (14, 4, 8_000 - 4)

    run(body)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_broken_after_n_events_ends_without_its_closing_chunk(api: str) -> None:
    async def body() -> None:
        options = StreamOptions(event_s=0, break_after=3)
        if api == "openai":
            stub = await start_openai(clock=FakeClock(T0), keys=[OAI], streaming=options)
            url, payload, headers = stub.url + "/v1/chat/completions", chat(stream=True), OAI_HEADERS
        else:
            stub = await start_anthropic(clock=FakeClock(T0), keys=[ANT], streaming=options)
            url, payload, headers = stub.url + "/v1/messages", message(stream=True), ANT_HEADERS
        async with stub:
            got = b""
            async with aiohttp.ClientSession() as s, s.post(url, json=payload, headers=headers) as resp:
                assert resp.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for piece in resp.content.iter_any():
                        got += piece
            assert len(split_events(got)) == 3
            log = stub.state.answered[-1]
            assert (log.ended, log.events) == ("broken", 3)

    run(body)


def test_a_held_stream_is_seen_half_written_and_a_client_that_leaves_is_recorded() -> None:
    async def body() -> None:
        hold = asyncio.Event()
        options = StreamOptions(event_s=0, hold=hold, hold_after=2)
        async with await start_anthropic(clock=FakeClock(T0), keys=[ANT], streaming=options) as stub:
            try:
                async with aiohttp.ClientSession() as s:
                    resp = await s.post(
                        stub.url + "/v1/messages", json=message(stream=True), headers=ANT_HEADERS
                    )
                    first = await resp.content.readuntil(b"\n\n")
                    assert first.startswith(b"event: message_start")
                    log = stub.state.answered[-1]
                    assert log.writing and log.events == 2 and log.total == 10
                    resp.close()  # the client leaves mid-answer
                    hold.set()
                    for _ in range(100):
                        if not log.writing:
                            break
                        await asyncio.sleep(0.01)
                    assert log.ended == "client_gone" and log.events < log.total
            finally:
                hold.set()  # never leave the stub's handler waiting
            assert stub.ledger.units(key=ANT) == 14  # charged as a whole answer all the same

    run(body)


def test_events_are_paced_over_the_answer() -> None:
    async def body() -> None:
        async with await start_openai(keys=[OAI], streaming=StreamOptions(event_s=0.01)) as stub:
            started = time.monotonic()
            _, _, raw = await post(stub.url + "/v1/chat/completions", chat(stream=True), OAI_HEADERS)
            # 7 events (role, 4 pieces, finish, [DONE]): 6 waits of 10 ms at least
            assert len(split_events(raw)) == 7
            assert time.monotonic() - started >= 0.06

    run(body)
