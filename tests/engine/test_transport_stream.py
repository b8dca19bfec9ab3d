"""Streamed answers through HttpTransport to a live client's sink, against the real LLM stubs on loopback.

A request with `answer` set (the gateway's client) gets a streamed answer as it
arrives, one whole SSE event per write; the usage the stream reports settles budgets
as a JSON body's would; a client gone closes the upstream; a stream broken after it
began is never retried; a non-streamed answer keeps its raw body and headers. Nothing
here sleeps to time anything: a stub holds its stream half-written until the sink has
seen the first event.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp import web

from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Ending, OutcomeKind
from ratedeck.engine.http.answer_headers import answer_headers
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.http.transport import HttpTransport
from ratedeck.engine.path.settle import SettleRules, Tally, decide
from ratedeck.engine.ports import AnswerSink
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.settings import KeySpec, TargetConfig
from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.common import FakeClock, Stub
from ratedeck.server.stubs.llm_common import StreamOptions
from ratedeck.server.stubs.openai import start_openai

T0 = 1_700_000_000.0
OAI = KeySpec(label="k1", secret="sk-org-a-0123456789", policies=())
ANT = KeySpec(label="k1", secret="sk-ant-a-0123456789", policies=())
RULES = SettleRules(max_attempts=5, backoff_base_s=0.05, backoff_cap_s=2.0)


class RecordingSink:
    """A live client that keeps what it gets; `on_write(n, chunk)` runs at each write (1-based)
    and may say the client is gone (False)."""

    def __init__(self, on_write: Any = None, begin_ok: bool = True) -> None:
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.chunks: list[bytes] = []
        self.on_write = on_write
        self.begin_ok = begin_ok

    async def begin(self, status: int, headers: Sequence[tuple[str, str]]) -> bool:
        assert self.status is None, "begin is called once"
        self.status, self.headers = status, tuple(headers)
        return self.begin_ok

    async def write(self, chunk: bytes) -> bool:
        assert self.status is not None, "begin comes first"
        self.chunks.append(chunk)
        if self.on_write is not None:
            return self.on_write(len(self.chunks), chunk) is not False
        return True

    def data(self) -> list[dict[str, Any]]:
        out = []
        for chunk in self.chunks:
            for line in chunk.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    out.append(json.loads(line[6:]))
        return out


def run(body: Any) -> Any:
    return asyncio.run(asyncio.wait_for(body(), timeout=20))


def target(api: str, url: str, timeout_s: float = 5.0) -> TargetConfig:
    if api == "anthropic":
        return TargetConfig(
            url=url,
            method="POST",
            key_header="x-api-key",
            key_format="{key}",
            headers={"anthropic-version": "2023-06-01"},
            safe_writes=True,
            timeout_s=timeout_s,
        )
    return TargetConfig(
        url=url, method="POST", key_header="Authorization", safe_writes=True, timeout_s=timeout_s
    )


def request(api: str, sink: AnswerSink | None, *, stream: bool = True, **extra: Any) -> Request:
    if api == "anthropic":
        body: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "y" * 40}],
        }
        path = "/v1/messages"
    else:
        body = {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 40}]}
        path = "/v1/chat/completions"
    if stream:
        body["stream"] = True
    body.update(extra)
    req = Request(1, 0.0, 100.0)
    req.shape = Shape(method="POST", path=path, body=body, payload=Shape.encode(body))
    req.answer = sink
    return req


async def start(api: str, options: StreamOptions) -> Stub:
    if api == "anthropic":
        return await start_anthropic(clock=FakeClock(T0), keys=[ANT.secret], streaming=options)
    return await start_openai(clock=FakeClock(T0), keys=[OAI.secret], streaming=options)


async def send(api: str, stub: Stub, req: Request, timeout_s: float = 5.0) -> Outcome:
    key = ANT if api == "anthropic" else OAI
    t = HttpTransport(target(api, stub.url, timeout_s), stub.url, 4, secrets=[key.secret])
    try:
        return await t.send(key, req, None)
    finally:
        await t.close()


async def until_ended(stub: Stub) -> str:
    """The stub's own word on how its last stream ended, once it has ended."""
    log = stub.state.answered[-1]
    for _ in range(200):
        if not log.writing:
            break
        await asyncio.sleep(0.01)
    return log.ended


# ---------------------------------------------------------------- streaming as it arrives


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_first_event_reaches_the_sink_while_the_stub_is_still_writing(api):
    seen: list[tuple[bool, int, int]] = []

    async def body() -> Outcome:
        hold = asyncio.Event()
        stub = await start(api, StreamOptions(event_s=0, hold=hold, hold_after=1))

        def first(n: int, _chunk: bytes) -> None:
            if n == 1:
                log = stub.state.answered[-1]
                seen.append((log.writing, log.events, log.total))
                hold.set()  # only now may the stub go on

        try:
            # Were the answer read whole before the sink saw it, the held stub would never
            # finish and the attempt would time out with nothing sent to the sink.
            return await send(api, stub, request(api, RecordingSink(first)), timeout_s=3.0)
        finally:
            hold.set()
            await stub.close()

    out = run(body)
    assert out.kind is OutcomeKind.OK and out.streamed
    writing, written, total = seen[0]
    assert writing and written == 1 and total > 1


def test_a_streams_slots_are_let_go_once_its_head_is_in_and_it_is_timed_to_its_head():
    # A stream may run past its slot's time: once its head is in, the request has reached the
    # server, so its slots are not held for the rest of it (`limiter._Sliding`), and its round
    # trip is the head's (`Outcome.head_s`), not the stream's whole length.
    from ratedeck.engine.limits.limiter import Stamp

    stamp = Stamp(0.0)
    stamp.out = True  # as the key worker sends it
    seen: list[bool] = []

    async def body() -> Outcome:
        hold = asyncio.Event()
        stub = await start("openai", StreamOptions(event_s=0, hold=hold, hold_after=1))

        def first(n: int, _chunk: bytes) -> None:
            if n == 1:
                seen.append(stamp.out)
                hold.set()

        req = request("openai", RecordingSink(first))
        req.mark_sent(0.0, OAI.label, (stamp,))
        try:
            return await send("openai", stub, req, timeout_s=3.0)
        finally:
            hold.set()
            await stub.close()

    out = run(body)
    assert out.streamed and seen == [False]
    assert out.head_s is not None and 0.0 < out.head_s <= out.latency_s


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_streamed_text_is_the_stubs_in_whole_events_with_the_usage_read(api):
    sink = RecordingSink()

    async def body() -> tuple[Outcome, str, str]:
        # Several tokens per event and no pacing: reads span several events at once,
        # and events get split across reads; each write must still be one whole event.
        async with await start(api, StreamOptions(event_s=0, tokens_per_event=3)) as stub:
            extra = {"stream_options": {"include_usage": True}} if api == "openai" else {}
            out = await send(api, stub, request(api, sink, max_tokens=40, **extra))
            log = stub.state.answered[-1]
            return out, log.text, log.ended

    out, text, ended = run(body)
    assert ended == "done" and sink.status == 200
    assert all(c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in sink.chunks)
    data = sink.data()
    if api == "anthropic":
        got = "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta")
        usage = {"input_tokens": 10, "output_tokens": 20}
    else:
        got = "".join(c["delta"].get("content") or "" for d in data for c in d["choices"])
        usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
        assert sink.chunks[-1] == b"data: [DONE]\n\n"
    assert got == text == "stub " * 20
    assert out.kind is OutcomeKind.OK and out.streamed and out.body is None
    assert out.response.json() == {"usage": usage}  # what `settle = "usage.output_tokens"` reads
    assert out.headers is not None and any(n.lower() == "content-type" for n, _ in out.headers)


def test_an_openai_stream_without_include_usage_reports_none():
    sink = RecordingSink()

    async def body() -> Outcome:
        async with await start("openai", StreamOptions(event_s=0)) as stub:
            return await send("openai", stub, request("openai", sink))

    out = run(body)
    assert out.kind is OutcomeKind.OK and out.response.body == b""


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_sink_gets_the_answer_headers_as_received_and_the_filter_keeps_what_a_client_may_see(api):
    sink = RecordingSink()

    async def body() -> None:
        async with await start(api, StreamOptions(event_s=0)) as stub:
            await send(api, stub, request(api, sink))

    run(body)
    names = {n.lower() for n, _ in sink.headers}
    assert "content-type" in names
    assert any(n.startswith(("anthropic-ratelimit-", "x-ratelimit-")) for n in names)
    shown = {n.lower() for n, _ in answer_headers(sink.headers, Redactor([OAI.secret, ANT.secret]))}
    assert "content-type" in shown
    assert not any(n.startswith(("anthropic-ratelimit-", "x-ratelimit-")) for n in shown)
    assert not shown & {"transfer-encoding", "connection", "content-length", "keep-alive", "date"}
    assert not shown & {"openai-organization", "anthropic-organization-id"}


# ---------------------------------------------------------------- the client leaves, the upstream breaks


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_client_gone_mid_stream_closes_the_upstream_and_sheds_the_request(api):
    async def body() -> tuple[Outcome, Request, str, int, int]:
        hold = asyncio.Event()
        stub = await start(api, StreamOptions(event_s=0, hold=hold, hold_after=3))
        req = request(api, RecordingSink(lambda n, _c: n < 2))  # gone at the second event
        try:
            out = await send(api, stub, req)
            while not stub.state.answered[-1].hung_up():  # the close travels (hyper's own thread)
                await asyncio.sleep(0.005)
            hold.set()  # the stub writes on, into a closed connection
            ended = await until_ended(stub)
            log = stub.state.answered[-1]
            return out, req, ended, log.events, log.total
        finally:
            hold.set()
            await stub.close()

    out, req, ended, written, total = run(body)
    assert ended == "client_gone" and written < total
    assert req.cancelled and out.streamed and out.kind is not OutcomeKind.OK
    verdict = decide(out, req, RULES, now=1.0)
    assert (verdict.ending, verdict.cause) == (Ending.SHED, "client gone")


def test_a_client_gone_at_begin_gets_nothing_written():
    sink = RecordingSink(begin_ok=False)

    async def body() -> tuple[Outcome, Request]:
        async with await start("anthropic", StreamOptions(event_s=0)) as stub:
            req = request("anthropic", sink)
            return await send("anthropic", stub, req), req

    out, req = run(body)
    assert sink.chunks == [] and req.cancelled
    assert decide(out, req, RULES, now=1.0).ending is Ending.SHED


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_stream_broken_after_the_first_byte_is_not_retried(api):
    sink = RecordingSink()

    async def body() -> tuple[Outcome, Request]:
        async with await start(api, StreamOptions(event_s=0, break_after=3)) as stub:
            req = request(api, sink)
            return await send(api, stub, req), req

    out, req = run(body)
    assert len(sink.chunks) == 3  # what arrived before the break went out
    assert out.streamed and out.kind is OutcomeKind.CONNECTION
    assert out.error is not None and out.error.startswith("the stream broke after the answer began")
    req.attempts = 1
    verdict = decide(out, req, RULES, now=1.0)
    assert (verdict.tally, verdict.ending, verdict.cause) == (Tally.FAILED, Ending.GRAVEYARD, "stream broken")


# ---------------------------------------------------------------- not streamed, and not asked


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_non_streamed_answer_keeps_its_raw_body_and_headers(api):
    sink = RecordingSink()

    async def body() -> tuple[Outcome, str]:
        async with await start(api, StreamOptions(event_s=0)) as stub:
            out = await send(api, stub, request(api, sink, stream=False))
            return out, stub.state.answered[-1].text

    out, text = run(body)
    assert sink.status is None and sink.chunks == []  # nothing streamed: the gateway sends it whole
    assert out.kind is OutcomeKind.OK and not out.streamed
    assert out.body == out.response.body
    doc = json.loads(out.body)
    got = doc["content"][0]["text"] if api == "anthropic" else doc["choices"][0]["message"]["content"]
    assert got == text
    names = {n.lower() for n, _ in out.headers}
    assert "content-length" in names  # raw, as received: the gateway filters with answer_headers


def test_without_a_live_client_a_stream_is_read_whole_and_nothing_raw_is_kept():
    async def body() -> Outcome:
        async with await start("anthropic", StreamOptions(event_s=0)) as stub:
            return await send("anthropic", stub, request("anthropic", None))

    out = run(body)
    assert out.kind is OutcomeKind.OK and not out.streamed
    assert out.headers is None and out.body is None
    assert out.response.body.startswith(b"event: message_start")


# ---------------------------------------------------------------- request headers a shape adds


def test_a_shapes_headers_are_sent_but_never_over_the_key_or_auth():
    got: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        got.append(dict(request.headers))
        return web.json_response({"ok": True})

    async def body() -> None:
        app = web.Application()
        app.router.add_post("/v1/messages", echo)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}"
        try:
            req = request("anthropic", RecordingSink(), stream=False)
            assert req.shape is not None
            req.shape = Shape(
                method="POST",
                path="/v1/messages",
                body=req.shape.body,
                payload=req.shape.payload,
                headers=(
                    ("x-api-key", "a-clients-own-key"),
                    ("Authorization", "Bearer a-clients-own-key"),
                    ("anthropic-version", "2024-01-01"),
                    ("anthropic-beta", "tools-2024"),
                    ("Content-Type", "application/json; charset=utf-8"),
                    ("Idempotency-Key", "abc"),
                    ("Content-Length", "1"),
                ),
            )
            t = HttpTransport(target("anthropic", url), url, 1, secrets=[ANT.secret])
            try:
                out = await t.send(ANT, req, None)
            finally:
                await t.close()
            assert out.kind is OutcomeKind.OK
        finally:
            await runner.cleanup()

    run(body)
    sent = {k.lower(): v for k, v in got[0].items()}
    assert sent["x-api-key"] == ANT.secret  # the key is ours, always
    assert "authorization" not in sent
    assert sent["anthropic-version"] == "2024-01-01"  # the client's, over the preset's
    assert sent["anthropic-beta"] == "tools-2024"
    assert sent["content-type"] == "application/json; charset=utf-8"
    assert sent["idempotency-key"] == "abc"
    assert sent["content-length"] != "1"  # aiohttp frames the body it sends


# ---------------------------------------------------------------- the header filter


def test_answer_headers_drops_what_must_not_reach_a_client():
    secret = "sk-live-0123456789abcdef"
    mask = Redactor([secret])
    headers = [
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "keep-alive, X-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("X-Hop", "named by Connection"),
        ("Content-Length", "120"),
        ("Content-Encoding", "gzip"),
        ("openai-organization", "org-abc"),
        ("OpenAI-Project", "proj_abc"),
        ("anthropic-organization-id", "0000-1111"),
        ("Set-Cookie", "__cf_bm=1; path=/"),
        ("X-Echo", f"your key was {secret}"),
        ("X-Echo-B64", base64.b64encode(f"user:{secret}".encode()).decode()),
        ("x-ratelimit-remaining-requests", "99"),
        ("request-id", "req_1"),
    ]
    kept = answer_headers(headers, mask)
    assert kept == (("Content-Type", "text/event-stream"), ("request-id", "req_1"))
    # The gateway frames what it sends (decoded, or streamed): the upstream's framing never passes.
    assert answer_headers([("Content-Length", "5"), ("Content-Encoding", "gzip")], mask) == ()
    # Its own server says its own date, name and (when it refuses) Retry-After.
    own = [("Date", "Mon"), ("Server", "cloudflare"), ("Retry-After", "2"), ("RateLimit", "r=1")]
    assert answer_headers(own, mask) == ()


# ---------------------------------------------------------------- through the engine


def _engine_run(options: StreamOptions, sink: RecordingSink) -> tuple[Request, Ending, Any, int]:
    """One streamed request with a live client through an engine on the anthropic preset
    (retrying errors, as a gateway's engine does) against the stub: the request, its
    ending, the snapshot and how many requests reached the stub."""
    from ratedeck.config import load_config
    from ratedeck.engine.library import RateDeck

    async def body() -> tuple[Request, Ending, Any, int]:
        async with await start("anthropic", options) as stub:
            cfg = load_config(
                preset="anthropic", overrides={"target": {"url": stub.url}, "keys": {"secrets": [ANT.secret]}}
            )
            async with RateDeck(cfg) as deck:
                engine = deck.engine
                assert engine is not None
                engine.parts.path.retry_errors = True
                done: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()
                template = request("anthropic", sink)
                req = engine.parts.intake.new_request()
                req.shape, req.answer = template.shape, sink
                req.on_done = lambda _r, where: done.done() or done.set_result(where)
                engine.parts.intake.submit(req)
                where = await done
                return req, where, deck.snapshot(), len(stub.ledger.records)

    return run(body)


def test_through_the_engine_a_stream_settles_its_budget_to_the_usage_it_reported():
    sink = RecordingSink()
    req, where, snap, arrived = _engine_run(StreamOptions(event_s=0), sink)
    assert where is Ending.SUCCEEDED and arrived == 1
    assert req.units is not None and req.units["output_tokens"] == 4  # settled from 8 reserved
    assert sink.data()[-1] == {"type": "message_stop"}


def test_through_the_engine_a_broken_stream_is_sent_once_and_buried():
    req, where, snap, arrived = _engine_run(StreamOptions(event_s=0, break_after=3), RecordingSink())
    assert where is Ending.GRAVEYARD and arrived == 1 and req.attempts == 1
    assert req.last_error is not None and "stream broke" in req.last_error
    assert snap.graveyard == 1 and snap.retried == 0 and snap.balance() == 0


def test_through_the_engine_a_client_gone_mid_stream_ends_shed():
    req, where, snap, arrived = _engine_run(StreamOptions(event_s=0), RecordingSink(lambda n, _c: n < 2))
    assert where is Ending.SHED and arrived == 1 and req.attempts == 1
    assert snap.shed == 1 and snap.retried == 0 and snap.balance() == 0  # ended at once, not requeued


# ---------------------------------------------------------------- streams the stubs do not send


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.mark.parametrize("said", ["overloaded_error", f"bad key {ANT.secret}"])
def test_an_error_event_mid_stream_ends_it_as_a_failure_never_retried(said):
    sink = RecordingSink()
    error = {"type": "error", "error": {"type": said, "message": "Overloaded"}}

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
        )
        await resp.write(b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    async def body() -> tuple[Outcome, Request]:
        runner, url = await _serve(handler)
        try:
            req = request("anthropic", sink)
            t = HttpTransport(target("anthropic", url), url, 1, secrets=[ANT.secret])
            try:
                return await t.send(ANT, req, None), req
            finally:
                await t.close()
        finally:
            await runner.cleanup()

    out, req = run(body)
    assert len(sink.chunks) == 2  # the error event too: the client's SDK reads it
    assert out.kind is OutcomeKind.SERVER_ERROR and out.streamed
    assert out.error is not None and out.error.startswith(
        "the stream broke after the answer began: an error event"
    )
    assert ANT.secret not in out.error  # an upstream's words are masked
    if said == "overloaded_error":
        assert out.error.endswith("(overloaded_error)")
    req.attempts = 1
    assert decide(out, req, RULES, now=1.0).ending is Ending.GRAVEYARD


def test_a_chunked_stream_that_is_not_sse_goes_out_piece_by_piece_as_it_arrives():
    lines = [json.dumps({"n": i}).encode() + b"\n" for i in range(3)]
    gate = asyncio.Event()
    seen_before_end: list[int] = []

    def on_write(n: int, _chunk: bytes) -> None:
        if n == 1:
            seen_before_end.append(n)
            gate.set()  # the server writes the rest only once the first piece arrived

    sink = RecordingSink(on_write)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(lines[0])
        await gate.wait()
        for line in lines[1:]:
            await resp.write(line)
        await resp.write_eof()
        return resp

    async def body() -> Outcome:
        runner, url = await _serve(handler)
        try:
            t = HttpTransport(target("anthropic", url, timeout_s=3.0), url, 1, secrets=[ANT.secret])
            try:
                return await t.send(ANT, request("anthropic", sink), None)
            finally:
                await t.close()
        finally:
            gate.set()
            await runner.cleanup()

    out = run(body)
    assert out.kind is OutcomeKind.OK and out.streamed and seen_before_end == [1]
    assert b"".join(sink.chunks) == b"".join(lines)


def test_events_split_on_a_blank_line_in_each_of_the_three_line_endings():
    from ratedeck.engine.http.transport import _event_end

    assert _event_end(bytearray(b"data: a\n\ndata: b\n\n"), 0) == 9
    assert _event_end(bytearray(b"data: a\r\n\r\ndata: b"), 0) == 11
    assert _event_end(bytearray(b"data: a\r\rdata: b"), 0) == 9
    assert _event_end(bytearray(b"data: a\r\n\r\nx\n\n"), 0) == 11  # the first blank line wins
    assert _event_end(bytearray(b"data: a\ndata: b\n"), 0) == -1  # not whole yet
    assert _event_end(bytearray(b"data: a\n\n"), 9) == -1  # searched from where it stopped


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_stubs_answers_usage_reads_the_same_sent_whole_or_streamed(api, stream):
    from ratedeck.engine.llm.usage import usage_of

    extra = {"stream_options": {"include_usage": True}} if api == "openai" and stream else {}

    async def body() -> Outcome:
        async with await start(api, StreamOptions(event_s=0)) as stub:
            return await send(api, stub, request(api, RecordingSink(), stream=stream, **extra))

    usage = usage_of(run(body))
    assert usage is not None
    # 40 characters of prompt (10 tokens; the chat's role adds none), 8 tokens of ceiling
    assert (usage.input, usage.output, usage.cached) == (10, usage.output, 0) and 0 < usage.output <= 8
