"""A real-API stub (`server/stubs/`) answering the engine in memory, on the loop's (virtual) clock.

`InMemoryStub` is the engine's own `HttpTransport` with the wire taken out: each
attempt is built as it would be sent (the key's header, the line's body), handed to
the stub's aiohttp handler as a request made in memory, and its answer read as one
from the network is (the preset's rules, the delay in the body, the x-ratelimit-*
counts). A round trip of `rtt_s` is spent on the loop's clock, half each way. Run it
with `run_virtual` and the stub's clock `loop_clock`: a job of minutes takes a
second or two, the same every time.

    state = OpenAIState(clock=loop_clock, keys=keys)
    engine = Engine(cfg, InMemoryStub(cfg.engine_settings, state.handle))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.http.transport import HttpTransport
from ratedeck.engine.request import Request
from ratedeck.engine.settings import EngineSettings, KeySpec

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def loop_clock() -> float:
    """The running loop's clock, so a stub's buckets refill on virtual time (0.0 before the
    loop runs: where a virtual loop's clock starts)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


class _Protocol:
    """What a request's body reader asks of its connection: nothing here."""

    _reading_paused = False

    def pause_reading(self, **_: Any) -> None:
        pass

    def resume_reading(self, **_: Any) -> None:
        pass


def _payload(data: Any) -> StreamReader:
    reader = StreamReader(_Protocol(), 2**20, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    if data:
        reader.feed_data(data.encode() if isinstance(data, str) else bytes(data))
    reader.feed_eof()
    return reader


class InMemoryStub(HttpTransport):
    """`HttpTransport` answered by `handler` in memory (see the module); `calls` counts attempts."""

    def __init__(self, cfg: EngineSettings, handler: Handler, rtt_s: float = 0.2):
        assert cfg.target.url is not None
        super().__init__(cfg.target, cfg.target.url, 1, secrets=[k.secret for k in cfg.keys])
        self.handler = handler
        self.rtt_s = rtt_s
        self.calls = 0
        # What a request made in memory stands on (its app, connection, writer): made once, as
        # `make_mocked_request` would make them for every request.
        self._parts = {name: mock.Mock() for name in ("app", "protocol", "transport", "writer")}

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        method, url, data, headers = self._building.prepare(key, req, nonce)
        self.calls += 1
        await asyncio.sleep(self.rtt_s / 2)
        target = URL(str(url)).raw_path_qs
        request = make_mocked_request(method, target, dict(headers), payload=_payload(data), **self._parts)
        answer = await self.handler(request)
        assert isinstance(answer, web.Response), "a streamed answer is not read in memory"
        await asyncio.sleep(self.rtt_s / 2)
        body = answer.body if isinstance(answer.body, bytes) else b""
        out = self._answered(answer.status, answer.headers, body, url, 0.0)
        out.latency_s = self.rtt_s
        return out
