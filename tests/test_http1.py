"""The lean HTTP/1.1 client (engine/http1.py) against real servers on loopback:
an aiohttp app for well-formed HTTP, a raw TCP server for what breaks it."""

import asyncio
import contextlib
import functools
import gzip
import os
import shutil
import ssl
import subprocess
import zlib

import pytest
from aiohttp import web
from yarl import URL

from ratedeck.engine.http1 import (
    BadAnswer,
    ConnectFailed,
    Disconnected,
    HttpClient,
    IncompleteBody,
)


def run_async(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))

    return run


class App:
    """An aiohttp server that records each request: (peer port, method, path_qs, headers, body)."""

    def __init__(self):
        self.seen: list[tuple[int, str, str, dict, bytes]] = []
        self.open_now = 0
        self.most_open = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername")[1]
        self.seen.append((peer, request.method, request.path_qs, dict(request.headers), body))
        what = request.match_info["what"]
        if what == "ok":
            return web.json_response({"ok": True})
        if what == "close":
            return web.Response(text="bye", headers={"Connection": "close"})
        if what == "chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for part in (b"one,", b"two,", b"three"):
                await resp.write(part)
            await resp.write_eof()
            return resp
        if what == "gzip":
            return web.Response(body=gzip.compress(b"packed" * 100), headers={"Content-Encoding": "gzip"})
        if what == "deflate":
            return web.Response(body=zlib.compress(b"squeezed"), headers={"Content-Encoding": "deflate"})
        if what == "big200":
            return web.Response(body=b"x" * 300_000)
        if what == "big500":
            return web.Response(status=500, body=b"e" * 300_000)
        if what == "nocontent":
            return web.Response(status=204)
        if what == "hold":  # counts concurrent requests, answers when released
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
            await self.release.wait()
            self.open_now -= 1
            return web.Response(text="held")
        if what == "shortlived":  # a server that keeps idle connections 1 s and says so
            return web.Response(text="ok", headers={"Keep-Alive": "timeout=1, max=100"})
        if what == "status429":
            return web.Response(status=429, text="slow down")
        if what == "hang":
            await asyncio.sleep(30)
        return web.Response(status=404)


@contextlib.asynccontextmanager
async def served(max_connections: int, **kwargs):
    """An `App` on loopback and a client for it: (app, base URL, client); both closed after."""
    app = App()
    runner, base = await start_app(app)
    client = HttpClient(max_connections, **kwargs)
    try:
        yield app, base, client
    finally:
        await client.close()
        await runner.cleanup()


async def start_app(app: App):
    web_app = web.Application()
    web_app.router.add_route("*", "/{what}", app.handle)
    runner = web.AppRunner(web_app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def raw_server(answer: bytes, close: bool = True):
    """A TCP server that reads a request head and writes `answer` as is (then closes)."""

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@run_async
async def test_keep_alive_one_connection_for_sequential_requests_and_the_request_as_sent():
    async with served(4) as (app, base, client):
        for i in range(5):
            answer = await client.request(
                "GET", URL(f"{base}/ok?n={i}&k=a%2Fb", encoded=True), {"X-Key": "k1"}
            )
            assert answer.status == 200 and answer.body == b'{"ok": true}'
            assert answer.headers["content-type"].startswith("application/json")
        post = await client.request("POST", URL(f"{base}/ok"), {"User-Agent": "t"}, {"a": "1 2", "b": "x&y"})
        assert post.status == 200
    assert client.connections_made == 1
    assert len({peer for peer, *_ in app.seen}) == 1
    assert [path for _, _, path, _, _ in app.seen[:5]] == [f"/ok?n={i}&k=a%2Fb" for i in range(5)]
    _, method, _, headers, body = app.seen[0]
    assert method == "GET" and headers["X-Key"] == "k1" and headers["Host"] == base.split("//")[1]
    _, method, _, headers, body = app.seen[5]
    assert method == "POST" and body == b"a=1+2&b=x%26y"
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert headers["Content-Length"] == str(len(body))


@run_async
async def test_bodies_chunked_compressed_empty_and_a_closing_server():
    async with served(4) as (app, base, client):
        assert (await client.request("GET", URL(f"{base}/chunked"), {})).body == b"one,two,three"
        assert (await client.request("GET", URL(f"{base}/gzip"), {})).body == b"packed" * 100
        assert (await client.request("GET", URL(f"{base}/deflate"), {})).body == b"squeezed"
        assert (await client.request("GET", URL(f"{base}/nocontent"), {})).status == 204
        assert client.connections_made == 1  # all of those on one connection
        assert (await client.request("HEAD", URL(f"{base}/ok"), {})).status == 200
        assert (await client.request("GET", URL(f"{base}/ok"), {})).status == 200
        made = client.connections_made
        assert (await client.request("GET", URL(f"{base}/close"), {})).body == b"bye"
        assert (await client.request("GET", URL(f"{base}/ok"), {})).status == 200
        assert client.connections_made == made + 1  # "Connection: close" was honoured


@run_async
async def test_an_error_body_is_read_only_up_to_the_limit_a_success_body_whole():
    async with served(4) as (app, base, client):
        big = await client.request("GET", URL(f"{base}/big200"), {}, error_limit=1000)
        assert len(big.body) == 300_000
        err = await client.request("GET", URL(f"{base}/big500"), {}, error_limit=1000)
        assert err.status == 500 and err.body == b"e" * 1000
        assert (await client.request("GET", URL(f"{base}/ok"), {})).status == 200  # a new connection


@run_async
async def test_never_more_connections_than_allowed_and_every_request_answered():
    async with served(3) as (app, base, client):
        tasks = [asyncio.create_task(client.request("GET", URL(f"{base}/hold"), {})) for _ in range(10)]
        while app.open_now < 3:  # the first three reach the server; the rest wait for a connection
            await asyncio.sleep(0.01)
        app.release.set()
        answers = await asyncio.gather(*tasks)
    assert [a.body for a in answers] == [b"held"] * 10
    assert app.most_open == 3 and client.connections_made == 3


@run_async
async def test_a_cancelled_request_closes_its_connection_so_no_late_answer_is_misread():
    async with served(1) as (app, base, client):
        hang = asyncio.create_task(client.request("GET", URL(f"{base}/hang"), {}))
        while not app.seen:
            await asyncio.sleep(0.01)
        hang.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hang
        answer = await client.request("GET", URL(f"{base}/ok"), {})  # the one place is free again
        assert answer.body == b'{"ok": true}'
        assert client.connections_made == 2


@run_async
async def test_an_idle_connection_past_its_time_is_not_reused():
    async with served(2, idle_s=0.0) as (app, base, client):
        await client.request("GET", URL(f"{base}/ok"), {})
        await client.request("GET", URL(f"{base}/ok"), {})
    assert client.connections_made == 2


@run_async
async def test_a_server_s_keep_alive_timeout_is_heeded():
    async with served(2) as (app, base, client):
        await client.request("GET", URL(f"{base}/shortlived"), {})
        await client.request("GET", URL(f"{base}/ok"), {})  # idle under 0 s: not reused either
        await client.request("GET", URL(f"{base}/ok"), {})  # ok answers say nothing: reused
    assert client.connections_made == 2
    assert len({peer for peer, *_ in app.seen}) == 2


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("timeout=5, max=100", 4.0),
        ("max=3,timeout=2", 1.0),
        ("timeout=0", 0.0),
        ("timeout=x", None),
        ("max=9", None),
    ],
)
def test_keep_alive_header_values(value, seconds):
    from ratedeck.engine.http1 import _keep_alive_timeout

    assert _keep_alive_timeout(value) == seconds


@pytest.mark.parametrize(
    "answer, error",
    [
        (b"", Disconnected),
        (b"NOT HTTP AT ALL\r\n\r\n", BadAnswer),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", IncompleteBody),
        (b"HTTP/1.1 100 Continue\r\n\r\n", BadAnswer),
    ],
    ids=["closed", "garbage", "short", "interim"],
)
@run_async
async def test_broken_answers_raise_an_error_that_names_them(answer, error):
    server, base = await raw_server(answer)
    client = HttpClient(1)
    try:
        with pytest.raises(error) as caught:
            await client.request("GET", URL(f"{base}/x"), {})
        assert caught.value.what and base not in caught.value.what
    finally:
        await client.close()
        server.close()


@run_async
async def test_a_body_that_ends_with_the_connection_is_whole():
    server, base = await raw_server(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
    client = HttpClient(1)
    try:
        assert (await client.request("GET", URL(f"{base}/x"), {})).body == b"until the end"
    finally:
        await client.close()
        server.close()


@run_async
async def test_refused_connection_is_named():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = HttpClient(1)
    with pytest.raises(ConnectFailed) as caught:
        await client.request("GET", URL(f"http://127.0.0.1:{port}/x"), {})
    assert caught.value.what == "connection refused"
    await client.close()


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent():
    async def go():
        client = HttpClient(1)
        with pytest.raises(ValueError, match="line break"):
            await client.request("GET", URL("http://127.0.0.1:1/x"), {"X-Evil": "a\r\nHost: other"})
        assert client.connections_made == 0

    asyncio.run(go())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_checks_the_certificate_and_talks_https(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip

    async def go(trust: bool):
        app = App()
        web_app = web.Application()
        web_app.router.add_route("*", "/{what}", app.handle)
        runner = web.AppRunner(web_app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls).start()
        port = runner.addresses[0][1]
        client = HttpClient(1)
        try:
            return await client.request("GET", URL(f"https://localhost:{port}/ok"), {})
        finally:
            await client.close()
            await runner.cleanup()

    with pytest.raises(ConnectFailed) as caught:  # a certificate nobody vouches for
        asyncio.run(go(trust=False))
    assert caught.value.what == "cannot connect (SSLCertVerificationError)"
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now the system's trust includes it
    assert asyncio.run(go(trust=True)).body == b'{"ok": true}'
    assert os.environ["SSL_CERT_FILE"] == str(cert)


@run_async
async def test_a_host_name_is_looked_up_once_for_many_connections_and_each_address_tried():
    app = App()
    runner, base = await start_app(app)  # listens on 127.0.0.1 only: ::1, if localhost has it, refuses
    port = int(base.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    real_lookup, lookups = loop.getaddrinfo, []

    async def counted(host, *args, **kwargs):  # the real lookup, counted
        lookups.append(host)
        return await real_lookup(host, *args, **kwargs)

    loop.getaddrinfo = counted
    client = HttpClient(5)
    try:
        tasks = [
            asyncio.create_task(client.request("GET", URL(f"http://localhost:{port}/hold"), {}))
            for _ in range(5)
        ]
        while app.open_now < 5:
            await asyncio.sleep(0.01)
        app.release.set()
        answers = await asyncio.gather(*tasks)
    finally:
        await client.close()
        await runner.cleanup()
    assert [a.body for a in answers] == [b"held"] * 5 and client.connections_made == 5
    assert lookups == ["localhost"]
    assert all(seen[3]["Host"] == f"localhost:{port}" for seen in app.seen)


@run_async
async def test_the_probe_times_real_round_trips_and_stops_at_a_429():
    from ratedeck.engine.probe import Probe

    app = App()
    runner, base = await start_app(app)
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    enough = asyncio.Event()
    problems: list[str] = []

    def observe(rtt_s: float, now: float) -> None:
        samples.append(rtt_s)
        if len(samples) == 3:
            enough.set()

    probe = Probe(f"{base}/ok", 200.0, timeout_s=2.0)
    try:
        task = asyncio.create_task(probe.run(loop.time, observe, problems.append))
        await enough.wait()
        task.cancel()
        limited = Probe(f"{base}/status429", 200.0, timeout_s=2.0)
        await limited.run(loop.time, observe, problems.append)  # ends by itself at the 429
        await limited.close()
    finally:
        await probe.close()
        await runner.cleanup()
    assert len(samples) >= 3 and all(0 < s < 2.0 for s in samples)
    assert probe.answered >= 3 and probe.failed == 0
    assert limited.sent == 1 and problems and "429" in problems[0]
    assert all(seen[3].get("User-Agent") is None for seen in app.seen)  # nothing but the GET


@run_async
async def test_url_credentials_go_as_http_basic_and_a_key_header_wins_over_them():
    import base64 as b64

    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import KeySpec, TargetConfig
    from ratedeck.engine.transport import HttpTransport

    async with served(2) as (app, base, _client):
        url = base.replace("http://", "http://ops%20user:s3cret-pw@") + "/ok"
        key = KeySpec(label="k1", secret="key-000000000001", policies=())
        plain = HttpTransport(TargetConfig(url=url, key_param="api_key", key_header=""), url, 2)
        keyed = HttpTransport(TargetConfig(url=url, key_param="", key_header="authorization"), url, 2)
        try:
            assert (await plain.send(key, Request(1, 0.0, 10.0), None)).status == 200
            assert (await keyed.send(key, Request(2, 0.0, 10.0), None)).status == 200
        finally:
            await plain.close()
            await keyed.close()
    basic = "Basic " + b64.b64encode(b"ops user:s3cret-pw").decode()
    assert app.seen[0][3]["Authorization"] == basic and "s3cret" not in app.seen[0][2]
    assert app.seen[1][3]["Authorization"] == "Bearer key-000000000001"
    assert list(app.seen[1][3]).count("Authorization") == 1
