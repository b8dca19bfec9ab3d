"""A lean HTTP/1.1 client: keep-alive connections, one request at a time on each.

Why not aiohttp's client here (issue 15): at thousands of requests a second
the client's own request path decides how many requests one core can send.
A bare loop of requests on 100 connections against the simulator cost 213 µs
of CPU per request with aiohttp's client and 67 µs with this one; the whole
engine on this client now costs less than a bare aiohttp loop
(`ratedeck bench --micro full`: `engine_cpu_us_per_req` against
`bare_aiohttp_cpu_us_per_req`). It does only what the traffic needs:

- HTTP/1.1 over TCP or TLS (the system's CA store, hostnames checked),
  keep-alive connections per origin, up to `max_connections` open in all;
- a request is written in one `write` with `Content-Length`; an answer is
  parsed by httptools (llhttp, the parser Node.js uses): chunked and
  read-until-close bodies, `Connection: close`, HTTP/1.0;
- a body can be read up to a limit (the connection is then closed);
  gzip or deflate bodies are decoded though we never ask for them.

No proxies, cookies, redirects or retries: the transport decides about
redirects, and a request is sent once. A connection idle for `idle_s` (below
common server keep-alive timeouts), or for less than the `Keep-Alive: timeout=N`
its server announced, is closed rather than reused, so a server that dropped
it does not cost an attempt. Cancelling a request closes its
connection: the answer may still come, and must not be read as another's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Iterable
from urllib.parse import urlencode

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

DNS_TTL_S = 300.0  # a host's addresses are looked up again after this long
IDLE_S = 4.0  # reuse a connection idle at most this long (nginx closes at 75 s, Node at 5 s)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttpError(Exception):
    """An attempt with no (whole) answer; `what` says why in a few words, never with a URL."""

    what = "no answer"


class ConnectFailed(HttpError):
    def __init__(self, os_error: BaseException):
        super().__init__()
        self.os_error = os_error
        if isinstance(os_error, ConnectionRefusedError):
            self.what = "connection refused"
        else:
            self.what = f"cannot connect ({type(os_error).__name__})"


class Disconnected(HttpError):
    what = "closed without an answer"


class Reset(HttpError):
    what = "connection reset"


class IncompleteBody(HttpError):
    what = "incomplete body"


class BadAnswer(HttpError):
    what = "malformed HTTP answer"


class Answer:
    """Status, headers (case-insensitive, read-only) and the body, decoded if it was compressed."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: CIMultiDictProxy[str], body: bytes):
        self.status, self.headers, self.body = status, headers, body


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `start` arms it for the next answer."""

    def __init__(self, origin: tuple[str, str, int]):
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.idle_limit: float | None = None  # from the server's Keep-Alive header, if it sent one
        self._waiter: asyncio.Future[Answer] | None = None
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._limit: int | None = None
        self._head = False
        self._status = 0
        self._got_headers = False
        self.reusable = False

    # --- driving it

    def start(self, waiter: asyncio.Future[Answer], limit: int | None, head: bool) -> None:
        self._waiter, self._limit, self._head = waiter, limit, head
        self._headers, self._body, self._size = [], [], 0
        self._got_headers = False
        self.reusable = False

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a server talking out of turn
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadAnswer())
        except httptools.HttpParserError:
            self._fail(BadAnswer())

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._got_headers and not self.parser.should_keep_alive() and self._reads_to_close():
            self._finish()  # a body that ends when the connection does
        elif self._got_headers:
            self._fail(IncompleteBody())
        elif isinstance(exc, ConnectionResetError):
            self._fail(Reset())
        else:
            self._fail(Disconnected())

    # --- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self._status = self.parser.get_status_code()
        self._got_headers = True
        if 100 <= self._status < 200:  # we never send Expect; an interim answer is not ours
            self._fail(BadAnswer())
        elif self._head:  # no body follows, which the parser cannot know: not reused
            self._finish(reuse=False)

    def on_body(self, body: bytes) -> None:
        if self._waiter is None:  # finished at the limit: the rest of this read is not kept
            return
        limit = self._limit
        if limit is not None and self._status >= 300 and self._size + len(body) >= limit:
            self._body.append(body[: limit - self._size])
            self._size = limit
            self._finish(reuse=False)  # the rest is not read: this connection is done
            return
        self._body.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        self._finish(reuse=self.parser.should_keep_alive())

    # --- ending an answer

    def _reads_to_close(self) -> bool:
        names = {name.lower() for name, _ in self._headers}
        return "content-length" not in names and "transfer-encoding" not in names

    def _finish(self, reuse: bool = False) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        self._waiter = None
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        encoding = headers.get("Content-Encoding")
        if encoding is not None and body:
            try:
                body = _decode(encoding, body)
            except zlib.error:
                waiter.set_exception(BadAnswer())
                self.close()
                return
        self.reusable = reuse and not self.closed
        if self.reusable and (keep_alive := headers.get("Keep-Alive")) is not None:
            self.idle_limit = _keep_alive_timeout(keep_alive)
        if not self.reusable:
            self.close()
        waiter.set_result(Answer(self._status, headers, body))

    def _fail(self, error: HttpError) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


def _keep_alive_timeout(value: str) -> float | None:
    """How long the server keeps an idle connection, from `Keep-Alive: timeout=5, max=100`,
    less a second for the trip; None when it does not say."""
    for part in value.split(","):
        name, _, number = part.strip().partition("=")
        if name.strip().lower() == "timeout":
            try:
                return max(0.0, float(number) - 1.0)
            except ValueError:
                return None
    return None


def _decode(encoding: str, body: bytes) -> bytes:
    coding = encoding.strip().lower()
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body)
    if coding == "deflate":
        try:
            return zlib.decompressobj().decompress(body)
        except zlib.error:  # raw deflate, as some servers send it
            return zlib.decompressobj(-zlib.MAX_WBITS).decompress(body)
    return body  # identity, or a coding we do not know: left as it came


class HttpClient:
    """Keep-alive HTTP/1.1 connections for one run; see the module's docstring."""

    def __init__(self, max_connections: int, idle_s: float = IDLE_S):
        self.max_connections = max(1, max_connections)
        self.idle_s = idle_s
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._open = 0  # connections open or being opened
        self._room: deque[asyncio.Future[None]] = deque()  # requests waiting for a connection
        self._ssl: ssl.SSLContext | None = None
        self._dns: dict[tuple[str, int], tuple[float, list[str]]] = {}  # (host, port) -> (until, addresses)
        self._dns_pending: dict[tuple[str, int], asyncio.Task[list[str]]] = {}
        self._closed = False
        self.connections_made = 0

    async def request(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]] | dict[str, str],
        body: bytes | str | dict | None = None,
        error_limit: int | None = None,
    ) -> Answer:
        """Send one request and read its answer; the body of a status of 300 or more only up
        to `error_limit` bytes, if given (an error page may be huge; its head says enough).

        Raises an `HttpError` when there is no whole answer; cancelling closes the connection.
        """
        if self._closed:
            raise Disconnected()
        scheme, host, port = url.scheme, url.raw_host or "", url.port or _DEFAULT_PORTS.get(url.scheme, 80)
        origin = (scheme, host, port)
        data = _encode(method, url, host, port, headers, body)
        loop = asyncio.get_running_loop()
        conn = self._take_idle(origin, loop.time())
        if conn is None:
            conn = await self._connect(origin, loop)
        waiter: asyncio.Future[Answer] = loop.create_future()
        conn.start(waiter, error_limit, method == "HEAD")
        assert conn.transport is not None
        conn.transport.write(data)
        try:
            answer = await waiter
        except BaseException:
            conn.close()
            self._give_back(conn, loop)
            raise
        self._give_back(conn, loop)
        return answer

    def _take_idle(self, origin: tuple[str, str, int], now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be alive
            limit = self.idle_s if conn.idle_limit is None else min(self.idle_s, conn.idle_limit)
            if not conn.closed and now - conn.idle_since < limit:
                return conn
            conn.close()
            self._dropped()
        return None

    async def _connect(self, origin: tuple[str, str, int], loop: asyncio.AbstractEventLoop) -> _Connection:
        while self._open >= self.max_connections:
            if not self._close_an_idle():
                room: asyncio.Future[None] = loop.create_future()
                self._room.append(room)
                try:
                    await room
                except BaseException:
                    if room.done() and not room.cancelled():
                        self._wake_one()  # handed a place we will not use: pass it on
                    raise
                idle = self._take_idle(origin, loop.time())
                if idle is not None:
                    return idle
        self._open += 1
        scheme, host, port = origin
        tls = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            conn = await self._open_to(origin, tls, loop)
        except BaseException as exc:
            self._dropped()
            if isinstance(exc, OSError | ssl.SSLError):
                raise ConnectFailed(exc) from None
            raise
        self.connections_made += 1
        return conn

    async def _open_to(
        self, origin: tuple[str, str, int], tls: ssl.SSLContext | None, loop: asyncio.AbstractEventLoop
    ) -> _Connection:
        """A new connection to the first of the origin's addresses that accepts one."""
        _, host, port = origin
        error: OSError | None = None
        for address in await self._addresses(host, port, loop):
            try:
                _, conn = await loop.create_connection(
                    lambda: _Connection(origin), address, port, ssl=tls, server_hostname=host if tls else None
                )
                return conn
            except OSError as exc:
                error = exc
        raise error or OSError(f"no address for {host}")

    async def _addresses(self, host: str, port: int, loop: asyncio.AbstractEventLoop) -> list[str]:
        """The host's addresses, looked up once per `DNS_TTL_S` (a run opens hundreds of
        connections at its start: one lookup serves them all)."""
        try:
            ipaddress.ip_address(host)
            return [host]
        except ValueError:
            pass
        cached = self._dns.get((host, port))
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        pending = self._dns_pending.get((host, port))
        if pending is None:
            pending = self._dns_pending[(host, port)] = loop.create_task(self._look_up(host, port, loop))
        return await asyncio.shield(pending)

    async def _look_up(self, host: str, port: int, loop: asyncio.AbstractEventLoop) -> list[str]:
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            self._dns[(host, port)] = (loop.time() + DNS_TTL_S, addresses)
            return addresses
        finally:
            del self._dns_pending[(host, port)]

    def _give_back(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        if conn.reusable and not conn.closed and not self._closed:
            conn.reusable = False
            conn.idle_since = loop.time()
            self._idle.setdefault(conn.origin, deque()).append(conn)
            self._wake_one()
        else:
            conn.close()
            self._dropped()

    def _dropped(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._room:
            room = self._room.popleft()
            if not room.done():
                room.set_result(None)
                return

    def _close_an_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                idle.popleft().close()
                self._open -= 1
                return True
        return False

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
                self._open -= 1
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close


def _encode(
    method: str,
    url: URL,
    host: str,
    port: int,
    headers: Iterable[tuple[str, str]] | dict[str, str],
    body: bytes | str | dict | None,
) -> bytes:
    """The whole request as bytes: request line, Host, the caller's headers, Content-Length, body."""
    payload: bytes | None
    content_type = None
    if body is None:
        payload = b"" if method in ("POST", "PUT", "PATCH") else None
    elif isinstance(body, dict):
        payload = urlencode(body).encode()
        content_type = "application/x-www-form-urlencoded"
    elif isinstance(body, str):
        payload = body.encode()
    else:
        payload = body
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    host_header = host if port == _DEFAULT_PORTS.get(url.scheme) else f"{host}:{port}"
    target = url.raw_path_qs or "/"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    items = headers.items() if isinstance(headers, dict | CIMultiDict | CIMultiDictProxy) else headers
    for name, value in items:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"a header may not hold a line break: {name}")
        lines.append(f"{name}: {value}")
        if content_type and name.lower() == "content-type":
            content_type = None  # the caller's own
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    if payload is not None:
        lines.append(f"Content-Length: {len(payload)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return head + payload if payload else head
