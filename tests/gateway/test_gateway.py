"""`ratedeck gateway` in-process against the API stubs: what a client gets, what the upstream sees."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEY_A, KEY_B = "sk-gw-aaaaaaaaaaaaaaaa", "sk-gw-bbbbbbbbbbbbbbbb"
PROMPT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def post(
    session: aiohttp.ClientSession, url: str, body=PROMPT, headers=AUTH, path="/v1/chat/completions"
):
    async with session.post(url + path, json=body, headers=headers) as r:
        return r.status, r.headers.copy(), await r.read()


@run_async
async def test_a_call_is_answered_with_the_upstreams_answer_and_never_the_key():
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A])) as gw:
            async with aiohttp.ClientSession() as s:
                status, headers, body = await post(s, gw.url)
    assert status == 200
    assert b"chat.completion" in body and KEY_A.encode() not in body
    assert headers["Content-Type"].startswith("application/json")
    assert not [
        h for h in headers if h.lower().startswith("x-ratelimit")
    ]  # one key's numbers, not the client's
    assert "openai-processing-ms" in headers  # the API's own headers pass
    assert "openai-organization" not in headers  # but not the account behind the key
    assert [r.key for r in stub.ledger.records] == [KEY_A]  # the pool's key signed it, not the token
    assert TOKEN not in str(stub.ledger.records)


@run_async
async def test_client_errors_pass_through_as_they_came():
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A])) as gw:
            async with aiohttp.ClientSession() as s:
                bad = await post(s, gw.url, body={"model": "x"})
                missing = await post(s, gw.url, path="/v1/nothing-here")
    assert bad[0] == 400 and b"'messages' is a required property" in bad[2]
    assert missing[0] == 404 and b"Invalid URL (POST /v1/nothing-here)" in missing[2]
    assert [r.status for r in stub.ledger.records] == [400, 404]  # each sent once: not retried


@run_async
async def test_a_wrong_or_missing_token_is_401_and_the_upstream_sees_nothing():
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A])) as gw:
            async with aiohttp.ClientSession() as s:
                wrong = await post(s, gw.url, headers={"Authorization": "Bearer nope"})
                none = await post(s, gw.url, headers={})
                key_itself = await post(s, gw.url, headers={"Authorization": f"Bearer {KEY_A}"})
                by_x_api_key = await post(s, gw.url, headers={"x-api-key": TOKEN})
    for status, _headers, body in (wrong, none, key_itself):
        assert status == 401
        error = __import__("json").loads(body)["error"]
        assert error["code"] == "invalid_api_key" and error["type"] and error["message"]
    assert by_x_api_key[0] == 200
    assert len(stub.ledger.records) == 1  # only the one with the token


@run_async
async def test_a_key_out_of_quota_leaves_the_pool_and_its_request_goes_to_another():
    async with await start_openai(keys=[KEY_A, KEY_B], rpm=1000, tpm=1_000_000, no_quota=[KEY_A]) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A, KEY_B])) as gw:
            async with aiohttp.ClientSession() as s:
                answers = await asyncio.gather(*(post(s, gw.url) for _ in range(6)))
    assert [a[0] for a in answers] == [200] * 6
    assert len(stub.ledger.select(key=KEY_A, outcome="insufficient_quota")) == 1  # tried once, then out
    assert len(stub.ledger.accepted(key=KEY_B)) == 6


@run_async
async def test_requests_beyond_the_limits_wait_and_all_succeed():
    # 10 per 0.5 s (the stub's minute scaled): 40 at once are 4x what one window takes.
    async with await start_openai(keys=[KEY_A], rpm=10, tpm=1_000_000, minute_s=0.5) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A])) as gw:
            async with aiohttp.ClientSession() as s:
                answers = await asyncio.gather(*(post(s, gw.url) for _ in range(40)))
            view = gw.source.view()
    assert [a[0] for a in answers] == [200] * 40
    assert len(stub.ledger.accepted()) == 40
    assert view.waiting == 0 and view.answered == 40 and view.wait_p99_ms > 100


async def _saturated(stub_url: str, s: aiohttp.ClientSession, gw_url: str) -> None:
    """The one key's minute used (1 per minute): whatever comes next has to wait."""
    assert (await post(s, gw_url))[0] == 200


@run_async
async def test_past_its_max_wait_a_request_is_503_with_retry_after_and_never_sent():
    async with await start_openai(keys=[KEY_A], rpm=1, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY_A])) as gw:
            async with aiohttp.ClientSession() as s:
                await _saturated(stub.url, s, gw.url)
                status, headers, body = await post(s, gw.url, headers={**AUTH, "ratedeck-max-wait": "200ms"})
                fast = await post(s, gw.url, headers={**AUTH, "ratedeck-fail-fast": "1"})
                bad = await post(s, gw.url, headers={**AUTH, "ratedeck-max-wait": "soon"})
            snap = gw.snapshot()
            engine = gw.engine
            assert (engine.parts.path.in_flight, len(engine.parts.queues)) == (0, 0)
    assert status == 503 and int(headers["Retry-After"]) >= 1 and b"no capacity" in body
    assert fast[0] == 429 and int(fast[1]["Retry-After"]) >= 1
    assert bad[0] == 400 and b"ratedeck-max-wait" in bad[2]
    assert len(stub.ledger.records) == 1  # neither waiting request reached the upstream
    assert snap.shed == 2


@run_async
async def test_a_full_queue_answers_503_at_once():
    hold = asyncio.Event()
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000, hold=hold) as stub:
        cfg = gateway_config("openai", stub.url, [KEY_A], engine={"queue_max": 1})
        async with running_gateway(cfg) as gw:
            async with aiohttp.ClientSession() as s:
                first = asyncio.ensure_future(post(s, gw.url))  # in flight, held by the stub
                while not stub.ledger.records:
                    await asyncio.sleep(0.01)
                second = asyncio.ensure_future(post(s, gw.url))  # queued: one per key until the first answer
                while not len(gw.engine.parts.queues):
                    await asyncio.sleep(0.01)
                third = await post(s, gw.url)
                hold.set()
                assert (await first)[0] == 200 and (await second)[0] == 200
    assert third[0] == 503 and int(third[1]["Retry-After"]) >= 1 and b"queue is full" in third[2]


class Recorder:
    """A loopback target recording what reached it; POSTs to /slow never answer in time."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, CIMultiDict]] = []
        self.bodies: list[bytes] = []
        self.times: list[float] = []  # arrivals, on the loop's clock
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path_qs, CIMultiDict(request.headers)))  # names in any case
        self.bodies.append(await request.read())
        self.times.append(asyncio.get_running_loop().time())
        if request.path == "/api/v1/slow":
            await asyncio.sleep(5)
        return web.json_response({"ok": True}, headers={"X-Request-Id": f"req-{len(self.seen)}"})

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/api"
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def _plain(url: str, limit: str = "100/1s", **engine):
    from ratedeck.config import load_config

    data = {
        "target": {"url": url, "key_header": "Authorization", "timeout_s": 0.3},
        "keys": {"secrets": [KEY_A, KEY_B], "limits": [limit]},
        "engine": {"max_attempts": 3, **engine},
    }
    return load_config(None, None, data)


async def raw_request(gw, target: str, host: str = "evil.example") -> bytes:
    """Send a request line as written (no client library normalises it); the status line back."""
    reader, writer = await asyncio.open_connection(gw.host, int(gw.url.rsplit(":", 1)[1]))
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode()
    )
    line = await reader.readline()
    writer.close()
    return line


@run_async
async def test_paths_never_leave_the_target_and_host_headers_are_ignored():
    async with Recorder() as target, running_gateway(_plain(target.url)) as gw:
        ok = await raw_request(gw, "/v1/items?q=1")
        absolute = await raw_request(gw, "http://evil.example/v1/abs")  # only its path counts
        refused = [
            await raw_request(gw, path)
            for path in (
                "/v1/../../etc/passwd",
                "/v1/%2e%2e/%2e%2e/etc/passwd",
                "/v1/a%2Fb",
                "//evil.example/x",
            )
        ]
    assert ok.startswith(b"HTTP/1.1 200") and absolute.startswith(b"HTTP/1.1 200")
    assert all(line.startswith(b"HTTP/1.1 400") for line in refused), refused
    paths = [p for _m, p, _h in target.seen]
    assert paths == ["/api/v1/items?q=1", "/api/v1/abs"]  # the target's base + the client's path
    for _m, _p, headers in target.seen:
        assert headers["Host"].startswith("127.0.0.1:") and headers["Authorization"] in (
            f"Bearer {KEY_A}",
            f"Bearer {KEY_B}",
        )


@run_async
async def test_a_write_that_cannot_be_settled_is_502_uncertain_and_not_sent_again():
    async with Recorder() as target, running_gateway(_plain(target.url)) as gw:
        async with aiohttp.ClientSession() as s:
            status, _h, body = await post(s, gw.url, body={"x": 1}, path="/v1/slow")
    assert status == 502
    error = __import__("json").loads(body)["error"]
    assert error["type"] == "uncertain" and "uncertain" in error["message"]
    assert [m for m, _p, _h in target.seen] == ["POST"]  # never retried on another account


@run_async
async def test_an_idempotency_key_goes_upstream_with_its_retries_on_one_key():
    async with Recorder() as target, running_gateway(_plain(target.url)) as gw:
        async with aiohttp.ClientSession() as s:
            status, _h, _b = await post(
                s, gw.url, body={"x": 1}, path="/v1/slow", headers={**AUTH, "Idempotency-Key": "idem-1"}
            )
    # Keyed: retried (max_attempts 3), every attempt with the client's key, on the first key only.
    assert status == 502
    sent = [h for m, _p, h in target.seen if m == "POST"]
    assert len(sent) == 3
    assert {h["Idempotency-Key"] for h in sent} == {"idem-1"}
    assert len({h["Authorization"] for h in sent}) == 1


@run_async
async def test_a_drain_finishes_in_flight_answers_queued_503_and_takes_no_new_client():
    hold = asyncio.Event()
    async with await start_openai(keys=[KEY_A], rpm=1000, tpm=1_000_000, hold=hold) as stub:
        cfg = gateway_config("openai", stub.url, [KEY_A])
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            in_flight = asyncio.ensure_future(post(s, gw.url))
            while not stub.ledger.records:  # the first is at the stub, held there
                await asyncio.sleep(0.01)
            queued = asyncio.ensure_future(post(s, gw.url))  # one per key until the first answer
            while not len(gw.engine.parts.queues):
                await asyncio.sleep(0.01)
            stopping = asyncio.ensure_future(gw.stop(drain_timeout_s=5))
            status, headers, body = await queued  # answered at once, while the first is held
            assert not in_flight.done()
            try:
                late = await post(s, gw.url)
            except aiohttp.ClientError:
                late = None  # the listening socket is closed: refused outright
            hold.set()
            first = await in_flight
            snap = await stopping
    assert status == 503 and int(headers["Retry-After"]) >= 1 and b"stopping" in body
    assert first[0] == 200
    assert late is None or late[0] == 503
    assert len(stub.ledger.records) == 1 and snap.balance() == 0 and snap.shed == 1


@pytest.mark.slow
@run_async
async def test_two_gateways_share_a_keys_budget_through_redis(redis_server):
    async with Recorder() as target:
        cfg = _plain(target.url, "5/1s").replace(store=redis_server.url)
        cfg = cfg.replace(keys=cfg.engine_settings.keys[:1])  # one key, 5 per second, for both gateways
        async with running_gateway(cfg) as one, running_gateway(cfg) as two, aiohttp.ClientSession() as s:
            answers = await asyncio.gather(
                *(post(s, gw.url, body={"n": i}, path="/v1/items") for gw in (one, two) for i in range(6))
            )
    assert [a[0] for a in answers] == [200] * 12
    times = sorted(target.times)
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= 5  # never more than the key's limit in any second, across both gateways
