"""The HTTP transport (engine/http/transport.py on aiohttp's client, engine/http/client.py) against
real servers on loopback: aiohttp apps for well-formed HTTP, raw asyncio sockets for what
breaks it, a forward/CONNECT proxy written here, TLS with a CA made here (openssl CLI).

Issue 23's conformance list: proxies (HTTP_PROXY, an explicit one, NO_PROXY, CONNECT for
https), a gzip bomb capped, oversize headers refused, 103 then 200, framing headers refused
at config time, a kept-alive connection closed under a request retried once and counted,
IPv6 loopback, TLS with a private CA and a client certificate. Besides, the behaviours the
lean client's tests pinned (URL credentials as Basic, Accept, an empty POST's
Content-Length, form bodies, the error-body limit, keep-alive, bodies, broken answers).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import gzip
import shutil
import socket
import ssl
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from aiohttp import web

from ratedeck.engine.http.outcome import CLIENT_ERROR, CONNECTION, OK
from ratedeck.engine.http.transport import ERROR_BODY_BYTES, HttpTransport
from ratedeck.engine.request import Request
from ratedeck.engine.settings import ConfigError, KeySpec, TargetConfig

KEY = KeySpec(label="k1", secret="key-000000000001", policies=())
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def run_async(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 30))

    return run


#: The HTTP client under test: every test here runs on each (`target.http_client`).
CLIENT = "reqwest"


@pytest.fixture(autouse=True, params=["reqwest", "aiohttp"])
def client(request, monkeypatch) -> str:
    monkeypatch.setattr(sys.modules[__name__], "CLIENT", request.param)
    return request.param


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch):
    """Each test starts with no proxy in the environment (the machine's own would interfere)."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


# ---------------------------------------------------------------- servers


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
        if what == "bomb":  # 64 MiB of zeros in about 64 KiB
            return web.Response(body=BOMB, headers={"Content-Encoding": "gzip"})
        if what == "big200":
            return web.Response(body=b"x" * 300_000)
        if what == "big500":
            return web.Response(status=500, body=b"e" * 300_000)
        if what == "timed":  # one Server-Timing line per metric, the largest quoted
            resp = web.Response(text="ok")
            resp.headers.add("Server-Timing", "db;dur=10")
            resp.headers.add("Server-Timing", 'app;desc="whole";dur="53.2"')
            return resp
        if what == "hold":  # counts concurrent requests, answers when released
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
            await self.release.wait()
            self.open_now -= 1
            return web.Response(text="held")
        return web.Response(status=404)


BOMB = gzip.compress(bytes(64 << 20), compresslevel=9)


@contextlib.asynccontextmanager
async def app_server(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
    """An `App` on loopback: (app, base URL)."""
    app = App()
    web_app = web.Application()
    web_app.router.add_route("*", "/{what}", app.handle)
    runner = web.AppRunner(web_app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, host, 0, ssl_context=tls).start()
    port = runner.addresses[0][1]
    scheme = "https" if tls else "http"
    shown = "localhost" if tls else (f"[{host}]" if ":" in host else host)
    try:
        yield app, f"{scheme}://{shown}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def raw_server(answer):
    """A TCP server: for each request head read, `answer(conn_no, req_no)` gives the bytes to
    write (None: close without answering; a tuple (bytes, ...): answer, then close). Yields (base URL, requests seen as (conn, req))."""
    seen: list[tuple[int, int]] = []
    conns = [0]

    async def serve(reader, writer):
        conns[0] += 1
        conn_no, req_no = conns[0], 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                req_no += 1
                seen.append((conn_no, req_no))
                data = answer(conn_no, req_no)
                if data is None:
                    break
                close = isinstance(data, tuple)  # (bytes, "then close")
                writer.write(data[0] if close else data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


class Proxy:
    """A forward proxy on loopback: absolute-form requests forwarded (one upstream connection
    each) and CONNECT tunnels; `seen` records every request line and its Proxy-Authorization."""

    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []
        self.server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                self.seen.append((lines[0], headers.get("Proxy-Authorization")))
                if method == "CONNECT":
                    host, port = target.rsplit(":", 1)
                    up_r, up_w = await asyncio.open_connection(host, int(port))
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
                    return
                await self._forward(method, target, headers, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _forward(self, method, target, headers, reader, writer):
        assert target.startswith("http://"), target  # absolute form, as a proxy gets it
        hostport, _, path = target[len("http://") :].partition("/")
        host, port = hostport.rsplit(":", 1)
        length = int(headers.get("Content-Length", "0"))
        body = await reader.readexactly(length) if length else b""
        up_r, up_w = await asyncio.open_connection(host.strip("[]"), int(port))
        kept = [f"{k}: {v}" for k, v in headers.items() if not k.lower().startswith(("proxy-", "connection"))]
        up_w.write(
            ("\r\n".join([f"{method} /{path} HTTP/1.1", *kept, "Connection: close"]) + "\r\n\r\n").encode()
        )
        up_w.write(body)
        await up_w.drain()
        answer = await up_r.read()  # until the upstream closes
        up_w.close()
        writer.write(answer)
        await writer.drain()


async def _pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


# ---------------------------------------------------------------- helpers


def transport(url: str, **target) -> HttpTransport:
    target.setdefault("key_header", "Authorization")
    target.setdefault("http_client", CLIENT)
    return HttpTransport(TargetConfig(url=url, **target), url, 4)


async def send(t: HttpTransport, n: int = 1, **req):
    outcomes = []
    for i in range(n):
        outcomes.append(await t.send(KEY, Request(i + 1, 0.0, 100.0, **req), None))
    return outcomes[0] if n == 1 else outcomes


# ---------------------------------------------------------------- proxies


@run_async
async def test_http_proxy_from_the_environment_carries_every_request(monkeypatch):
    async with app_server() as (app, base), Proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://pu:pp@"))
        t = transport(f"{base}/ok?a=1")
        try:
            outcomes = await send(t, 3)
        finally:
            await t.close()
    assert [o.status for o in outcomes] == [200, 200, 200]
    assert len(proxy.seen) == 3 and len(app.seen) == 3
    line, auth = proxy.seen[0]
    assert line == f"GET {base}/ok?a=1 HTTP/1.1"  # absolute form: it went through the proxy
    assert auth == "Basic " + base64.b64encode(b"pu:pp").decode()
    assert app.seen[0][3]["Authorization"] == "Bearer key-000000000001"


@run_async
async def test_an_explicit_proxy_wins_and_no_proxy_bypasses_the_environment_s(monkeypatch):
    async with app_server() as (app, base), Proxy() as explicit, Proxy() as env_proxy:
        monkeypatch.setenv("HTTP_PROXY", env_proxy.url)
        t = transport(f"{base}/ok", proxy=explicit.url)
        try:
            assert (await send(t)).status == 200
        finally:
            await t.close()
        assert len(explicit.seen) == 1 and env_proxy.seen == []
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        t = transport(f"{base}/ok")
        try:
            assert (await send(t)).status == 200
        finally:
            await t.close()
    assert env_proxy.seen == [] and len(app.seen) == 2  # NO_PROXY: straight to the target


@run_async
async def test_a_run_through_http_proxy_works_from_the_library(monkeypatch):
    """The whole engine (`RateDeck`) sends through HTTP_PROXY: the environment, not a setting."""
    from ratedeck.config import load_config
    from ratedeck.engine import RateDeck

    async with app_server() as (app, base), Proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        cfg = load_config(
            overrides={
                "target": {"url": f"{base}/ok"},
                "keys": {"secrets": ["k-proxy-1"], "limits": ["50/1s"]},
                "engine": {"graveyard_path": ""},
            }
        )
        async with RateDeck(cfg) as deck:
            answers = [await deck.call({"n": str(i)}) for i in range(3)]
    assert all(a.status == 200 for a in answers)
    assert [line.split(" ")[1] for line, _ in proxy.seen] == [f"{base}/ok?n={i}" for i in range(3)]


# ---------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, all
    signed by the CA (the openssl command: the `cryptography` package is not installed)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=ratedeck test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
    )
    (d / "client.ext").write_text(
        "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
    )
    for who in ("server", "client"):
        _openssl("req", *ec, "-subj", f"/CN={who}", "-keyout", f"{who}.key", "-out", f"{who}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{who}.ext", "-out", f"{who}.pem", cwd=d)  # fmt: skip
    return d


def _server_tls(pki: Path, require_client: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.pem")
    return context


@run_async
async def test_tls_with_a_private_ca_via_ca_file_and_a_client_certificate(pki):
    async with app_server(tls=_server_tls(pki, require_client=True)) as (app, base):
        url = f"{base}/ok"
        untrusted = transport(url)  # the system's store does not know our CA
        no_cert = transport(url, ca_file=str(pki / "ca.pem"))
        good = transport(
            url,
            ca_file=str(pki / "ca.pem"),
            client_cert=str(pki / "client.pem"),
            client_key=str(pki / "client.key"),
        )
        try:
            refused = await send(untrusted)
            anonymous = await send(no_cert)
            answered = await send(good, 2)
        finally:
            for t in (untrusted, no_cert, good):
                await t.close()
    assert refused.kind is CONNECTION
    assert (
        refused.error
        == {
            "aiohttp": "cannot connect (SSLCertVerificationError)",
            "reqwest": "cannot connect (certificate)",
        }[CLIENT]
    )
    assert anonymous.status is None  # the server wants a certificate we did not give
    assert [o.status for o in answered] == [200, 200] and len(app.seen) == 2
    assert len({peer for peer, *_ in app.seen}) == 1  # one TLS connection, kept alive


@run_async
async def test_a_connect_proxy_tunnels_https_to_a_tls_target(pki, monkeypatch):
    async with app_server(tls=_server_tls(pki, require_client=False)) as (app, base), Proxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        t = transport(f"{base}/ok", ca_file=str(pki / "ca.pem"))
        try:
            outcomes = await send(t, 2)
        finally:
            await t.close()
    assert [o.status for o in outcomes] == [200, 200]
    port = base.rsplit(":", 1)[1]
    assert proxy.seen[0][0] == f"CONNECT localhost:{port} HTTP/1.1"
    assert len(proxy.seen) == 1  # the tunnel is kept alive for the second request
    assert app.seen[0][3]["Authorization"] == "Bearer key-000000000001"  # inside the tunnel only


def test_tls_files_are_checked_when_the_config_loads(tmp_path, pki):
    from ratedeck.config import load_config

    def load(**target):
        return load_config(
            overrides={"target": {"url": "https://localhost:1/x", **target}, "keys": {"secrets": ["k"]}}
        )

    with pytest.raises(ConfigError, match=r"target.ca_file: cannot load .*no such file"):
        load(ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="target.client_cert: cannot load"):
        load(client_cert=str(pki / "client.pem"), client_key=str(pki / "server.key"))  # not its key
    with pytest.raises(ConfigError, match="client_key: is set without target.client_cert"):
        load(client_key=str(pki / "client.key"))
    cfg = load(
        ca_file=str(pki / "ca.pem"), client_cert=str(pki / "client.pem"), client_key=str(pki / "client.key")
    )
    assert cfg.engine_settings.target.client_key == str(pki / "client.key")


# ---------------------------------------------------------------- answers


@run_async
async def test_a_gzip_bomb_is_capped_on_its_decompressed_size():
    async with app_server() as (app, base):
        capped = transport(f"{base}/bomb", max_body_mb=1)
        roomy = transport(f"{base}/bomb", max_body_mb=128)
        try:
            bomb = await send(capped)
            whole = await send(roomy)
        finally:
            await capped.close()
            await roomy.close()
    assert len(BOMB) < 1 << 20  # the wire carries less than the cap: only decompression exceeds it
    assert bomb.kind is CLIENT_ERROR and bomb.status == 200 and bomb.response is None
    assert "over 1 MiB once decompressed" in bomb.error
    assert whole.kind is OK and len(whole.response.body) == 64 << 20


@run_async
async def test_oversize_headers_are_refused_by_aiohttp_and_read_by_reqwest(client):
    huge = b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 20_000 + b"\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(lambda c, r: huge) as (base, _):
        t = transport(f"{base}/x")
        try:
            outcome = await send(t)
        finally:
            await t.close()
    if client == "aiohttp":  # a header line over 8,190 bytes
        assert outcome.kind is CONNECTION and outcome.error == "headers too large"
    else:  # hyper bounds the whole head, not a line
        assert outcome.kind is OK and outcome.response.headers["X-Huge"] == "h" * 20_000


@run_async
async def test_103_early_hints_then_200_is_the_200(client):
    if client == "reqwest":
        pytest.skip("hyper reads no 1xx answer but 100 on HTTP/1.1 (docs/dependencies.md)")
    answer = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    async with raw_server(lambda c, r: answer) as (base, _):
        t = transport(f"{base}/x")
        try:
            outcomes = await send(t, 2)
        finally:
            await t.close()
    assert [(o.kind, o.status, o.response.body) for o in outcomes] == [(OK, 200, b"ok")] * 2


OK_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@run_async
async def test_a_kept_alive_connection_closed_under_a_request_is_retried_once_and_counted(client):
    # Connection 1 answers its first request, then closes as the second arrives (a server
    # dropping an idle connection just as the client reuses it); connection 2 answers.
    async with raw_server(lambda c, r: OK_ANSWER if (c, r) != (1, 2) else None) as (base, seen):
        t = transport(f"{base}/x")
        try:
            outcomes = await send(t, 3)
            stats = t.stats()
        finally:
            await t.close()
    if client == "reqwest":  # not re-sent by the client: the engine retries it as any failure
        assert [o.status for o in outcomes] == [200, None, 200]
        assert outcomes[1].kind is CONNECTION and outcomes[1].error == "closed without an answer"
        assert seen == [(1, 1), (1, 2), (2, 1)]
        assert stats["retried"] == 0
        return
    assert [o.status for o in outcomes] == [200, 200, 200]
    assert seen == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert stats["retried"] == 1 and stats["no_answer"] == {}


@run_async
async def test_a_post_on_a_closed_connection_is_not_resent_by_the_client():
    # A POST is not idempotent: the client does not send it again; the engine decides (settle).
    async with raw_server(lambda c, r: OK_ANSWER if (c, r) != (1, 2) else None) as (base, seen):
        t = transport(f"{base}/x", method="POST")
        try:
            first, second = await send(t, 2)
            stats = t.stats()
        finally:
            await t.close()
    assert first.status == 200 and second.kind is CONNECTION
    assert second.error == "closed without an answer" and stats["retried"] == 0


@run_async
async def test_an_idle_connection_the_server_closed_is_not_reused():
    async with raw_server(lambda c, r: (OK_ANSWER, "then close")) as (base, seen):
        t = transport(f"{base}/x")
        try:
            first = await send(t)
            await asyncio.sleep(0.2)  # the server closes its side after one answer; the client sees it
            second = await send(t)
            stats = t.stats()
        finally:
            await t.close()
    assert first.status == 200 and second.status == 200
    assert seen == [(1, 1), (2, 1)]  # a new connection, and no send lost on the old one
    assert stats["no_answer"] == {} and stats["retried"] == 0


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
@run_async
async def test_ipv6_loopback():
    async with app_server("::1") as (app, base):
        assert base.startswith("http://[::1]:")
        t = transport(f"{base}/ok", key_header="", key_param="api_key")
        try:
            outcome = await send(t, params={"q": "a b"})
        finally:
            await t.close()
    assert outcome.status == 200
    assert app.seen[0][2] == "/ok?api_key=key-000000000001&q=a%20b"
    assert app.seen[0][3]["Host"] == base.removeprefix("http://")


# ---------------------------------------------------------------- framing headers


@pytest.mark.parametrize("name", ["Host", "Content-Length", "Transfer-Encoding", "connection"])
def test_a_framing_header_is_refused_at_config_time(name, tmp_path):
    from ratedeck.config import load_config

    with pytest.raises(ConfigError) as caught:
        load_config(
            overrides={
                "target": {"url": "http://127.0.0.1:1/x", "headers": {name: "x"}},
                "keys": {"secrets": ["k"]},
            }
        )
    assert "target.headers" in str(caught.value) and name in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_framing_header_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--target", "http://127.0.0.1:1/x",
         "--keys", "k1", "--header", "Host: evil.example", "--duration", "1"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Host" in lines[0] and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- what the request carries


@run_async
async def test_url_credentials_go_as_http_basic_and_a_key_header_wins_over_them():
    async with app_server() as (app, base):
        url = base.replace("http://", "http://ops%20user:s3cret-pw@") + "/ok"
        plain = HttpTransport(
            TargetConfig(url=url, key_param="api_key", key_header="", http_client=CLIENT), url, 2
        )
        keyed = HttpTransport(
            TargetConfig(url=url, key_param="", key_header="authorization", http_client=CLIENT), url, 2
        )
        try:
            assert (await plain.send(KEY, Request(1, 0.0, 10.0), None)).status == 200
            assert (await keyed.send(KEY, Request(2, 0.0, 10.0), None)).status == 200
        finally:
            await plain.close()
            await keyed.close()
    basic = "Basic " + base64.b64encode(b"ops user:s3cret-pw").decode()
    assert app.seen[0][3]["Authorization"] == basic and "s3cret" not in app.seen[0][2]
    assert app.seen[1][3]["Authorization"] == "Bearer key-000000000001"
    assert [k.lower() for k in app.seen[1][3]].count("authorization") == 1


@run_async
async def test_accept_an_empty_post_s_length_form_bodies_and_the_config_s_headers():
    async with app_server() as (app, base):
        get = transport(f"{base}/ok", headers={"X-Team": "ops", "AUTHORIZATION": "overridden"})
        empty = transport(f"{base}/ok", method="POST")
        form = transport(f"{base}/ok", method="POST", key_header="", key_param="api_key", params={"a": "1 2"})
        try:
            assert (await send(get)).status == 200
            assert (await send(empty)).status == 200
            assert (await send(form, params={"b": "x&y"})).status == 200
        finally:
            for t in (get, empty, form):
                await t.close()
    headers = app.seen[0][3]
    assert headers["Accept"] == "*/*" and headers["X-Team"] == "ops"
    assert headers["Authorization"] == "Bearer key-000000000001"  # the key's header wins, any case
    assert headers["User-Agent"].startswith("ratedeck/")
    _, method, _, headers, body = app.seen[1]
    assert method == "POST" and body == b"" and headers["Content-Length"] == "0"
    _, method, _, headers, body = app.seen[2]
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert sorted(body.split(b"&")) == [b"a=1+2", b"api_key=key-000000000001", b"b=x%26y"]


@run_async
async def test_keep_alive_bodies_and_the_error_body_limit():
    async with app_server() as (app, base):
        outcomes = {}
        for what in ("chunked", "gzip", "deflate", "big200", "big500", "ok"):
            t = transport(f"{base}/{what}")
            try:
                outcomes[what] = await send(t)
            finally:
                await t.close()
        one = transport(f"{base}/ok")
        try:
            await send(one, 4)
        finally:
            await one.close()
    assert outcomes["chunked"].response.body == b"one,two,three"
    assert outcomes["gzip"].response.body == b"packed" * 100
    assert outcomes["deflate"].response.body == b"squeezed"
    assert len(outcomes["big200"].response.body) == 300_000
    assert outcomes["big500"].status == 500 and outcomes["big500"].response.body == b"e" * ERROR_BODY_BYTES
    assert len({peer for peer, *_ in app.seen[-4:]}) == 1  # four requests, one connection


@run_async
async def test_every_server_timing_line_is_read_and_a_quoted_dur_counts():
    async with app_server() as (_app, base):
        t = transport(f"{base}/timed")
        try:
            out = await send(t)
        finally:
            await t.close()
    assert out.status == 200 and out.server_time_s == pytest.approx(0.0532)


@run_async
async def test_never_more_connections_than_allowed():
    async with app_server() as (app, base):
        t = HttpTransport(TargetConfig(url=f"{base}/hold", http_client=CLIENT), f"{base}/hold", 3)
        try:
            tasks = [asyncio.ensure_future(t.send(KEY, Request(i, 0.0, 100.0), None)) for i in range(8)]
            while app.open_now < 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert app.open_now == 3
            app.release.set()
            outcomes = await asyncio.gather(*tasks)
        finally:
            await t.close()
    assert all(o.status == 200 for o in outcomes) and app.most_open == 3


@pytest.mark.parametrize(
    "answer, error",
    [
        (b"", "closed without an answer"),
        (b"NOT HTTP AT ALL\r\n\r\n", "malformed HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "incomplete body"),
    ],
    ids=["closed", "garbage", "short"],
)
@run_async
async def test_broken_answers_are_named_without_the_url(answer, error):
    async def closing(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    t = transport(f"{base}/x")
    try:
        outcome = await send(t)
    finally:
        await t.close()
        server.close()
    assert outcome.kind is CONNECTION and outcome.error == error


@run_async
async def test_a_refused_connection_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = transport(f"http://127.0.0.1:{port}/x")
    try:
        outcome = await send(t)
    finally:
        await t.close()
    assert outcome.kind is CONNECTION and outcome.error == "connection refused"


async def _probe_until(url: str, rate_hz: float, count: int, warm: int = 0):
    """A real `Probe` of `url` run until it has `count` samples: (the probe, its round trips)."""
    from ratedeck.engine.http.probe import Probe

    samples: list[float] = []
    enough = asyncio.Event()

    def observe(rtt_s: float, now: float) -> None:
        samples.append(rtt_s)
        if len(samples) == count:
            enough.set()

    probe = Probe(url, rate_hz, timeout_s=2.0, warm=warm)
    try:
        task = asyncio.ensure_future(probe.run(asyncio.get_running_loop().time, observe, print))
        await asyncio.wait_for(enough.wait(), 10.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await probe.close()
    return probe, samples


async def _probe_served(serve, rate_hz: float, count: int, warm: int = 0):
    """`_probe_until` against a raw loopback server whose connections `serve` answers."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        return await _probe_until(
            f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/health", rate_hz, count, warm
        )
    finally:
        server.close()


@run_async
async def test_the_probe_times_real_round_trips_and_stops_at_a_429():
    async def limited(request):
        return web.Response(status=429)

    async with app_server() as (app, base):
        probe, samples = await _probe_until(f"{base}/ok", 200.0, 3)
        t = transport(f"{base}/ok", probe_url=f"{base}/missing")  # the transport's own probe
        get = t.prober()
        assert get is not None
        try:
            assert await get() == 404
        finally:
            await t.close()
    assert len(samples) >= 3 and all(0 < s < 2.0 for s in samples)
    assert probe.answered >= 3 and probe.failed == 0
    assert all("Authorization" not in seen[3] for seen in app.seen)  # no key on a probe


@run_async
async def test_a_probe_that_opened_its_connection_is_not_a_sample():
    # The first GET, and any after the server closed the connection, carries the TCP and TLS
    # handshakes in its round trip. The server here stands that cost in by answering the first
    # request on each connection 150 ms late, and closes every connection after 3 answers.
    conns = [0]

    async def serve(reader, writer):
        conns[0] += 1
        try:
            for n in (1, 2, 3):
                await reader.readuntil(b"\r\n\r\n")
                if n == 1:
                    await asyncio.sleep(0.15)
                last = b"Connection: close\r\n" if n == 3 else b""
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + last + b"\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    probe, samples = await _probe_served(serve, 1000.0, 8)
    assert len(samples) >= 8 and max(samples) < 0.1, samples  # no first-on-a-connection answer
    assert probe.sent - probe.answered - probe.failed == conns[0] >= 4  # each connection's first
    assert probe.stopped is None


@run_async
async def test_a_warming_probe_runs_four_connections_and_leaves_out_each_ones_first_get():
    # The warm-up keeps PROBE_LANES GETs in flight, each on its own connection of the probe's
    # session; the GET that opened a connection (answered 150 ms late here, as a handshake
    # would cost) is left out on each, though the others were in flight beside it.
    from ratedeck.engine.http.client import PROBE_LANES

    conns, busy, most = [0], [0], [0]

    async def serve(reader, writer):
        conns[0] += 1
        first = True
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                busy[0] += 1
                most[0] = max(most[0], busy[0])
                await asyncio.sleep(0.15 if first else 0.005)
                first = False
                busy[0] -= 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    probe, samples = await _probe_served(serve, 1.0, 40, warm=40)
    assert most[0] == conns[0] == PROBE_LANES == 4  # four in flight, one connection each
    assert len(samples) >= 40 and max(samples) < 0.1, max(samples)  # no connection's first
    assert probe.opened == conns[0] and probe.failed == 0


@run_async
async def test_a_probe_whose_every_answer_closes_the_connection_stops_and_says_why():
    def answer(conn: int, req: int) -> tuple[bytes]:
        return (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",)

    from ratedeck.engine.http.probe import Probe

    problems: list[str] = []
    async with raw_server(answer) as (base, seen):
        probe = Probe(f"{base}/health", 1000.0, timeout_s=2.0)
        try:
            await asyncio.wait_for(
                probe.run(asyncio.get_running_loop().time, lambda r, n: None, problems.append), 10.0
            )
        finally:
            await probe.close()
    assert probe.answered == 0 and probe.sent == len(seen) == 20
    assert problems == [probe.stopped] and "closed its connection after each of 20" in problems[0]


@run_async
async def test_the_read_timeout_names_its_phase():
    async def stalls(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")  # then silence
        await writer.drain()
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(stalls, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    t = transport(f"{base}/x", read_timeout_s=0.2)
    try:
        outcome = await send(t)
    finally:
        await t.close()
        server.close()
    assert outcome.error == "read timed out" and outcome.latency_s < 2.0


def test_resent_requests_are_in_the_run_s_summary():
    from ratedeck.engine.snapshot import Snapshot
    from ratedeck.host.protocol import RunFacts
    from ratedeck.runner.headless import summary_lines

    assert not any(line.startswith("resent") for line in summary_lines(Snapshot(), RunFacts()))
    lines = summary_lines(Snapshot(), RunFacts(retried=2))
    assert "resent       2 on a new connection (a kept-alive one closed under them)" in lines


@run_async
async def test_a_host_name_is_looked_up_once_for_many_connections_and_each_address_tried(client):
    async with app_server() as (app, base):  # listens on 127.0.0.1 only: ::1, if localhost has it, refuses
        port = int(base.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        real_lookup, lookups = loop.getaddrinfo, []

        async def counted(host, *args, **kwargs):  # the real lookup, counted
            lookups.append(host)
            return await real_lookup(host, *args, **kwargs)

        loop.getaddrinfo = counted  # type: ignore[method-assign]
        url = f"http://localhost:{port}/hold"
        t = HttpTransport(TargetConfig(url=url, http_client=CLIENT), url, 5)
        try:
            tasks = [asyncio.ensure_future(t.send(KEY, Request(i, 0.0, 100.0), None)) for i in range(5)]
            while app.open_now < 5:
                await asyncio.sleep(0.01)
            app.release.set()
            outcomes = await asyncio.gather(*tasks)
        finally:
            await t.close()
    assert [o.status for o in outcomes] == [200] * 5
    if client == "aiohttp":  # on the loop (pyreqwest looks names up on its own threads)
        assert lookups == ["localhost"]  # five connections, one lookup
    assert all(seen[3]["Host"] == f"localhost:{port}" for seen in app.seen)


@run_async
async def test_ssl_cert_file_from_the_environment_is_trusted(pki, monkeypatch):
    """SSL_CERT_FILE points the system's store at another bundle, read when the session opens."""
    async with app_server(tls=_server_tls(pki, require_client=False)) as (app, base):
        monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
        t = transport(f"{base}/ok")  # no ca_file: the environment's bundle
        try:
            outcome = await send(t)
        finally:
            await t.close()
    assert outcome.status == 200
