"""The simulated API over HTTP (aiohttp.web): a thin shell around `RateRules`.

Routes: `GET|POST /api/request` (api_key, nonce, req_id from the query string or
a form body), `GET /stats` (counters and audit; `?arrivals=1` adds the accept stamps and the
429s' stamps), `POST /reset` (clear state),
and with `health` on, `GET /health` (no key, no limit: a probe's target).

A request's time on the server, in order: the way in (`latency_in_ms`), the
decision at the arrival stamp, server processing (`processing_ms`, only for a
request that spent a slot), the way back (`latency_out_ms`). With
`server_timing`, the answer says how long it spent between the stamp and the
answer (`Server-Timing: app;dur=X`, measured, not the drawn value).

`/reset` is off unless the server is started with a `reset_token` (`ratedeck
serve --allow-reset` makes one and prints it); then it needs the header
`X-Reset-Token` with that token. A body that cannot be parsed is a 400.

Nothing the server logs carries a request line or a key: there is no access
log, and aiohttp's own error lines (a malformed request quotes its request
line, `?api_key=...` included) go through a filter that keeps the message
and the exception's type only, with key-like parameters masked.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from aiohttp import web

from ratedeck.core.secrets import redact

from .rules import SPENT, Decision, RateRules, server_timing
from .settings import ServerSettings

#: Where the app keeps its `RateRules`, for handlers and embedders.
RULES_KEY = web.AppKey("ratedeck_rules", RateRules)

SleepFn = Callable[[float], Awaitable[object]]
ClockMs = Callable[[], float]

_FORM_TYPE = "application/x-www-form-urlencoded"
RESET_HEADER = "X-Reset-Token"
_KEYLIKE = re.compile(r"(?i)((?:api[_-]?)?key|token|secret|password|passwd|auth\w*|signature|sig)=[^&\s'\"]*")


def _loop_clock_ms() -> float:
    """The moment a request is judged, in milliseconds.

    The loop's own clock where it is precise (the standard loop, and test
    loops on virtual time); `time.monotonic()` under uvloop, whose `time()`
    is whole milliseconds cached once per loop turn, so a busy turn would
    stamp requests early: a server that judges with a stale clock is not the
    server the study describes (it reads the time in each handler).
    """
    loop = asyncio.get_running_loop()
    if isinstance(loop, asyncio.BaseEventLoop):
        return loop.time() * 1000.0
    return time.monotonic() * 1000.0


def _latency_draw(bounds: tuple[int, int], rng: random.Random) -> Callable[[], float]:
    """A function drawing ms uniformly in `bounds` (any fraction, as a network's delay is), cheap
    when fixed."""
    low, high = bounds
    if low == high:
        return lambda: low
    return lambda: rng.uniform(low, high)


class ApiHandlers:
    """The request handlers, holding everything they need as attributes.

    `sleep` and `clock_ms` are injectable so tests can see every simulated delay
    and control the time a decision is made at.
    """

    def __init__(
        self,
        rules: RateRules,
        *,
        sleep: SleepFn = asyncio.sleep,
        clock_ms: ClockMs = _loop_clock_ms,
        rng: random.Random | None = None,
        reset_token: str | None = None,
    ) -> None:
        settings = rules.settings
        rng = rng if rng is not None else random.Random(settings.seed)
        self.rules = rules
        self.reset_token = reset_token  # None: POST /reset is off
        self._modern_keys = settings.mode != "study"  # Bearer or X-Api-Key as well as api_key
        self._sleep = sleep
        self._clock_ms = clock_ms
        self._draw_in = _latency_draw(settings.latency_in_ms, rng)
        self._draw_out = _latency_draw(settings.latency_out_ms, rng)
        self._draw_processing = _latency_draw(settings.processing_ms, rng)
        self._server_timing = settings.server_timing

    async def api_request(self, request: web.Request) -> web.Response:
        """Answer `/api/request` the way the simulated API would."""
        params: Mapping[str, str] = request.query
        if request.body_exists:
            params = await _merged_params(request)
        api_key = params.get("api_key")
        if api_key is None and self._modern_keys:
            # Standard mode takes a key the modern ways too (the study's server knows only api_key).
            auth = request.headers.get("Authorization", "")
            api_key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("X-Api-Key")
        rules = self.rules
        if not rules.is_known(api_key):
            # The study's server rejects unknown keys before any incoming latency.
            decision = rules.decide(api_key, None, 0.0)
        else:
            delay_ms = self._draw_in()
            if delay_ms:
                await self._sleep(delay_ms / 1000.0)
            # The decision time is taken after the incoming delay, as the study's server does.
            stamp_ms = self._clock_ms()
            decision = rules.decide(api_key, params.get("nonce"), stamp_ms, params.get("req_id"))
            if decision.outcome in SPENT:
                processing_ms = self._draw_processing()
                if processing_ms:
                    await self._sleep(processing_ms / 1000.0)
            if self._server_timing:
                decision.headers["Server-Timing"] = server_timing(self._clock_ms() - stamp_ms)
        delay_ms = self._draw_out()
        if delay_ms:
            await self._sleep(delay_ms / 1000.0)
        return _json_response(decision)

    async def health(self, request: web.Request) -> web.Response:
        """`GET /health`: costs nothing against any limit; the same network delays each way."""
        delay_ms = self._draw_in()
        if delay_ms:
            await self._sleep(delay_ms / 1000.0)
        delay_ms = self._draw_out()
        if delay_ms:
            await self._sleep(delay_ms / 1000.0)
        return web.json_response({"status": "OK"})

    async def stats(self, request: web.Request) -> web.Response:
        """`GET /stats`: the rules' counters and audit; `?arrivals=1` adds each key's accept
        stamps (`RateRules.arrivals_ms`, for the bench's sustained efficiency)."""
        return web.json_response(self.rules.stats(arrivals=request.query.get("arrivals") == "1"))

    async def reset(self, request: web.Request) -> web.Response:
        """`POST /reset`: forget all state, for benchmarks that reuse one server.

        Only with a reset token (see the module doc), given in `X-Reset-Token`.
        """
        token = self.reset_token
        if token is None:
            return web.json_response(
                {"error": "reset is off; start the server with --allow-reset"}, status=403
            )
        given = request.headers.get(RESET_HEADER, "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.json_response({"error": f"reset needs the {RESET_HEADER} header"}, status=403)
        self.rules.reset()
        return web.json_response({"status": "OK"})


async def _merged_params(request: web.Request) -> dict[str, str]:
    """Form fields and query parameters together; the query string wins, as in Flask.

    A body that cannot be parsed (a broken multipart, bad encoding) is a 400.
    """
    try:
        if request.method == "POST":
            form = await request.post()
            merged = {k: v for k, v in form.items() if isinstance(v, str)}
        elif request.content_type == _FORM_TYPE:
            # aiohttp only parses forms on POST; the study's server also read them on GET.
            merged = dict(parse_qsl(await request.text(), keep_blank_values=True))
        else:
            merged = {}
    except web.HTTPException:
        raise  # aiohttp's own answer (a body too large, say)
    except Exception:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "malformed request body"}), content_type="application/json"
        ) from None
    query = request.query
    merged.update({name: query[name] for name in query})  # query[name] is the first value
    return merged


def _json_response(decision: Decision) -> web.Response:
    return web.Response(
        body=json.dumps(decision.body).encode(),
        status=decision.status,
        headers=decision.headers or None,
        content_type="application/json",
    )


def create_app(
    settings: ServerSettings,
    *,
    rules: RateRules | None = None,
    sleep: SleepFn = asyncio.sleep,
    clock_ms: ClockMs = _loop_clock_ms,
    rng: random.Random | None = None,
    reset_token: str | None = None,
) -> web.Application:
    """Build the aiohttp application for `settings` (rules reachable as app[RULES_KEY]).

    `reset_token`: None leaves `POST /reset` off; a token turns it on for requests that carry it.
    """
    rules = rules if rules is not None else RateRules(settings)
    handlers = ApiHandlers(rules, sleep=sleep, clock_ms=clock_ms, rng=rng, reset_token=reset_token)
    app = web.Application()
    app[RULES_KEY] = rules
    app.router.add_get("/api/request", handlers.api_request)
    app.router.add_post("/api/request", handlers.api_request)
    app.router.add_get("/stats", handlers.stats)
    app.router.add_post("/reset", handlers.reset)
    if settings.health:
        app.router.add_get("/health", handlers.health)
    return app


@dataclass
class RunningServer:
    """A started server: where it listens, its rules, and how to stop it."""

    url: str
    host: str
    port: int
    rules: RateRules
    runner: web.AppRunner
    reset_token: str | None = None

    async def close(self) -> None:
        """Stop listening and close open connections."""
        await self.runner.cleanup()

    async def __aenter__(self) -> RunningServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_server(
    settings: ServerSettings,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    sleep: SleepFn = asyncio.sleep,
    clock_ms: ClockMs = _loop_clock_ms,
    reset_token: str | None = None,
) -> RunningServer:
    """Start the simulated API on the caller's event loop; port 0 picks a free port."""
    app = create_app(settings, sleep=sleep, clock_ms=clock_ms, reset_token=reset_token)
    # No access log: formatting a line per request would cost a large share of throughput
    # (and a request line may carry a key). Error lines go through `quiet_logger`.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        logger=quiet_logger(settings.keys),
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    url_host = f"[{host}]" if ":" in host else host
    return RunningServer(
        url=f"http://{url_host}:{bound_port}",
        host=host,
        port=bound_port,
        rules=app[RULES_KEY],
        runner=runner,
        reset_token=reset_token,
    )


class _NoRequestLines(logging.Filter):
    """Keeps an error line's message and exception type; drops the traceback and masks keys.

    aiohttp logs a malformed request with its request line quoted in the
    exception (`GET /api/request?api_key=... HTTP/1.1`); a traceback there
    would print the key.
    """

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()  # every key of every server started in this process

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:
            text = str(record.msg)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text = f"{text}: {type(exc).__name__}"
        record.msg = _KEYLIKE.sub(r"\1=…", redact(text, self.secrets, 300))
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


_FILTER = _NoRequestLines()


def quiet_logger(secrets: tuple[str, ...] = ()) -> logging.Logger:
    """The logger aiohttp's server writes its errors to, with `_NoRequestLines` on it."""
    logger = logging.getLogger("ratedeck.server.http")
    _FILTER.secrets.update(s for s in secrets if s)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
