"""Hostile clients: too big, malformed, too slow, a thousand idle, vanishing. None takes a queue
slot or a key, and after each the gateway's tasks, file descriptors and the engine's in-flight,
reserved and queued counts return to what they were."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

import aiohttp
import pytest

from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEY = "sk-hostile-aaaaaaaaaaaa"
PROMPT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
PROMPT_BYTES = json.dumps(PROMPT).encode()
HOSTILE = {"header_timeout_s": 0.3, "body_timeout_s": 0.3, "max_body_mb": 1}


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def counts(gw) -> dict[str, int]:
    """What must come back to its baseline: tasks, descriptors, and the engine's own counts."""
    engine = gw.engine
    return {
        "tasks": len(asyncio.all_tasks()),
        "fds": fds(),
        "in_flight": engine.parts.path.in_flight,
        "reserved": sum(w.in_flight for w in engine.parts.keys.workers),
        "queued": len(engine.parts.queues),
        "waiting": len(gw.source.waiting),
        "connections": gw.connections,
    }


def settled(gw, before: dict[str, int]) -> bool:
    """Back to the baseline: the engine's counts exactly; tasks and descriptors no more than
    before (a closed upstream connection takes its own away too)."""
    now = counts(gw)
    return all(now[k] <= before[k] if k in ("tasks", "fds") else now[k] == before[k] for k in before)


async def until(
    condition: Callable[[], bool], limit_s: float = 10.0, show: Callable[[], object] = lambda: None
) -> None:
    """Wait (bounded) for the server side to catch up: a timer or a lost connection on its loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, f"not reached in time: {show()}"
        await asyncio.sleep(0.02)


async def connect(gw) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", int(gw.url.rsplit(":", 1)[1]))


def head(length: int, *, auth: bool = True, ctype: str = "application/json") -> bytes:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {ctype}",
        f"Content-Length: {length}",
    ]
    if auth:
        lines.append(f"Authorization: Bearer {TOKEN}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1]) if line else 0


async def warm(gw) -> None:
    """One ordinary call: the engine's connection to the stub exists, the key has learnt its tier."""
    async with aiohttp.ClientSession() as s:
        async with s.post(
            gw.url + "/v1/chat/completions", json=PROMPT, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as r:
            assert r.status == 200
    await until(lambda: gw.connections == 0)  # its connection gone on the server's side too


@run_async
async def test_too_big_malformed_and_too_slow_take_no_slot_and_no_key():
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            await warm(gw)
            before, generated = counts(gw), gw.engine.parts.metrics.generated
            # Over max_body_mb, said up front: 413 without reading it.
            reader, writer = await connect(gw)
            writer.write(head(2 * 1024 * 1024))
            assert await status_of(reader) == 413
            writer.close()
            # Over max_body_mb, sent chunked (no length given): 413 once the limit is passed.
            async with aiohttp.ClientSession() as s:

                async def chunks():
                    for _ in range(20):
                        yield b"x" * 100_000

                async with s.post(
                    gw.url + "/v1/chat/completions",
                    data=chunks(),
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as r:
                    assert r.status == 413
                async with s.post(
                    gw.url + "/v1/chat/completions",
                    data=b"{not json",
                    headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                ) as r:
                    assert r.status == 400 and (await r.json())["error"]["code"] == "bad_json"
            # A body that stops coming: 408 after body_timeout_s.
            reader, writer = await connect(gw)
            writer.write(head(len(PROMPT_BYTES)) + PROMPT_BYTES[:10])
            assert await status_of(reader) == 408
            writer.close()
            # Headers that never finish: the connection is closed after header_timeout_s.
            reader, writer = await connect(gw)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            await until(lambda: settled(gw, before), show=lambda: (before, counts(gw)))
            assert gw.engine.parts.metrics.generated == generated  # none took a queue slot
    assert len(stub.ledger.records) == 1  # the warm-up only: none reached a key


@pytest.mark.slow
@run_async
async def test_a_thousand_idle_connections_are_closed_by_the_timeout():
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            await warm(gw)
            before = counts(gw)
            conns = await asyncio.gather(*(connect(gw) for _ in range(1000)))
            assert fds() >= before["fds"] + 1000
            # Every one is closed by the server: each read ends at EOF, none waits forever.
            ends = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _w in conns)), 20)
            assert ends == [b""] * 1000
            for _r, w in conns:
                w.close()
            await asyncio.gather(*(w.wait_closed() for _r, w in conns), return_exceptions=True)
            await until(lambda: settled(gw, before), show=lambda: (before, counts(gw)))
            await warm(gw)  # and it still serves
    assert len(stub.ledger.records) == 2


@run_async
async def test_vanishing_clients_withdraw_their_queued_requests():
    # One request per minute: after the warm-up every new request waits queued.
    async with await start_openai(keys=[KEY], rpm=1, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            await warm(gw)
            before, engine = counts(gw), gw.engine
            conns = await asyncio.gather(*(connect(gw) for _ in range(20)))
            for _r, w in conns:
                w.write(head(len(PROMPT_BYTES)) + PROMPT_BYTES)
            await until(lambda: engine.parts.metrics.generated == 21 and len(engine.parts.queues) == 20)
            for _r, w in conns:
                w.transport.abort()  # gone without a word
            # A client gone mid-body never queued anything.
            reader, writer = await connect(gw)
            writer.write(head(len(PROMPT_BYTES)) + PROMPT_BYTES[:5])
            writer.transport.abort()
            await until(
                lambda: engine.parts.metrics.shed == 20 and settled(gw, before),
                show=lambda: (before, counts(gw)),
            )
            snap = gw.snapshot()
            assert snap.generated == 21 and snap.balance() == 0
            assert snap.clients is not None and dict(snap.clients.statuses).get(499) == 20
    assert len(stub.ledger.records) == 1  # none of them reached the API


@run_async
async def test_a_client_gone_mid_stream_closes_the_upstream_and_leaks_nothing():
    from ratedeck.server.stubs.llm_common import StreamOptions

    hold = asyncio.Event()
    streaming = StreamOptions(hold=hold, hold_after=2)
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000, streaming=streaming) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            await warm(gw)
            before, engine = counts(gw), gw.engine
            reader, writer = await connect(gw)
            body = json.dumps({**PROMPT, "stream": True}).encode()
            writer.write(head(len(body)) + body)
            assert await status_of(reader) == 200
            while b"data:" not in await asyncio.wait_for(reader.readline(), 5):
                pass  # the first event came through; the stub now holds the rest
            writer.transport.abort()
            await until(lambda: gw.connections == 0)
            hold.set()  # the next event finds the client gone: the upstream is closed
            await until(
                lambda: engine.parts.metrics.shed == 1 and settled(gw, before),
                show=lambda: (before, counts(gw)),
            )
            snap = gw.snapshot()
    assert snap.balance() == 0 and snap.succeeded == 1  # the warm-up; the abandoned stream ended shed
