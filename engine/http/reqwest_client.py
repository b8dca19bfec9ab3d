"""pyreqwest's client (Rust's reqwest and hyper), set up for a run: the default HTTP client.

Why this one (docs/dependencies.md): on the same loopback server it spends about
two fifths of aiohttp's CPU per request (47-49 µs against 118-126 µs, each as a user
writes it; `docs/measurements.md`, "HTTP clients side by side"), and on two shared
cores the client's CPU decides how close to the limit a run gets. It has what
real networks need: proxies (HTTP, CONNECT for HTTPS), TLS with extra roots and
client certificates, connect and read timeouts, gzip, brotli, zstd and deflate,
a pool with idle timeout. aiohttp (`client.py`) stays, as `target.http_client =
"aiohttp"`, and for the probe.

Set up as for aiohttp: one client per engine process; no redirects followed by
the client (the transport follows same-origin ones itself); no cookies; the
proxy chosen once, from `target.proxy` or the environment (`client.proxy_for`),
never read again per request; the session's headers (`default_headers`) sent
with every request; a body read up to a cap on its DECOMPRESSED size.

Where it differs from aiohttp, on purpose or not:
- an idempotent request on a kept-alive connection that the server closed under
  it is not re-sent by the client: the attempt fails ("closed without an
  answer") and the engine retries it, on any key, as it does any such failure;
- a `1xx` other than `100 Continue` before the answer (`103 Early Hints`) breaks
  the exchange (hyper reads no informational answers on HTTP/1.1);
- header lines are not limited to 8,190 bytes (hyper bounds the whole head).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any

from pyreqwest.client import Client as RqClient
from pyreqwest.client import ClientBuilder
from pyreqwest.exceptions import (
    BodyDecodeError,
    ConnectError,
    ConnectTimeoutError,
    DecodeError,
    PyreqwestError,
    ReadError,
    ReadTimeoutError,
    RequestTimeoutError,
    WriteError,
)
from pyreqwest.http import HeaderMap
from pyreqwest.http import Url as RqUrl
from pyreqwest.proxy import ProxyBuilder
from yarl import URL

from ratedeck.engine.settings import TargetConfig

from .client import IDLE_S, BodyTooLarge, proxy_for, system_ca_file

#: How long a closed client's thread is left to let its requests and connections go.
SETTLE_S = 0.1

#: Methods whose request has a body (RFC 9110): sent with a length even when it is empty, or
#: some servers answer 411 Length Required.
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


async def _read_capped(resp: Any, cap: int, stop: bool) -> bytes:
    """The body read a piece at a time up to `cap` (`ReqwestWire.read`); the caller's `end`
    drops the connection when it was not read to its end."""
    reader = resp.body_reader
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await reader.read_chunk()
        if chunk is None:
            return b"".join(chunks)
        piece = bytes(chunk)
        size += len(piece)
        if size > cap:
            if stop:
                chunks.append(piece[: len(piece) - (size - cap)])
                return b"".join(chunks)
            raise BodyTooLarge()
        chunks.append(piece)


def within(length: str | None, cap: int) -> bool:
    """Whether an answer's Content-Length (as sent) bounds its body to `cap` bytes: then the
    body is read whole at once. A decoded body has none (pyreqwest drops it): read up to the cap."""
    return length is not None and length.isdigit() and int(length) <= cap


def native_headers(headers: Any) -> HeaderMap:
    """Headers as pyreqwest holds them: built once (per key), they cost a request 2 µs, where
    a dict, converted on every request, costs 14."""
    return HeaderMap(headers)


class ReqwestWire:
    """The run's pyreqwest client as a `wire.Wire`: `open` builds one request, whose
    `__aenter__` puts it on the wire and gives pyreqwest's own answer once the status line and
    headers are in; the transport reads that answer through `read` and gives it back with `end`.

    `read` and `end` hand back pyreqwest's own awaitables where they can, not coroutines of
    ours, and no object wraps the answer: every Python step of a request costs the process about
    three times its own time, as pyreqwest's thread and the loop's take turns with the GIL
    (docs/measurements.md)."""

    __slots__ = ("client", "proxy")

    #: Sends the client repeated by itself: none (a failed attempt is the engine's to retry).
    retried = 0

    def __init__(self, client: RqClient, proxy: URL | None):
        self.client = client
        self.proxy = proxy

    def open(self, method: str, url: Any, data: Any, headers: Any, live: bool = False) -> Any:
        """With `live` (a client waits for the answer as it arrives), the head comes back as soon
        as it is in; else once the first 64 KiB of the body are in too (one hop for most answers)."""
        builder = self.client.request(method, url if type(url) is RqUrl else str(url))
        if live:
            builder = builder.streamed_read_buffer_limit(0)
        if headers:
            builder = builder.headers(headers)
        if isinstance(data, str):
            builder = builder.body_text(data)
        elif isinstance(data, bytes):
            builder = builder.body_bytes(data)
        elif isinstance(data, dict) and data:  # form fields, encoded as aiohttp encodes them
            builder = builder.form(data)
        elif method in _WITH_BODY:  # an empty body says so, or some servers answer 411
            builder = builder.header("Content-Length", "0")
        return builder.build_streamed()

    @staticmethod
    def read(resp: Any, cap: int, stop: bool = False) -> Awaitable[Any]:
        """The body (bytes-like), decompressed, up to `cap` bytes: pyreqwest's own read when the
        Content-Length bounds it (most answers), else a piece at a time up to the cap (past it:
        `BodyTooLarge`, or with `stop` the first `cap` bytes)."""
        if within(resp.get_header("content-length"), cap):
            return resp.bytes()
        return _read_capped(resp, cap, stop)

    @staticmethod
    def end(opening: Any, resp: Any) -> Awaitable[None]:
        """pyreqwest's own end of the request: a body read to its end leaves the connection for
        the next request, one not read drops it."""
        return opening.__aexit__(None, None, None)

    @staticmethod
    def length(resp: Any) -> int | None:
        value = resp.get_header("content-length")
        return int(value) if value is not None and value.isdigit() else None

    @staticmethod
    async def pieces(resp: Any) -> AsyncIterator[bytes]:
        reader = resp.body_reader
        while (chunk := await reader.read_chunk()) is not None:
            yield bytes(chunk)

    async def close(self) -> None:
        """Close the client, then leave its thread time to wind down: pyreqwest's `close` does
        not wait for its requests and connections to be let go, and its thread takes the GIL
        while it does; were the interpreter finalizing by then, the process would abort
        ("PyGILState_Release ... finalizing"). Measured on this box: the README's library
        example aborted in 2 of 30 runs with no wait, in 0 of 30 with 0.3 s and of 60 with
        `SETTLE_S` (tests/engine/test_reqwest_exit.py)."""
        await self.client.close()
        await asyncio.sleep(SETTLE_S)


def open_reqwest(target: TargetConfig, url: URL, limit: int, headers: dict[str, str]) -> ReqwestWire:
    """The run's client to `url`'s origin, at most `limit` requests at once."""
    builder = (
        ClientBuilder()
        .max_connections(max(1, limit))
        .follow_redirects(False)
        .referer(False)
        .pool_idle_timeout(timedelta(seconds=IDLE_S))
        .default_headers(headers)
        .no_proxy()  # the environment is read once, by proxy_for
    )
    if target.connect_timeout_s:
        builder = builder.connect_timeout(timedelta(seconds=target.connect_timeout_s))
    if target.read_timeout_s:
        builder = builder.read_timeout(timedelta(seconds=target.read_timeout_s))
    roots = target.ca_file or system_ca_file()
    if roots:
        with open(roots, "rb") as f:
            builder = builder.add_root_certificate_pem(f.read())
    if target.client_cert:
        with open(target.client_cert, "rb") as f:
            identity = f.read()
        if target.client_key:
            with open(target.client_key, "rb") as f:
                identity += b"\n" + f.read()
        builder = builder.identity_pem(identity)
    proxy = proxy_for(target, url)
    if proxy is not None:
        builder = builder.proxy(ProxyBuilder.all(str(proxy)))
    return ReqwestWire(builder.build(), proxy)


def _causes(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    if not causes:
        return ""
    return " | ".join(str(c.get("message", "")) for c in causes if isinstance(c, dict)).lower()


def describe_reqwest(exc: BaseException, proxied: bool) -> str | None:
    """A short cause for an attempt with no answer, from the error's kind and hyper's own cause
    names (matched, never shown: they quote the URL, and the URL may carry the key); None for
    an error that is not pyreqwest's."""
    if not isinstance(exc, PyreqwestError):
        return None
    causes = _causes(exc)
    connecting = "(connect)" in causes
    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError, RequestTimeoutError)):
        return "connect timed out" if connecting else "read timed out"
    if "certificate" in causes or "tls" in causes and connecting:
        return "cannot connect (certificate)"
    if connecting:
        if proxied:
            return "cannot connect to the proxy" if "tunnel" not in causes else "the proxy refused"
        if "connection refused" in causes:
            return "connection refused"
        return "cannot connect"
    if "reset" in causes:
        return "connection reset"
    if isinstance(exc, (BodyDecodeError, ReadError)):
        return "incomplete body"
    if isinstance(exc, DecodeError):
        return "headers too large" if "too large" in causes else "malformed HTTP answer"
    if isinstance(exc, (ConnectError, WriteError)) or "closed" in causes:
        return "closed without an answer"
    return type(exc).__name__
