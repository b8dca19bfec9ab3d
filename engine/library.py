"""ratedeck as a library: submit a call, await its result, never mind the limits.

    from ratedeck.config import load_config
    from ratedeck.engine import RateDeck

    cfg = load_config(overrides={"target": {"url": "https://api.example.com/v1/x"},
                                 "keys": {"secrets": ["env:MY_KEYS"], "limits": ["10/1s"]}})
    async with RateDeck(cfg) as deck:
        response = await deck.call({"symbol": "ABC"})      # HTTP, through the key workers
        print(response.status, response.json())

Every call goes through the same engine as a load run: per-key limiters,
headroom, cooldown gates shared by every sender of a budget, pools. A rate
limit is retried behind the gate (up to `engine.max_attempts`); any other
error reaches the caller unchanged: an HTTP error answer as `CallFailed`
carrying the response, an exception raised by your own function (`run`) as
that very exception.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from ratedeck.core.errors import RatedeckError
from ratedeck.core.vocab import Ending
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.endpoints import run_transport
from ratedeck.engine.http.transport import Transport, TransportBase
from ratedeck.engine.snapshot import Snapshot

from .engine import Engine
from .request import CallFn, Request
from .settings import ConfigError, EngineSettings, HoldsEngineSettings, KeySpec, engine_settings


class CallError(RatedeckError):
    """A call that did not succeed; `outcome` is the last attempt's outcome, if any."""

    def __init__(self, message: str, outcome: oc.Outcome | None = None):
        super().__init__(message)
        self.outcome = outcome

    @property
    def response(self):
        return self.outcome.response if self.outcome is not None else None


class CallFailed(CallError):
    """The server answered with an error that is not a rate limit (or the network failed)."""


class RateLimited(CallError):
    """Still rate-limited after `max_attempts` tries behind the cooldown gate."""


class CallExpired(CallError):
    """The call's time-to-live passed before it could be sent."""


class CallShed(CallError):
    """The engine refused the call (shed by an entry throttle)."""


class FunctionTransport(TransportBase):
    """Runs your own coroutine function per call, with the key's secret.

    `delay_error(exc)` says whether an exception is a rate limit: seconds to
    wait (the whole budget pauses that long), or None for any other error,
    which is handed back to the caller as it was raised.
    """

    def __init__(self, delay_error: Callable[[BaseException], float | None]):
        self.delay_error = delay_error

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> oc.Outcome:
        fn = req.call
        if fn is None:
            raise TypeError("a FunctionTransport runs RateDeck.run(fn) calls only")
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            value = await fn(key.secret)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            delay = self.delay_error(exc)
            kind = oc.RATE_LIMITED if delay is not None else oc.CLIENT_ERROR
            return oc.Outcome(
                kind,
                429 if delay is not None else 0,
                delay,
                loop.time() - start,
                error=type(exc).__name__,
                response=exc,
            )
        return oc.Outcome(oc.OK, 200, None, loop.time() - start, response=value)

    async def close(self) -> None:
        pass


class RateDeck:
    """An engine with no generator: the program submits the work.

    Use as `async with RateDeck(cfg) as deck`. `call(params)` sends an HTTP
    request through the configured target; `run(fn)` runs your own coroutine
    function (with a `FunctionTransport`). Both wait while the main queue is
    full (backpressure), so a program cannot flood memory.
    """

    def __init__(
        self,
        cfg: EngineSettings | HoldsEngineSettings,
        *,
        transport: Transport | None = None,
        delay_error: Callable[[BaseException], float | None] | None = None,
    ):
        base = engine_settings(cfg)  # the engine's part of a `ratedeck.config.RunConfig`, say
        # No generated traffic, and no graveyard file: failed calls reach their callers.
        cfg = dataclasses.replace(
            base,
            workload=dataclasses.replace(base.workload, rate=0.0, file=None),
            engine=dataclasses.replace(base.engine, graveyard_path=None),
            messages=None,
        )
        if transport is None and delay_error is not None:
            transport = FunctionTransport(delay_error)
        if transport is None:
            if cfg.target.url is None:
                raise ConfigError(
                    "RateDeck", "target.url", "a library deck needs a target URL, a transport or delay_error"
                )
            transport = run_transport(cfg, cfg.target.url)
        self.cfg = cfg
        self.transport = transport
        self.engine: Engine | None = None

    async def __aenter__(self) -> RateDeck:
        # Only rate limits are retried for a library caller: other errors reach it at once.
        self.engine = Engine(self.cfg, self.transport, retry_errors=False)
        self.engine.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self.engine is not None:
            await self.engine.stop()
        await self.transport.close()

    async def call(
        self, params: dict[str, Any] | None = None, *, pool: str | None = None, ttl_s: float | None = None
    ) -> Any:
        """Send one request (parameters added to the configured ones); return the response.

        `ttl_s`: give up (expired) after this long; None: the config's `engine.ttl_s`,
        by default none, so the call waits as long as the limits need."""
        return await self._submit(dict(params or {}), pool, ttl_s, None)

    async def run(
        self, fn: Callable[[str], Awaitable[Any]], *, pool: str | None = None, ttl_s: float | None = None
    ) -> Any:
        """Run `await fn(secret)` on the next free key; return what it returns."""
        return await self._submit(None, pool, ttl_s, fn)

    def snapshot(self) -> Snapshot:
        if self.engine is None:
            raise RuntimeError("use RateDeck as 'async with RateDeck(...) as deck'")
        return self.engine.snapshot()

    async def _submit(
        self, params: dict | None, pool: str | None, ttl_s: float | None, fn: CallFn | None
    ) -> Any:
        engine = self.engine
        if engine is None:
            raise RuntimeError("use RateDeck as 'async with RateDeck(...) as deck'")
        intake = engine.parts.intake
        if intake.backpressure:
            await engine.parts.queues.wait_space(intake.queue_max)
        fut: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()

        def done(_req: Request, where: Ending) -> None:
            if not fut.done():
                fut.set_result(where)

        req = intake.new_request(params, pool=pool, ttl_s=ttl_s, call=fn)
        req.on_done = done
        intake.submit(req)
        try:
            where = await fut
        except asyncio.CancelledError:
            req.cancelled = True  # not sent from now on; it ends as shed
            raise
        return _result(req, where)


def _result(req: Request, where: Ending) -> Any:
    outcome: oc.Outcome | None = req.result
    if where is Ending.SUCCEEDED:
        return outcome.response if outcome is not None else None
    if where is Ending.EXPIRED:
        raise CallExpired(f"call {req.id} expired after {req.attempts} attempts", outcome)
    if where is Ending.SHED:
        raise CallShed(f"call {req.id} was shed", outcome)
    if (
        outcome is not None
        and isinstance(outcome.response, BaseException)
        and outcome.kind != oc.RATE_LIMITED
    ):
        raise outcome.response  # your own error, unchanged
    if outcome is not None and outcome.kind == oc.RATE_LIMITED:
        raise RateLimited(f"call {req.id} still rate-limited after {req.attempts} attempts", outcome)
    status = outcome.status if outcome is not None else None
    raise CallFailed(
        f"call {req.id} failed: {outcome.error if outcome else 'no answer'}"
        + (f" (HTTP {status})" if status else ""),
        outcome,
    )
