"""The gateway's aiohttp application: one handler that turns a client's call into an engine request.

What a client meets, in order: a stopping gateway (503), the token (401), the path
(400), its own controls (`ratedeck-max-wait`, `ratedeck-fail-fast`: 400 if unreadable),
the body (413 too big, 408 too slow, 400 malformed JSON). None of those takes a queue
slot or a key. Then the request is queued (503 at once when the queue is full), waits
for the limits up to its max wait (503 + Retry-After past it; 429 at once for a
fail-fast client), and is answered with what the upstream answered.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ratedeck.config.settings import GatewaySettings
from ratedeck.core.numbers import parse_duration
from ratedeck.core.vocab import Ending, OutcomeKind
from ratedeck.engine.http.answer_headers import answer_headers
from ratedeck.engine.request import UNSERVED, Request, Shape
from ratedeck.engine.sources.live import LiveSource

from .auth import GatewayToken
from .batches.api import BatchApi
from .headers import forwarded_headers
from .paths import PathRefused, upstream_path
from .server_log import BadRequests, why_of
from .stream import ClientStream, with_usage

MIB = 1024 * 1024
#: How long a fail-fast request may take to be admitted: one turn of the key workers, not a wait.
FAIL_FAST_S = 0.05
#: The client of a request no token named (a 401): counted under none of the clients.
NO_CLIENT = -1
#: Status logged for a client that left before its answer (nginx's convention; never sent).
CLIENT_GONE = 499
_JSON_TYPES = ("application/json", "+json")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    *,
    retry_after: float | None = None,
    **extra: Any,
) -> web.Response:
    """An OpenAI-style error body (`{"error": {"message", "type", "code"}}`), which SDKs read."""
    body = {"error": {"message": message, "type": type_, "code": code, **extra}}
    headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else None
    return web.json_response(body, status=status, headers=headers)


RespT = TypeVar("RespT", bound=web.StreamResponse)


class Refusal(NamedTuple):
    """A client's request refused for its own fault: the answer's status, message, type and
    code, and `why` for the gateway's log (one short line, none of the client's text)."""

    status: int
    message: str
    type_: str
    code: str
    why: str


class GatewayApp:
    """The handler and the state it shares: the live source, the settings, the token."""

    def __init__(
        self,
        source: LiveSource,
        settings: GatewaySettings,
        token: GatewayToken,
        base_path: str,
        redact: Callable[[str], str],
        *,
        usage_streams: bool = False,
        bad: BadRequests | None = None,
        clients: tuple[str, ...] = (),
        batches: BatchApi | None = None,
    ):
        """`usage_streams`: the target's streamed answers carry usage only when asked
        (`target.stream_usage`, OpenAI's: `stream.with_usage`); `bad` hears of every request refused for the client's fault."""
        self.source = source
        self.bad = bad
        self.usage_streams = usage_streams
        self.settings = settings
        self.token = token
        self.base_path = base_path
        self.redact = redact
        self.draining = False
        self.max_body = int(settings.max_body_mb * MIB)
        # The clients' names by flow, with [[gateway.clients]] (the token says which): () for one.
        self.clients = clients
        self.batches = batches  # the Batch APIs (batches/api.py): files and batches kept here

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body + 1)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # ------------------------------------------------------------ the handler
    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.draining or not self.source.open:
            return self._answered(
                error_response(
                    503,
                    "the gateway is stopping: try again shortly",
                    "unavailable",
                    "stopping",
                    retry_after=5,
                )
            )
        client = self.token.client(request.headers)
        if client is None:
            return self._refused(
                request,
                Refusal(
                    401,
                    "no valid gateway token: send it as 'Authorization: Bearer TOKEN' or 'x-api-key: TOKEN'",
                    "invalid_request_error",
                    "invalid_api_key",
                    "no valid gateway token",
                ),
                NO_CLIENT,
            )
        if self.batches is not None and (found := self.batches.route(request.method, request.rel_url.path)):
            handler, parts = found
            name = self.clients[client] if 0 <= client < len(self.clients) else ""
            return self._answered(await handler(request, name, **parts), client)
        try:
            path = upstream_path(request.rel_url.raw_path, request.rel_url.raw_query_string, self.base_path)
        except PathRefused as exc:
            why = f"path refused: {exc}"
            return self._refused(request, Refusal(400, why, "invalid_request_error", "bad_path", why), client)
        try:
            max_wait, fail_fast = self._controls(request)
        except ValueError as exc:
            why = f"unreadable {str(exc).partition(':')[0]}"  # the header's name, not the client's text
            return self._refused(
                request, Refusal(400, str(exc), "invalid_request_error", "bad_header", why), client
            )
        got = await self._read_body(request)
        if isinstance(got, Refusal):
            return self._refused(request, got, client)
        raw, body = got
        drop_usage = False
        if self.usage_streams and (asked := with_usage(body)) is not None:
            body, raw, drop_usage = asked, Shape.encode(asked), True  # so the token budget settles
        shape = Shape(
            method=request.method,
            path=path,
            body=body,
            payload=raw or None,
            headers=forwarded_headers(request.headers.items(), self.token.headers),
        )
        sink = ClientStream(request, self.redact, drop_usage=drop_usage)
        return await self._send(request, shape, max_wait, fail_fast, sink, client)

    def _controls(self, request: web.Request) -> tuple[float, bool]:
        """(max wait, fail fast) for this request: the settings, lowered by the client's headers."""
        max_wait = self.settings.max_wait_s
        given = request.headers.get("ratedeck-max-wait")
        if given is not None:
            try:
                max_wait = min(max_wait, parse_duration(given.strip(), low=0.0, low_open=False))
            except ValueError as exc:
                raise ValueError(f"header ratedeck-max-wait: {exc}") from None
        fail_fast = self.settings.fail_fast
        flag = request.headers.get("ratedeck-fail-fast")
        if flag is not None:
            if flag.strip().lower() in _TRUE:
                fail_fast = True
            elif flag.strip().lower() in _FALSE:
                fail_fast = False
            else:
                raise ValueError(f"header ratedeck-fail-fast: must be 1 or 0, got {flag[:20]!r}")
        return max_wait, fail_fast

    async def _read_body(self, request: web.Request) -> tuple[bytes, Any] | Refusal:
        """The body, whole, within the size and time limits; its JSON when it says it is JSON."""
        length = request.content_length
        too_big = Refusal(
            413,
            f"the request body is over the gateway's limit of {self.settings.max_body_mb:g} MiB",
            "invalid_request_error",
            "body_too_large",
            f"body over {self.settings.max_body_mb:g} MiB",
        )
        if length is not None and length > self.max_body:
            return too_big
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > self.max_body:
                        return too_big
                    chunks.append(chunk)
        except TimeoutError:
            return Refusal(
                408,
                f"the request body did not arrive within {self.settings.body_timeout_s:g} s",
                "invalid_request_error",
                "body_timeout",
                f"body not received within {self.settings.body_timeout_s:g} s",
            )
        except (web.RequestPayloadError, HttpProcessingError) as exc:  # a broken chunk, a bad gzip
            why = f"unreadable body: {why_of(exc)}"
            return Refusal(
                400,
                f"the request body cannot be read ({why_of(exc)})",
                "invalid_request_error",
                "bad_body",
                why,
            )
        raw = b"".join(chunks)
        body: Any = None
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if raw and ctype.endswith(_JSON_TYPES):
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):
                return Refusal(
                    400,
                    "the request body is not valid JSON",
                    "invalid_request_error",
                    "bad_json",
                    "body not JSON",
                )
        return raw, body

    async def _send(
        self,
        request: web.Request,
        shape: Shape,
        max_wait: float,
        fail_fast: bool,
        sink: ClientStream,
        client: int = 0,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[Ending] = loop.create_future()

        def done(_req: Request, ending: Ending) -> None:
            if not ended.done():
                ended.set_result(ending)

        # A wait of 0 still gives the key workers their one turn: a request they can take now goes.
        wait_s = FAIL_FAST_S if fail_fast else max(FAIL_FAST_S, max_wait)
        source = self.source
        req = source.make(
            shape,
            ttl_s=wait_s,
            on_done=done,
            idempotency_key=request.headers.get("Idempotency-Key"),
            flow=client,
        )
        req.answer = sink  # a streamed answer goes to the client as it arrives
        if self.clients:
            refused = self._over_quota(request, req)
            if refused is not None:
                req.cancelled = True
                return refused
        if not source.offer(req):
            req.cancelled = True
            return self._answered(self._no_room(fail_fast, "the gateway's queue is full"), client)
        try:
            await asyncio.wait((ended,), timeout=wait_s)
            if not ended.done() and req.first_sent_at is None:
                source.withdraw(req)  # waited long enough: out of the queue, never sent
                if not ended.done():  # withdrawn while the engine held it: it ends on its own
                    await ended
                return self._answered(self._no_room(fail_fast, f"no capacity within {wait_s:g} s"), client)
            ending = await ended  # sent: the upstream's answer is coming
        except asyncio.CancelledError:
            source.withdraw(req)  # the client left: nothing more is sent for it
            source.answered(CLIENT_GONE, client)
            raise
        if sink.started:  # streamed: the status, headers and body went as they arrived
            streamed = await sink.end()
            assert streamed is not None
            source.answered(streamed.status if not sink.gone else CLIENT_GONE, client)
            return streamed
        return self._answered(self._answer(req, ending, fail_fast), client)

    def _over_quota(self, request: web.Request, req: Request) -> web.Response | None:
        """The answer to a request its client's quota refuses (429 + Retry-After when it frees),
        or to one a USD quota cannot count (its model has no price); None: it may queue."""
        flows = self.source.flows
        if flows is None or not flows.arrival_checks:
            return None
        name = self.clients[req.flow] if req.flow < len(self.clients) else "?"
        if flows.unpriced(req):
            why = f"client {name!r} has a usd_per_day quota and this model has no price"
            return self._refused(
                request, Refusal(400, why, "invalid_request_error", "model_not_priced", why), req.flow
            )
        refusal = self.source.quota_refusal(req)
        if refusal is None:
            return None
        after = max(1, math.ceil(refusal.retry_after_s))
        return self._answered(
            error_response(
                429,
                f"client {name!r} is over its {refusal.quota} quota of {refusal.limit:g};"
                f" it frees in {after} s",
                "rate_limit_exceeded",
                "quota_exceeded",
                retry_after=after,
            ),
            req.flow,
        )

    def _no_room(self, fail_fast: bool, why: str) -> web.Response:
        after = self.source.retry_after_s()
        if fail_fast:
            return error_response(
                429, f"{why} (fail-fast)", "rate_limit_exceeded", "queue_full", retry_after=after
            )
        return error_response(503, why, "unavailable", "no_capacity", retry_after=after)

    def _refused(self, request: web.Request, refusal: Refusal, client: int = 0) -> web.Response:
        """The answer to a client's own fault, noted for the gateway's log (one line, or a summary)."""
        if self.bad is not None:
            self.bad.note(request.remote, refusal.status, refusal.why)
        status, message, type_, code, _why = refusal
        return self._answered(error_response(status, message, type_, code), client)

    def _answered(self, resp: RespT, client: int = 0) -> RespT:
        self.source.answered(resp.status, client)
        return resp

    # ------------------------------------------------------------ what the upstream said
    def _answer(self, req: Request, ending: Ending, fail_fast: bool) -> web.Response:
        outcome = req.result
        if ending is Ending.EXPIRED:
            return self._no_room(fail_fast, "no capacity within the request's max wait")
        if ending is Ending.SHED:
            return error_response(503, "the gateway is stopping", "unavailable", "stopping", retry_after=5)
        if ending is Ending.UNCERTAIN:
            rid = req.request_id or (outcome.request_id if outcome is not None else None)
            return error_response(
                502,
                "uncertain: the write may or may not have happened upstream; it was not sent again"
                + (f" (upstream request id {rid})" if rid else ""),
                "uncertain",
                "uncertain",
                request_id=rid,
            )
        if outcome is None:
            if req.last_error and req.last_error.startswith(UNSERVED):  # OpenAI's answer to an unknown model
                return error_response(404, req.last_error, "invalid_request_error", "model_not_found")
            return error_response(502, "no answer from the upstream", "upstream_error", "no_answer")
        kind = outcome.kind
        response = outcome.response
        if ending is Ending.SUCCEEDED or kind in (OutcomeKind.CLIENT_ERROR, OutcomeKind.SERVER_ERROR):
            if response is not None and hasattr(response, "status") and hasattr(response, "body"):
                return self._passed(response, outcome)
        if kind is OutcomeKind.RATE_LIMITED:
            retry = outcome.retry_after_s
            after = max(self.source.retry_after_s(), math.ceil(retry) if retry else 0)
            return error_response(
                503,
                "still rate-limited upstream after every attempt",
                "unavailable",
                "rate_limited",
                retry_after=after,
            )
        if kind is OutcomeKind.BLOCKED:
            return error_response(
                502,
                "the upstream refused the gateway's keys for this request",
                "upstream_error",
                "keys_refused",
            )
        if kind is OutcomeKind.TIMEOUT:
            return error_response(504, "the upstream did not answer in time", "upstream_error", "timeout")
        return error_response(
            502, f"no answer from the upstream ({outcome.error or kind})", "upstream_error", "no_answer"
        )

    def _passed(self, response: Any, outcome: Any) -> web.Response:
        """The upstream's own answer: its status, body and the headers a client relies on."""
        raw = outcome.body if outcome.body is not None else response.body
        body: bytes = raw if isinstance(raw, bytes) else bytes(raw or b"")
        status = int(response.status)
        if status >= 300 and body:
            text = body.decode("utf-8", "replace")
            masked = self.redact(text)
            if masked != text:  # an error that quotes a key: never shown whole
                body = masked.encode()
        resp = web.Response(status=status, body=body)
        pairs = outcome.headers if outcome.headers is not None else tuple(response.headers.items())
        for name, value in answer_headers(pairs, self.redact):
            resp.headers.add(name, value)
        return resp
