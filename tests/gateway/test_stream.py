"""What the gateway forwards, and its streamed answer's sink (`gateway.stream`)."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from ratedeck.gateway.stream import ClientStream, usage_only, with_usage

from .support import TOKEN, gateway_config, run_async, running_gateway
from .test_gateway import KEY_A, PROMPT, Recorder, _plain

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@run_async
async def test_a_clients_own_headers_go_upstream_but_never_its_token():
    async with Recorder() as target, running_gateway(_plain(target.url)) as gw:
        async with aiohttp.ClientSession() as s:
            headers = {
                **AUTH,
                "anthropic-beta": "tools-2024",
                "x-api-key": TOKEN,
                "Content-Type": "text/plain",
            }
            async with s.post(gw.url + "/v1/notes", data=b"plain words", headers=headers) as r:
                assert r.status == 200
    ((_method, _path, seen),) = target.seen
    assert seen["anthropic-beta"] == "tools-2024" and seen["Content-Type"] == "text/plain"
    assert TOKEN not in json.dumps(list(seen.items()))  # neither in Authorization nor in x-api-key
    assert seen["Authorization"].startswith("Bearer sk-gw-")


@run_async
async def test_an_openai_stream_is_asked_for_its_usage():
    async with Recorder() as target:
        cfg = gateway_config("openai", target.url, [KEY_A])
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            body = {"model": "m", "messages": [], "stream": True}
            async with s.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH) as r:
                assert r.status == 200
            plain = {"model": "m", "messages": []}
            async with s.post(gw.url + "/v1/chat/completions", json=plain, headers=AUTH) as r:
                assert r.status == 200
    streamed, unstreamed = (json.loads(b) for b in target.bodies)
    assert streamed["stream_options"] == {"include_usage": True}  # so the token budget settles
    assert "stream_options" not in unstreamed


def test_with_usage_adds_include_usage_only_where_the_client_did_not_ask():
    assert with_usage({"stream": True}) == {"stream": True, "stream_options": {"include_usage": True}}
    assert with_usage({"stream": True, "stream_options": {"include_usage": False}}) is None
    assert with_usage({"stream": False}) is None and with_usage({"messages": []}) is None
    assert with_usage([1]) is None


def test_usage_only_names_openais_last_usage_event():
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3}}\n\n'
    assert usage_only(usage)
    assert not usage_only(b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}]}\n\n')
    assert not usage_only(b"data: [DONE]\n\n")


@run_async
async def test_the_sink_streams_to_the_client_and_drops_the_usage_event_it_asked_for():
    events = [
        b'data: {"choices":[{"delta":{"content":"he"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]

    async def handle(request: web.Request) -> web.StreamResponse:
        sink = ClientStream(request, lambda text: text.replace("sk-secret", "sk-***"), drop_usage=True)
        upstream_headers = [
            ("Content-Type", "text/event-stream"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-echo", "sk-secret"),
            ("x-request-id", "req-1"),
        ]
        assert await sink.begin(200, upstream_headers)
        for event in events:
            assert await sink.write(event)
        streamed = await sink.end()
        assert streamed is not None
        return streamed

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/") as r:
            got = await r.read()
            headers = r.headers
    finally:
        await runner.cleanup()
    assert got == events[0] + events[1] + events[3]  # the usage event we added never reaches the client
    assert headers["Content-Type"] == "text/event-stream" and headers["x-request-id"] == "req-1"
    assert "x-ratelimit-remaining-requests" not in headers and "x-echo" not in headers


def _own_openai_compatible(url: str, stream_usage: bool):
    """A target under the user's own config, no preset: an OpenAI-compatible API."""
    from ratedeck.config import load_config

    data = {
        "target": {
            "url": url,
            "method": "POST",
            "key_header": "Authorization",
            "key_format": "Bearer {key}",
            "stream_usage": stream_usage,
        },
        "keys": {"secrets": [KEY_A], "limits": ["100/1s"]},
    }
    return load_config(None, None, data)


@pytest.mark.parametrize("stream_usage", [True, False])
@run_async
async def test_a_target_of_the_users_own_that_declares_stream_usage_gets_it_through_the_gateway(stream_usage):
    from ratedeck.server.stubs.openai import start_openai

    body = {**PROMPT, "stream": True}
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000) as stub:
        cfg = _own_openai_compatible(stub.url, stream_usage)
        assert cfg.runner.preset is None
        async with running_gateway(cfg) as gw:
            async with aiohttp.ClientSession() as s:
                async with s.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH) as r:
                    assert r.status == 200
                    streamed = await r.read()
            snap = gw.snapshot()
    events = [e for e in streamed.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]" and not any(usage_only(e + b"\n\n") for e in events)
    assert snap.spend is not None
    (row,) = [r for r in snap.spend.rows if r.model == PROMPT["model"]]
    if stream_usage:  # asked upstream: the stream's usage was read, the client never saw it
        assert (row.answers, row.unmetered) == (1, 0) and row.input_tokens > 0 and row.output_tokens > 0
    else:  # not asked: a stream without usage, its cost unknown
        assert (row.answers, row.unmetered) == (0, 1)
