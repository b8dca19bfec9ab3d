"""aiohttp's client, tuned: how the engine opens its one `ClientSession`.

The probe (`probe.py`) uses aiohttp, and so does the transport (`transport.py`) with
`target.http_client = "aiohttp"` (its default is pyreqwest, `reqwest_client.py`), because
real networks need what it already has: proxies, happy eyeballs, per-phase
timeouts, client certificates, 1xx answers, a parser that gets security fixes
(docs/dependencies.md). They set it up here the way its best users do:

- one `ClientSession` per engine process (a session per request costs a new
  pool, a new TLS handshake and a DNS lookup each time);
- a `TCPConnector` sized from the keys' in-flight total (`limit`), no limit per
  host (a run talks to one host), idle connections dropped after `IDLE_S`;
- `DummyCookieJar`: an API client keeps no cookies, and the jar's filtering
  costs CPU on every request;
- no `total` timeout: the transport's `AttemptDeadlines` times every attempt
  out with one timer for all of them; a per-request `ClientTimeout` would arm a
  timer per request. The per-phase timeouts (`target.connect_timeout_s`,
  `target.read_timeout_s`) map to `sock_connect` (armed only when a connection
  is opened, so free on a reused one) and `sock_read` (armed per read: off by
  default, the attempt's own deadline bounds it);
- the environment honoured as every HTTP tool does (`HTTP_PROXY`, `HTTPS_PROXY`,
  `NO_PROXY`, `SSL_CERT_FILE`), read ONCE when the session opens, with
  aiohttp's own `get_env_proxy_for_url`. The session itself runs with
  `trust_env=False`: with it on, aiohttp looks the proxy up and reads
  `~/.netrc` in a worker thread for every request (two thread hops each), and a
  netrc entry for the target's host would clash with the key's own
  `Authorization` header. `target.proxy` names a proxy explicitly (and wins);
- TLS from a context built when the session opens: the system's store (which
  honours `SSL_CERT_FILE`), or `target.ca_file` alone for a private CA, plus
  `target.client_cert`/`client_key` for mutual TLS;
- happy eyeballs as aiohttp does it (RFC 8305, `happy_eyeballs_delay`): a dead
  first address costs 250 ms, not the whole attempt; DNS answers are cached for
  `DNS_TTL_S` and rotated among a host's addresses;
- `auto_decompress` on, with a cap on the DECOMPRESSED size of a body
  (`read_capped`): a small gzip bomb cannot fill memory;
- header lines up to aiohttp's 8190 bytes (nginx's own default is 8 KiB):
  an answer with larger ones is refused as malformed.

aiohttp itself is imported only when a session opens (`open_client`) or a proxy is looked
up in the environment (`proxy_for`): a run on pyreqwest with no probe never loads it, and
starts about 0.1 s of CPU sooner (loading it builds TLS contexts, `docs/measurements.md`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import ssl
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from yarl import URL

from ratedeck.engine.settings import TargetConfig

if TYPE_CHECKING:
    import aiohttp

IDLE_S = 4.0  # reuse a connection idle at most this long (Node closes at 5 s, nginx at 75 s)
DNS_TTL_S = 10  # aiohttp's default: a changed DNS answer is seen within 10 s
HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended delay, aiohttp's default
MAX_FIELD_BYTES = 8190  # aiohttp's default header line limit


_TOO_LARGE = ("got more than", "too long", "too many headers", "too large")


class BodyTooLarge(Exception):
    """A body past the cap once decompressed; the rest is not read."""


@dataclass
class Client:
    """An open session and how its requests travel: the proxy (None: direct) chosen once."""

    session: aiohttp.ClientSession
    proxy: URL | None
    attempts: list[int]  # [sends], counted by the session's request class, aiohttp's own retries included

    async def close(self) -> None:
        await self.session.close()


def system_ca_file() -> str | None:
    """`SSL_CERT_FILE` when it names a file: the roots every HTTP tool adds to the system's."""
    path = os.environ.get("SSL_CERT_FILE")
    return path if path and os.path.isfile(path) else None


def ssl_context(target: TargetConfig) -> ssl.SSLContext:
    """The TLS context of a run: the system's store (honours SSL_CERT_FILE, read now), or
    `target.ca_file` alone; a client certificate with `target.client_cert`."""
    context = ssl.create_default_context(cafile=target.ca_file or None)
    if target.client_cert:
        context.load_cert_chain(target.client_cert, target.client_key or None)
    return context


def proxy_for(target: TargetConfig, url: URL) -> URL | None:
    """The proxy for `url`: `target.proxy`, else the environment's (HTTP(S)_PROXY minus NO_PROXY),
    looked up once with aiohttp's own helper; None: go direct."""
    if target.proxy:
        return URL(target.proxy)
    if url.scheme not in urllib.request.getproxies():  # what aiohttp's helper reads first
        return None
    from aiohttp.helpers import get_env_proxy_for_url

    try:
        proxy, auth = get_env_proxy_for_url(url)
    except LookupError:  # none set, or NO_PROXY names the host
        return None
    if auth is not None:  # credentials from the proxy URL or ~/.netrc, put back into the URL
        proxy = proxy.with_user(auth.login).with_password(auth.password)
    return proxy


def open_client(
    target: TargetConfig,
    url: URL,
    limit: int,
    attempts: list[int] | None = None,
    headers: dict[str, str] | None = None,
    trace_configs: list[aiohttp.TraceConfig] | None = None,
) -> Client:
    """One session for the requests of one engine process to `url`'s origin (see the module doc);
    `attempts[0]` counts its sends; `headers` go with every request unless it names them."""
    import aiohttp

    sends: list[int] = attempts if attempts is not None else [0]

    class CountedRequest(aiohttp.ClientRequest):
        # aiohttp resends an idempotent request once when a kept-alive connection turns out
        # closed (RFC 9112 9.3.1), with a new request object: counting those built counts
        # every send. Not a middleware: it would add two coroutines to every request's await
        # chain, each passed through whenever the request's task resumes.
        def update_version(self, version: Any) -> None:
            sends[0] += 1
            super().update_version(version)

    connector = aiohttp.TCPConnector(
        limit=max(1, limit),
        limit_per_host=0,
        ttl_dns_cache=DNS_TTL_S,
        happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S,
        keepalive_timeout=IDLE_S,
        ssl=ssl_context(target) if _needs_tls(target, url) else True,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=target.connect_timeout_s, sock_read=target.read_timeout_s
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=True,
        trust_env=False,  # the environment is read once, in proxy_for and ssl_context
        max_field_size=MAX_FIELD_BYTES,
        request_class=CountedRequest,
        headers=headers,
        trace_configs=trace_configs,
    )
    return Client(session, proxy_for(target, url), sends)


class _Done:
    """An awaitable that is already done (None)."""

    __slots__ = ()

    def __await__(self) -> Any:
        return iter(())


DONE = _Done()


class AioWire:
    """The run's aiohttp session as a `wire.Wire`: `open`'s `__aenter__` gives aiohttp's own answer."""

    __slots__ = ("client", "proxy", "sends", "request")

    def __init__(self, client: Client):
        self.client = client
        self.proxy = client.proxy
        self.sends = 0
        self.request = client.session.request

    def open(self, method: str, url: Any, data: Any, headers: Any, live: bool = False) -> Any:
        """The request, sent when its `__aenter__` is awaited, which gives aiohttp's answer."""
        self.sends += 1
        return self.request(method, url, data=data, headers=headers, allow_redirects=False, proxy=self.proxy)

    @staticmethod
    def read(resp: aiohttp.ClientResponse, cap: int, stop: bool = False) -> Awaitable[bytes]:
        return read_capped(resp, cap, stop)

    @staticmethod
    def end(opening: Any, resp: aiohttp.ClientResponse) -> Awaitable[None]:
        """Done with it: the connection back to the pool when the body was read to its end,
        else dropped."""
        if resp.content.at_eof():
            resp.release()
        else:
            resp.close()
        return DONE

    @staticmethod
    def length(resp: aiohttp.ClientResponse) -> int | None:
        return resp.content_length

    @staticmethod
    def pieces(resp: aiohttp.ClientResponse) -> Any:
        return resp.content.iter_any()

    @property
    def retried(self) -> int:
        """Sends aiohttp repeated on a new connection after a kept-alive one was found closed."""
        return self.client.attempts[0] - self.sends

    async def close(self) -> None:
        await self.client.close()


def _needs_tls(target: TargetConfig, url: URL) -> bool:
    return url.scheme == "https" or bool(target.ca_file or target.client_cert)


async def read_capped(resp: aiohttp.ClientResponse, cap: int, stop: bool = False) -> bytes:
    """The body, decompressed, up to `cap` bytes. Past it: `BodyTooLarge`, or with `stop` the
    first `cap` bytes (an error page's head says enough). The connection is dropped when
    the body is not read to its end, so no later answer is misread."""
    length = resp.content_length
    if length is not None and length <= cap and "Content-Encoding" not in resp.headers:
        return await resp.read()  # the framing bounds it: one read, the common case
    chunks: list[bytes] = []
    size = 0
    content = resp.content
    while True:
        chunk = await content.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:
            resp.close()
            if stop:
                chunks.append(chunk[: len(chunk) - (size - cap)])
                return b"".join(chunks)
            raise BodyTooLarge()
        chunks.append(chunk)


def describe(exc: BaseException) -> str:
    """A short cause for an attempt with no answer, from the exception's type only (a message
    may quote the URL, and the URL may carry the key)."""
    aiohttp = sys.modules.get("aiohttp")  # none of its errors exists before it is loaded
    said = _aiohttp_cause(aiohttp, exc) if aiohttp is not None else None
    if said is not None:
        return said
    if isinstance(exc, ConnectionResetError) or getattr(exc, "errno", None) == errno.ECONNRESET:
        return "connection reset"
    return type(exc).__name__


def _aiohttp_cause(aiohttp: Any, exc: BaseException) -> str | None:
    """`describe` for aiohttp's own errors; None for any other."""
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return f"cannot connect to the proxy ({type(exc.os_error).__name__})"
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return f"the proxy refused (HTTP {exc.status})"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"cannot connect ({type(exc.certificate_error).__name__})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        return f"cannot connect ({type(os_error).__name__})"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timed out"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return "read timed out"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "closed without an answer"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "incomplete body"
    if isinstance(exc, aiohttp.ClientResponseError):
        from aiohttp.http_exceptions import LineTooLong

        # The parser's LineTooLong reaches us rebuilt as a plain HttpProcessingError: its
        # message (matched, never shown) says which ("Got more than 8190 bytes when reading").
        said = str(getattr(exc.__cause__, "message", "") or exc.message).lower()
        if isinstance(exc.__cause__, LineTooLong) or any(m in said for m in _TOO_LARGE):
            return "headers too large"
        return "malformed HTTP answer"
    return None


ProbeFn = Callable[[], Awaitable[int]]


#: What a probe GET answers when it opened its connection (`probe_get`): not a sample.
OPENED = -1
#: Probe GETs that may be in flight at once, each on its own connection: the probe's warm-up
#: (engine/http/probe.py) takes its first samples over this many; one after that.
PROBE_LANES = 4


def probe_get(
    target: TargetConfig, url: str, timeout_s: float
) -> tuple[ProbeFn, Callable[[], Awaitable[None]]]:
    """A plain GET of `url` on a session of its own (up to `PROBE_LANES` connections, apart
    from the traffic's pool, set up as the traffic's: proxy, TLS), and its closer. The GET
    may be awaited by several tasks at once.

    A GET that had to open its connection (the first on each, and any after the server
    closed one) answers `OPENED` instead of its status: its round trip carries the TCP and
    TLS handshakes, one or two round trips more, and as a sample it would widen the probe's
    range for as long as the range keeps it (a minute)."""
    parsed = URL(url)
    holder: list[Client] = []

    async def on_open(_session: Any, ctx: Any, _params: Any) -> None:
        opened = ctx.trace_request_ctx  # this GET's own flag (several may be in flight)
        if opened is not None:
            opened[0] = True

    async def get() -> int:
        if not holder:
            import aiohttp

            trace = aiohttp.TraceConfig()
            trace.on_connection_create_end.append(on_open)
            holder.append(open_client(target, parsed, PROBE_LANES, trace_configs=[trace]))
        client = holder[0]
        opened = [False]
        resp = await asyncio.wait_for(
            client.session.get(parsed, proxy=client.proxy, trace_request_ctx=opened), timeout_s
        )
        try:
            await asyncio.wait_for(read_capped(resp, 4096, stop=True), timeout_s)
        finally:
            resp.release()
        return OPENED if opened[0] and 200 <= resp.status < 300 else resp.status

    async def close() -> None:
        while holder:
            await holder.pop().close()

    return get, close
