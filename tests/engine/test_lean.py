"""Lean per request (issue 15): the shortcuts keep every behaviour they replace."""

import asyncio
import functools
from urllib.parse import parse_qsl

import pytest
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from ratedeck.engine.http.delays import has_hints
from ratedeck.engine.http.transport import AttemptDeadlines, HttpTransport
from ratedeck.engine.queues import WorkQueues
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec, TargetConfig


def run_async(test):
    """Run an `async def` test on a fresh event loop (no asyncio plugin here)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def _headers(**pairs):
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_hint_readers_are_skipped_only_when_no_header_could_feed_them():
    plain = _headers(**{"Content-Type": "text/plain", "Content-Length": "2", "Date": "x", "Server": "y"})
    assert not has_hints(plain)
    # Near misses: a hint's name inside another, or one longer than it.
    assert not has_hints(_headers(**{"My-Server-Timing": "1", "Server-Timing-X": "1", "X-RateLimitz": "1"}))
    for name in (
        "Server-Timing",
        "X-Response-Time",
        "x-runtime",
        "X-Envoy-Upstream-Service-Time",
        "openai-processing-ms",
        "X-RateLimit-Remaining",
        "RateLimit",
        "RateLimit-Policy",
        "ratelimit-reset",
        "X-MBX-USED-WEIGHT-1M",
    ):
        assert has_hints(_headers(**{"Date": "x", name: "1"})), name


@pytest.mark.parametrize("client", ["reqwest", "aiohttp"])
@pytest.mark.parametrize(
    "suffix,target",
    [
        ("/api/request", dict(key_param="api_key", key_header=None, id_param="req_id")),
        (
            "/x?fixed=1&b=%20",
            dict(key_param="k", key_header=None, nonce_param="nonce", id_param="id", params={"a": "b c"}),
        ),
        ("/p", dict(params={"z": "1"})),  # the key in a header
        ("/p", dict(key_header="X-Api-Key", headers={"X-Team": "t1"})),
        ("/p", dict()),
    ],
)
@run_async
async def test_a_get_carries_its_key_nonce_id_and_params_as_built_field_by_field(suffix, target, client):
    """The lean GET (a URL and headers prebuilt per key) sends what the fields say, on the wire."""
    seen: list[tuple[list[tuple[str, str]], dict[str, str]]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((parse_qsl(request.query_string, keep_blank_values=True), dict(request.headers)))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{suffix}"
    cfg = TargetConfig(url=url, http_client=client, **target)
    transport = HttpTransport(cfg, url, 4)
    key = KeySpec("k1", "s3cr/t+key", ())
    try:
        for params in (None, {"q": "a/b&c", "n": 5}):
            outcome = await transport.send(key, Request(41, 0.0, 100.0, params), 123)
            assert outcome.status == 200, outcome.error
    finally:
        await transport.close()
        await runner.cleanup()
    for (query, headers), params in zip(seen, (None, {"q": "a/b&c", "n": 5}), strict=True):
        want = parse_qsl(suffix.partition("?")[2], keep_blank_values=True)
        if cfg.key_param and not cfg.key_header:
            want.append((cfg.key_param, key.secret))
        if cfg.nonce_param:
            want.append((cfg.nonce_param, "123"))
        if cfg.id_param:
            want.append((cfg.id_param, "41"))
        want += [(k, str(v)) for k, v in (params or {}).items()]
        want += [(k, str(v)) for k, v in cfg.params.items()]
        assert query == want
        assert headers["Accept"] == "*/*" and headers["User-Agent"]
        if cfg.key_header == "Authorization":
            assert headers["Authorization"] == f"Bearer {key.secret}"
        elif cfg.key_header:
            assert headers[cfg.key_header] == key.secret and "Authorization" not in headers
        else:
            assert not any(key.secret in value for value in headers.values())
        for name, value in cfg.headers.items():
            assert headers[name] == value


@run_async
async def test_one_timer_times_out_the_attempts_that_outlive_their_deadline():
    deadlines = AttemptDeadlines(0.05)
    never = asyncio.get_running_loop().create_future()

    async def attempt(wait):
        watch = deadlines.watch()
        try:
            await wait
            return "answered"
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            asyncio.current_task().uncancel()
            return "timed out"
        finally:
            watch.task = None

    quick = asyncio.get_running_loop().create_future()
    quick.set_result(None)
    results = await asyncio.wait_for(asyncio.gather(attempt(never), attempt(quick), attempt(never)), 10)
    assert results == ["timed out", "answered", "timed out"]
    assert len(deadlines) == 0  # nothing left under watch


@run_async
async def test_a_cancellation_from_outside_is_not_taken_for_a_timeout():
    deadlines = AttemptDeadlines(60.0)

    async def attempt():
        watch = deadlines.watch()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            assert not watch.fired
            raise
        finally:
            watch.task = None

    task = asyncio.ensure_future(attempt())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@run_async
async def test_a_full_queue_wakes_its_source_once_an_eighth_of_it_is_free_and_never_overfills():
    queues = WorkQueues()
    limit = 16
    for i in range(limit):
        queues.put(Request(i, 0.0, 100.0))
    waiting = asyncio.ensure_future(queues.wait_space(limit))
    await asyncio.sleep(0)
    assert queues.pop_ready(0.0) is not None  # one free: not worth a wake yet
    await asyncio.sleep(0)
    assert not waiting.done()
    assert queues.pop_ready(0.0) is not None  # two free (16 // 8): the source refills both
    await asyncio.wait_for(waiting, 5)
    assert len(queues.main) == limit - 2
    # A small queue wakes its source for every request taken, as before.
    small = WorkQueues()
    for i in range(4):
        small.put(Request(i, 0.0, 100.0))
    waiting = asyncio.ensure_future(small.wait_space(4))
    await asyncio.sleep(0)
    small.pop_ready(0.0)
    await asyncio.wait_for(waiting, 5)


def test_a_queued_request_costs_under_250_bytes_and_holds_no_side_objects():
    """The issue's memory target: a million queued requests must not cost more than
    about 250 bytes each (the request, its id and times, and its queue slot)."""
    import collections
    import tracemalloc

    n = 20_000
    queue: collections.deque = collections.deque()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        now = 1000.0 + i * 0.001
        queue.append(Request(i + 10_000, now, now + 30.0, None, intended_at=now - 0.0005))
    per_request = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert per_request < 250, per_request
    req = queue[0]
    # nothing but the slots while queued: the side objects are the shared defaults
    assert req._sent is queue[1]._sent and req._extra is queue[1]._extra
    req.cancelled = False
    req.last_status = None
    assert req._sent is queue[1]._sent and req._extra is queue[1]._extra  # setting a default makes nothing
    req.last_status, req.pool = 429, "bulk"
    assert (req.last_status, req.pool, req.last_error, req.cancelled) == (429, "bulk", None, False)
    assert req._sent is not queue[1]._sent and req._extra is not queue[1]._extra
    # the shared defaults were not written
    assert (queue[1].last_status, queue[1].pool) == (None, None)
