"""Measure the gateway with the official SDKs on the LLM stubs (wall time), as docs/measurements.md's gateway runs are made.

    .venv/bin/python -m ratedeck.bench.measure_gateway openai 40            # 3 keys, one with no quota
    .venv/bin/python -m ratedeck.bench.measure_gateway openai-stream 40     # the same, half the prompts streamed
    .venv/bin/python -m ratedeck.bench.measure_gateway anthropic 40         # 2 keys, 3% 529s
    .venv/bin/python -m ratedeck.bench.measure_gateway two 40               # two gateways, one redis-server
    .venv/bin/python -m ratedeck.bench.measure_gateway one-store 40         # one gateway on a redis-server

A gateway (the preset as shipped, no tier told) runs in front of the stub; the official
SDK, with its retries off (`max_retries=0`), sends prompts of many sizes through it, 40 at
a time, for the given seconds, then lets the last ones finish. Prints what the stub's
ledger says (tokens charged against the live keys' capacity over the time the stub was
receiving, 429s by code, duplicates) and what the client saw: every error by type, and
for streams whether each text equals the one the stub wrote.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from typing import Any

from ratedeck.bench.measure_llm import ANTHROPIC_KEYS, MINUTE_S, OPENAI_KEYS, prompts, sending_window
from ratedeck.config import load_config
from ratedeck.config.settings import GatewaySettings
from ratedeck.gateway.service import GatewayService
from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.openai import start_openai

TOKEN = "measure-gateway-token"
AT_ONCE = 40


class Seen:
    """What the client saw: answers, errors by type, streamed texts by answer id."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self.streamed: dict[str, str] = {}


async def _openai_call(client: Any, line: dict, stream: bool, seen: Seen) -> None:
    import openai

    body = line["_body"]
    try:
        if stream:
            parts: list[str] = []
            answer_id = ""
            chunks = await client.chat.completions.create(**body, stream=True)
            async for chunk in chunks:
                answer_id = chunk.id or answer_id
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
            seen.streamed[answer_id] = "".join(parts)
        else:
            await client.chat.completions.create(**body)
        seen.ok += 1
    except openai.APIError as exc:
        seen.errors[f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()] += 1


async def _anthropic_call(client: Any, line: dict, seen: Seen) -> None:
    import anthropic

    body = line["_body"]
    try:
        await client.messages.create(**body)
        seen.ok += 1
    except anthropic.APIError as exc:
        seen.errors[f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()] += 1


async def _drive(call: Any, lines: list[dict], seconds: float, at_once: int = AT_ONCE) -> None:
    """`at_once` workers take the next prompt until `seconds` pass, then finish what they hold."""
    todo = iter(enumerate(lines))
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        for i, line in todo:
            if time.monotonic() >= stop_at:
                return
            await call(i, line)

    await asyncio.gather(*(worker() for _ in range(at_once)))


async def _gateway(preset: str, url: str, keys: list[str], store: str | None = None) -> GatewayService:
    data: dict[str, Any] = {
        # RATEDECK_HTTP_CLIENT=aiohttp measures the other HTTP client.
        "target": {"url": url, "http_client": os.environ.get("RATEDECK_HTTP_CLIENT", "reqwest")},
        "keys": {"secrets": keys},
        "engine": {"graveyard_path": ""},
    }
    if store is not None:
        data["run"] = {"store": store}
    cfg = load_config(None, preset, data)
    service = GatewayService(cfg, GatewaySettings(listen="127.0.0.1:0", token=TOKEN))
    await service.start()
    return service


def _openai_ledger(stub: Any, started: float, live: list[str]) -> tuple[float, float, int, int]:
    """The OpenAI stub's own count: tokens charged to the live keys, their capacity over the
    sending window, rate-limit 429s and `insufficient_quota` answers."""
    start, end = sending_window(stub, started)
    used = sum(stub.ledger.units(key=k) for k in live)
    cap = sum(stub.allowed_capacity(start, end, key=k) for k in live)
    refusals = stub.state.book.refusals.values()
    rate = sum(c["rate_limit_exceeded"] for c in refusals)
    quota = sum(c["insufficient_quota"] for c in refusals)
    return used, cap, rate, quota


async def openai_run(seconds: float, stream_half: bool) -> str:
    import openai

    live = OPENAI_KEYS[:2]
    async with await start_openai(
        keys=OPENAI_KEYS, rpm=500, tpm=30_000, minute_s=MINUTE_S, no_quota=OPENAI_KEYS[2:], latency=0.3
    ) as stub:
        started = stub.now()
        service = await _gateway("openai", stub.url, OPENAI_KEYS)
        client = openai.AsyncOpenAI(base_url=service.url + "/v1", api_key=TOKEN, max_retries=0, timeout=600)
        seen = Seen()
        try:
            await _drive(
                lambda i, line: _openai_call(client, line, stream_half and i % 2 == 1, seen),
                prompts(6000, "/v1/chat/completions"),
                seconds,
            )
        finally:
            await client.close()
            snap = await service.stop(drain_timeout_s=5.0)
        used, cap, rate, quota = _openai_ledger(stub, started, live)
        book = stub.state.book
        written = {a.id: a.text for a in stub.state.answered if a.streamed}
        whole = sum(1 for answer_id, text in seen.streamed.items() if written.get(answer_id) == text)
        streams = f"; streams {len(seen.streamed)}, whole {whole}" if stream_half else ""
        return (
            f"{'openai-stream' if stream_half else 'openai'}: {used:,.0f} of {cap:,.0f} tokens ({used / cap:.3f}); "
            f"rate-limit 429s {rate}, insufficient_quota {quota}, duplicates {book.duplicates()}; "
            f"client ok {seen.ok}, errors {dict(seen.errors) or 0}{streams}; engine succeeded {snap.succeeded}"
        )


async def anthropic_run(seconds: float) -> str:
    import anthropic

    keys = ANTHROPIC_KEYS[:2]
    async with await start_anthropic(
        keys=keys, rpm=500, itpm=60_000, otpm=12_000, minute_s=MINUTE_S, overload_share=0.03, latency=0.3
    ) as stub:
        started = stub.now()
        service = await _gateway("anthropic", stub.url, keys)
        client = anthropic.AsyncAnthropic(base_url=service.url, api_key=TOKEN, max_retries=0, timeout=600)
        seen = Seen()
        try:
            await _drive(
                lambda i, line: _anthropic_call(client, line, seen), prompts(6000, "/v1/messages"), seconds
            )
        finally:
            await client.close()
            snap = await service.stop(drain_timeout_s=5.0)
        start, end = sending_window(stub, started)
        used = sum(stub.state.output_used.values())
        cap = sum(stub.allowed_capacity(start, end, key=k, bucket="output-tokens") for k in keys)
        book = stub.state.book
        rate = sum(c["rate_limit_error"] for c in book.refusals.values())
        over = sum(c["overloaded_error"] for c in book.refusals.values())
        return (
            f"anthropic: {used:,.0f} of {cap:,.0f} output tokens ({used / cap:.3f}); rate-limit 429s {rate}, "
            f"529s {over}, duplicates {book.duplicates()}; client ok {seen.ok}, errors {dict(seen.errors) or 0}; "
            f"engine succeeded {snap.succeeded}"
        )


async def two_run(seconds: float, gateways: int = 2) -> str:
    """Two gateways (or `gateways`), each with its own SDK client (40 at a time between them),
    one key pool through one redis-server."""
    import openai

    from ratedeck.bench.cluster import RedisProcess

    live = OPENAI_KEYS[:2]
    redis = RedisProcess()
    try:
        async with await start_openai(
            keys=OPENAI_KEYS, rpm=500, tpm=30_000, minute_s=MINUTE_S, no_quota=OPENAI_KEYS[2:], latency=0.3
        ) as stub:
            started = stub.now()
            services = [await _gateway("openai", stub.url, OPENAI_KEYS, redis.url) for _ in range(gateways)]
            clients = [
                openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=TOKEN, max_retries=0, timeout=600)
                for s in services
            ]
            seen = Seen()
            lines = prompts(6000, "/v1/chat/completions")
            try:
                await asyncio.gather(
                    *(
                        _drive(
                            lambda i, line, c=c: _openai_call(c, line, False, seen),
                            lines[n::gateways],
                            seconds,
                            AT_ONCE // gateways,
                        )
                        for n, c in enumerate(clients)
                    )
                )
            finally:
                for c in clients:
                    await c.close()
                snaps = [await s.stop(drain_timeout_s=5.0) for s in services]
            used, cap, rate, quota = _openai_ledger(stub, started, live)
            book = stub.state.book
            return (
                f"{gateways} gateway(s) on a store: {used:,.0f} of {cap:,.0f} tokens ({used / cap:.3f}); rate-limit 429s {rate}, "
                f"insufficient_quota {quota}, duplicates {book.duplicates()}; client ok {seen.ok}, "
                f"errors {dict(seen.errors) or 0}; engines succeeded {[s.succeeded for s in snaps]}"
            )
    finally:
        redis.close()


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "openai"
    seconds = float(argv[1]) if len(argv) > 1 else 40.0
    if which == "anthropic":
        line = asyncio.run(anthropic_run(seconds))
    elif which == "two":
        line = asyncio.run(two_run(seconds))
    elif which == "one-store":
        line = asyncio.run(two_run(seconds, gateways=1))
    elif which in ("openai", "openai-stream"):
        line = asyncio.run(openai_run(seconds, which == "openai-stream"))
    else:
        print(
            f"measure_gateway: unknown case {which!r}; known: openai, openai-stream, anthropic, two, one-store",
            file=sys.stderr,
        )
        return 2
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
