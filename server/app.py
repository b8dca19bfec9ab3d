"""The simulated API over HTTP (aiohttp.web): a thin shell around `RateRules`.

Routes: `GET|POST /api/request` (api_key, nonce, req_id from the query string or
a form body), `GET /stats` (counters and audit), `POST /reset` (clear state).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from aiohttp import web

from .rules import Decision, RateRules
from .settings import ServerSettings

#: Where the app keeps its `RateRules`, for handlers and embedders.
RULES_KEY = web.AppKey("ratedeck_rules", RateRules)

SleepFn = Callable[[float], Awaitable[object]]
ClockMs = Callable[[], float]

_FORM_TYPE = "application/x-www-form-urlencoded"


def _loop_clock_ms() -> float:
    """The moment a request is judged, in milliseconds.

    The loop's own clock where it is precise (the standard loop, and test
    loops on virtual time); `time.monotonic()` under uvloop, whose `time()`
    is whole milliseconds cached once per loop turn, so a busy turn would
    stamp requests early: a server that judges with a stale clock is not the
    server the seed describes (it reads the time in each handler).
    """
    loop = asyncio.get_running_loop()
    if isinstance(loop, asyncio.BaseEventLoop):
        return loop.time() * 1000.0
    return time.monotonic() * 1000.0


def _latency_draw(bounds: tuple[int, int], rng: random.Random) -> Callable[[], int]:
    """A function drawing a whole number of ms in `bounds`, cheap when fixed."""
    low, high = bounds
    if low == high:
        return lambda: low
    return lambda: rng.randint(low, high)


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
    ) -> None:
        settings = rules.settings
        rng = rng if rng is not None else random.Random(settings.seed)
        self.rules = rules
        self._sleep = sleep
        self._clock_ms = clock_ms
        self._draw_in = _latency_draw(settings.latency_in_ms, rng)
        self._draw_out = _latency_draw(settings.latency_out_ms, rng)

    async def api_request(self, request: web.Request) -> web.Response:
        """Answer `/api/request` the way the simulated API would."""
        params = request.query
        if request.body_exists:
            params = await _merged_params(request)
        api_key = params.get("api_key")
        rules = self.rules
        if not rules.is_known(api_key):
            # The seed server rejects unknown keys before any incoming latency.
            decision = rules.decide(api_key, None, 0.0)
        else:
            delay_ms = self._draw_in()
            if delay_ms:
                await self._sleep(delay_ms / 1000.0)
            # The decision time is taken after the incoming delay, as the seed server does.
            decision = rules.decide(api_key, params.get("nonce"), self._clock_ms(), params.get("req_id"))
        delay_ms = self._draw_out()
        if delay_ms:
            await self._sleep(delay_ms / 1000.0)
        return _json_response(decision)

    async def stats(self, request: web.Request) -> web.Response:
        """`GET /stats`: the rules' counters and audit."""
        return web.json_response(self.rules.stats())

    async def reset(self, request: web.Request) -> web.Response:
        """`POST /reset`: forget all state, for benchmarks that reuse one server."""
        self.rules.reset()
        return web.json_response({"status": "OK"})


async def _merged_params(request: web.Request) -> dict[str, str]:
    """Form fields and query parameters together; the query string wins, as in Flask."""
    if request.method == "POST":
        form = await request.post()
        merged = {k: v for k, v in form.items() if isinstance(v, str)}
    elif request.content_type == _FORM_TYPE:
        # aiohttp only parses forms on POST; the seed server also read them on GET.
        merged = dict(parse_qsl(await request.text(), keep_blank_values=True))
    else:
        merged = {}
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
) -> web.Application:
    """Build the aiohttp application for `settings` (rules reachable as app[RULES_KEY])."""
    rules = rules if rules is not None else RateRules(settings)
    handlers = ApiHandlers(rules, sleep=sleep, clock_ms=clock_ms, rng=rng)
    app = web.Application()
    app[RULES_KEY] = rules
    app.router.add_get("/api/request", handlers.api_request)
    app.router.add_post("/api/request", handlers.api_request)
    app.router.add_get("/stats", handlers.stats)
    app.router.add_post("/reset", handlers.reset)
    return app


@dataclass
class RunningServer:
    """A started server: where it listens, its rules, and how to stop it."""

    url: str
    host: str
    port: int
    rules: RateRules
    runner: web.AppRunner

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
) -> RunningServer:
    """Start the simulated API on the caller's event loop; port 0 picks a free port."""
    app = create_app(settings, sleep=sleep, clock_ms=clock_ms)
    # No access log: formatting a line per request would cost a large share of throughput.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
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
    )
