"""The API stubs (server/stubs) enforce their documented rules exactly, checked with plain aiohttp calls.

Every test runs on loopback against a stub with small limits and a FakeClock the test
moves by hand, so nothing waits on real time: each limit is shown to refuse at the
documented point, the headers to be exact, weights and costs to count, signatures to
be checked (computed here from the documented recipe), idempotent retries to get the
saved answer, and the stub's own ledger to agree with what the client saw.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from yarl import URL

from ratedeck.server.stubs.binance import start_binance
from ratedeck.server.stubs.common import FakeClock, sliding_capacity
from ratedeck.server.stubs.github import start_github
from ratedeck.server.stubs.kraken import kraken_sign, start_kraken
from ratedeck.server.stubs.stripe import start_stripe

T0 = 1_700_000_000.0  # a multiple of 10 s, so aligned 10 s windows start here


def run(body: Callable[[], Awaitable[None]]) -> None:
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(body(), timeout=10))
    assert time.monotonic() - started < 5


async def until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    """Wait for the server to reach a state (not for a result): a bounded poll."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the stub never reached the expected state"
        await asyncio.sleep(0.002)


async def call(
    session: aiohttp.ClientSession, method: str, url: str | URL, **kw: Any
) -> tuple[int, Any, Any]:
    async with session.request(method, url, **kw) as resp:
        text = await resp.text()
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = text
        return resp.status, body, resp.headers


def test_sliding_capacity_counts_slots() -> None:
    assert sliding_capacity(3, 1.0, [], 0.0, 1.0) == 3
    assert sliding_capacity(3, 1.0, [], 0.0, 2.5) == 9
    # two slots used at -0.5 free at 0.5: 1 now + 2 at 0.5, then again at 1.0 / 1.5
    assert sliding_capacity(3, 1.0, [-0.5, -0.5], 0.0, 1.0) == 3
    assert sliding_capacity(3, 1.0, [-0.5, -0.5], 0.0, 1.6) == 6


# -- GitHub ----------------------------------------------------------------------------

GH = {"Authorization": "Bearer ghp_a", "User-Agent": "ratedeck-test"}


def test_github_primary_limit_refuses_at_the_limit_with_exact_headers() -> None:
    async def body() -> None:
        clock = FakeClock(T0 + 0.5)
        stub = await start_github(clock=clock, tokens=["ghp_a"], core_limit=5, core_window=10)
        reset = str(int(T0) + 11)  # ceil(T0 + 0.5 + 10)
        async with stub, aiohttp.ClientSession() as s:
            for i in range(1, 6):
                status, issues, h = await call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH)
                assert status == 200 and issues == []
                assert (h["x-ratelimit-limit"], h["x-ratelimit-remaining"], h["x-ratelimit-used"]) == (
                    "5",
                    str(5 - i),
                    str(i),
                )
                assert (h["x-ratelimit-reset"], h["x-ratelimit-resource"]) == (reset, "core")
            status, err, h = await call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH)
            assert status == 403 and "API rate limit exceeded" in err["message"]
            assert (h["x-ratelimit-remaining"], h["x-ratelimit-used"], h["x-ratelimit-reset"]) == (
                "0",
                "5",
                reset,
            )
            clock.advance(3)
            status, _, _ = await call(
                s, "GET", f"{stub.url}/repos/o/r", headers=GH
            )  # before reset: refused, flagged
            assert status == 403
            clock.set(float(reset))  # exactly the announced reset: a new window
            status, _, h = await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH)
            assert status == 200 and (h["x-ratelimit-used"], h["x-ratelimit-reset"]) == (
                "1",
                str(int(reset) + 10),
            )
        assert stub.ledger.counts(key="ghp_a") == {"ok": 6, "rate_limited": 2}
        assert stub.ledger.backoff_ignored(key="ghp_a") == 1
        assert [round(t - T0, 1) for t in stub.ledger.arrivals(key="ghp_a", outcome="ok")] == [0.5] * 5 + [
            11.0
        ]

    run(body)


def test_github_429_option_user_agent_and_bad_credentials() -> None:
    async def body() -> None:
        stub = await start_github(
            clock=FakeClock(T0), tokens=["ghp_a"], core_limit=1, core_window=10, primary_status=429
        )
        async with stub, aiohttp.ClientSession() as s:
            status, err, h = await call(
                s,
                "GET",
                f"{stub.url}/user",
                headers={"Authorization": "Bearer ghp_a"},
                skip_auto_headers=["User-Agent"],
            )
            assert status == 403 and "User-Agent" in err["message"] and "x-ratelimit-limit" in h
            status, err, h = await call(
                s, "GET", f"{stub.url}/user", headers={"Authorization": "token nope", "User-Agent": "t"}
            )
            assert status == 401 and err["message"] == "Bad credentials" and h["x-ratelimit-limit"] == "60"
            assert (
                await call(
                    s, "GET", f"{stub.url}/user", headers={"Authorization": "token ghp_a", "User-Agent": "t"}
                )
            )[0] == 200
            status, _, h = await call(s, "GET", f"{stub.url}/user", headers=GH)
            assert status == 429 and h["x-ratelimit-remaining"] == "0"
            # unauthenticated requests are counted per IP, on their own limit
            status, _, h = await call(s, "GET", f"{stub.url}/repos/o/r", headers={"User-Agent": "t"})
            assert status == 200 and (h["x-ratelimit-limit"], h["x-ratelimit-used"]) == ("60", "1")
        assert stub.ledger.counts() == {"no_user_agent": 1, "unauthorized": 1, "ok": 2, "rate_limited": 1}

    run(body)


def test_github_search_is_a_separate_smaller_resource() -> None:
    async def body() -> None:
        stub = await start_github(
            clock=FakeClock(T0),
            tokens=["ghp_a"],
            core_limit=10,
            core_window=10,
            search_limit=2,
            search_window=6,
        )
        async with stub, aiohttp.ClientSession() as s:
            for _ in range(2):
                status, _, h = await call(s, "GET", f"{stub.url}/search/issues?q=bug", headers=GH)
                assert status == 200 and (h["x-ratelimit-resource"], h["x-ratelimit-limit"]) == (
                    "search",
                    "2",
                )
            status, _, h = await call(s, "GET", f"{stub.url}/search/repositories?q=x", headers=GH)
            assert status == 403 and (h["x-ratelimit-resource"], h["x-ratelimit-remaining"]) == (
                "search",
                "0",
            )
            status, _, h = await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH)
            assert status == 200 and (h["x-ratelimit-resource"], h["x-ratelimit-used"]) == ("core", "1")
            status, limits, _ = await call(s, "GET", f"{stub.url}/rate_limit", headers=GH)  # free
            assert (
                limits["resources"]["search"]["remaining"] == 0 and limits["resources"]["core"]["used"] == 1
            )
        assert stub.ledger.units(key="ghp_a", bucket="search") == 2
        assert stub.ledger.units(key="ghp_a", bucket="core") == 1

    run(body)


def test_github_token_that_starts_60_percent_used_and_capacity() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_github(
            clock=clock,
            tokens=["ghp_a"],
            core_limit=10,
            core_window=10,
            initial_used={"ghp_a": 6},
            initial_reset_in=4,
        )
        async with stub, aiohttp.ClientSession() as s:
            # an ideal client from T0 to T0+15: 4 left now, 10 from the reset at T0+4, 10 from T0+14
            assert stub.allowed_capacity(T0, T0 + 15, key="ghp_a") == 24
            statuses = []
            for _ in range(5):
                status, _, h = await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH)
                statuses.append((status, h["x-ratelimit-remaining"], h["x-ratelimit-reset"]))
            assert statuses == [
                (200, "3", str(int(T0) + 4)),
                (200, "2", str(int(T0) + 4)),
                (200, "1", str(int(T0) + 4)),
            ] + [
                (200, "0", str(int(T0) + 4)),
                (403, "0", str(int(T0) + 4)),
            ]
            clock.advance(4)
            for _ in range(3):
                assert (await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH))[0] == 200
            clock.advance(11)
        assert stub.ledger.units(key="ghp_a", start=T0, end=T0 + 15) == 7
        assert stub.share(T0, T0 + 15, key="ghp_a") == 7 / 24
        # seen from T0+4 (a window opened there, 3 used): 7 left, then 10 at T0+14
        assert stub.allowed_capacity(T0 + 5, T0 + 15, key="ghp_a") == 17

    run(body)


def test_github_secondary_concurrency_limit_and_retry_after() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        gate = asyncio.Event()
        stub = await start_github(
            clock=clock,
            tokens=["ghp_a"],
            core_limit=100,
            core_window=10,
            concurrency_limit=3,
            secondary_retry_after=6,
            hold=gate,
        )
        async with stub, aiohttp.ClientSession() as s:
            held = [
                asyncio.create_task(call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH))
                for _ in range(3)
            ]
            await until(lambda: stub.state.in_flight["ghp_a"] == 3)
            status, err, h = await call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH)
            assert status == 403 and "secondary rate limit" in err["message"] and h["retry-after"] == "6"
            assert h["x-ratelimit-remaining"] == "97"
            gate.set()
            assert [r[0] for r in await asyncio.gather(*held)] == [200, 200, 200]
            clock.advance(2)  # still inside the retry-after: refused, told the time left
            status, _, h = await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH)
            assert status == 403 and h["retry-after"] == "4"
            clock.advance(4)
            assert (await call(s, "GET", f"{stub.url}/repos/o/r", headers=GH))[0] == 200
        assert stub.ledger.counts(key="ghp_a") == {"ok": 4, "secondary_limited": 2}
        assert stub.ledger.backoff_ignored(key="ghp_a") == 1

    run(body)


def test_github_secondary_points_count_writes_as_five() -> None:
    async def body() -> None:
        stub = await start_github(
            clock=FakeClock(T0),
            tokens=["ghp_a"],
            core_limit=100,
            core_window=10,
            points_limit=11,
            points_window=6,
        )
        async with stub, aiohttp.ClientSession() as s:
            for n in (1, 2):
                status, issue, _ = await call(
                    s, "POST", f"{stub.url}/repos/o/r/issues", json={"title": f"t{n}"}, headers=GH
                )
                assert status == 201 and issue["number"] == n
            assert (await call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH))[0] == 200  # 11 points
            status, err, _ = await call(s, "GET", f"{stub.url}/repos/o/r/issues", headers=GH)
            assert status == 403 and "secondary" in err["message"]
        assert [r.detail for r in stub.ledger.refused("secondary_limited")] == ["points"]

    run(body)


# -- Stripe ----------------------------------------------------------------------------

SK = "sk_test_stub"
ST = {"Authorization": f"Bearer {SK}"}


def test_stripe_rate_limit_refuses_at_the_limit_without_retry_after() -> None:
    async def body() -> None:
        clock = FakeClock(100.0)
        stub = await start_stripe(clock=clock, keys=[SK], rate_limit=3, window=1.0, endpoint_limit=None)
        async with stub, aiohttp.ClientSession() as s:
            for _ in range(3):
                assert (await call(s, "GET", f"{stub.url}/v1/balance", headers=ST))[0] == 200
            clock.advance(0.5)
            status, err, h = await call(s, "GET", f"{stub.url}/v1/balance", headers=ST)
            assert status == 429 and err["error"]["type"] == "rate_limit_error"
            assert h["Stripe-Rate-Limited-Reason"] == "global-rate" and "Retry-After" not in h
            status, _, _ = await call(s, "GET", f"{stub.url}/v1/balance", headers=ST)
            assert status == 429
            clock.advance(0.5)  # the first three leave the sliding window now
            assert (await call(s, "GET", f"{stub.url}/v1/balance", headers=ST))[0] == 200
        assert stub.ledger.counts(key=SK) == {"ok": 4, "rate_limited": 2}
        assert stub.ledger.backoff_ignored(key=SK) == 1
        assert stub.allowed_capacity(100.0, 101.0, key=SK) == 3
        assert stub.allowed_capacity(100.0, 101.5, key=SK) == 6
        assert stub.share(100.0, 101.5, key=SK) == 4 / 6

    run(body)


def test_stripe_rejects_unknown_and_missing_params_and_bad_keys() -> None:
    async def body() -> None:
        stub = await start_stripe(clock=FakeClock(0.0), keys=[SK])
        async with stub, aiohttp.ClientSession() as s:
            status, err, _ = await call(
                s,
                "POST",
                f"{stub.url}/v1/charges",
                data={"amount": "100", "currency": "usd", "req_id": "7"},
                headers=ST,
            )
            assert status == 400
            assert err["error"] == {
                "type": "invalid_request_error",
                "message": "Received unknown parameter: req_id",
                "param": "req_id",
            }
            status, err, _ = await call(
                s, "POST", f"{stub.url}/v1/charges", data={"currency": "usd"}, headers=ST
            )
            assert (
                status == 400
                and err["error"]["message"] == "Missing required param: amount."
                and err["error"]["param"] == "amount"
            )
            status, err, _ = await call(
                s, "POST", f"{stub.url}/v1/charges", json={"amount": 100, "currency": "usd"}, headers=ST
            )
            assert status == 400 and "x-www-form-urlencoded" in err["error"]["message"]
            status, err, _ = await call(s, "GET", f"{stub.url}/v1/charges?limit=3&req_id=1", headers=ST)
            assert status == 400 and err["error"]["param"] == "req_id"
            status, err, _ = await call(
                s, "GET", f"{stub.url}/v1/balance", headers={"Authorization": "Bearer sk_test_wrong_key_1234"}
            )
            assert status == 401 and err["error"]["message"].startswith("Invalid API Key provided")
            basic = base64.b64encode(f"{SK}:".encode()).decode()
            assert (
                await call(s, "GET", f"{stub.url}/v1/balance", headers={"Authorization": f"Basic {basic}"})
            )[0] == 200
        assert stub.state.writes == []
        assert stub.ledger.counts() == {"invalid_request": 4, "unauthorized": 1, "ok": 1}

    run(body)


def test_stripe_idempotent_retry_returns_the_saved_answer_and_never_writes_twice() -> None:
    async def body() -> None:
        stub = await start_stripe(clock=FakeClock(0.0), keys=[SK])
        charge = {"amount": "500", "currency": "usd", "metadata[order_id]": "A1"}
        async with stub, aiohttp.ClientSession() as s:
            h = {**ST, "Idempotency-Key": "k-1"}
            async with s.post(f"{stub.url}/v1/charges", data=charge, headers=h) as r1:
                first = (r1.status, await r1.text())
            async with s.post(f"{stub.url}/v1/charges", data=charge, headers=h) as r2:
                again = (r2.status, await r2.text())
                assert r2.headers["Idempotency-Key"] == "k-1"
            assert first == again and first[0] == 200
            status, err, _ = await call(
                s, "POST", f"{stub.url}/v1/charges", data={**charge, "amount": "501"}, headers=h
            )
            assert status == 400 and err["error"]["type"] == "idempotency_error"
            status, _, _ = await call(
                s, "POST", f"{stub.url}/v1/customers", data={}, headers=h
            )  # another endpoint, same key
            assert status == 400
        assert len(stub.state.writes) == 1 and stub.state.writes_by_logical("charge") == {"A1": 1}
        assert stub.ledger.counts() == {"ok": 1, "replayed": 1, "idempotency_error": 2}

    run(body)


def test_stripe_injected_failure_writes_then_500_and_retries_show_duplicates() -> None:
    async def body() -> None:
        stub = await start_stripe(clock=FakeClock(0.0), keys=[SK], fail_pattern=[True, True, False])
        async with stub, aiohttp.ClientSession() as s:
            with_key = {**ST, "Idempotency-Key": "k-9"}
            a = {"amount": "100", "currency": "usd", "metadata[order_id]": "A"}
            status, err, _ = await call(s, "POST", f"{stub.url}/v1/charges", data=a, headers=with_key)
            assert status == 500 and err["error"]["type"] == "api_error"
            status, err2, _ = await call(s, "POST", f"{stub.url}/v1/charges", data=a, headers=with_key)
            assert (status, err2) == (500, err)  # the saved 500, not a second write
            b = {"amount": "100", "currency": "usd", "metadata[order_id]": "B"}
            assert (await call(s, "POST", f"{stub.url}/v1/charges", data=b, headers=ST))[0] == 500
            assert (await call(s, "POST", f"{stub.url}/v1/charges", data=b, headers=ST))[
                0
            ] == 200  # retried without a key
        assert stub.state.writes_by_logical("charge") == {"A": 1, "B": 2}
        assert stub.state.duplicate_writes() == {"B": 2}
        assert [w.failed for w in stub.state.writes] == [True, True, False]

    run(body)


def test_stripe_same_key_in_flight_is_409_and_endpoint_limit_is_separate() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        stub = await start_stripe(clock=FakeClock(0.0), keys=[SK], rate_limit=10, endpoint_limit=2, hold=gate)
        data = {"amount": "100", "currency": "usd"}
        async with stub, aiohttp.ClientSession() as s:
            first = asyncio.create_task(
                call(s, "POST", f"{stub.url}/v1/charges", data=data, headers={**ST, "Idempotency-Key": "k"})
            )
            await until(lambda: stub.state.in_flight[SK] == 1)
            status, err, _ = await call(
                s, "POST", f"{stub.url}/v1/charges", data=data, headers={**ST, "Idempotency-Key": "k"}
            )
            assert status == 409 and err["error"]["code"] == "idempotency_key_in_use"
            gate.set()
            assert (await first)[0] == 200
            status, _, h = await call(s, "POST", f"{stub.url}/v1/charges", data=data, headers=ST)
            assert status == 429 and h["Stripe-Rate-Limited-Reason"] == "endpoint-rate"
            assert (await call(s, "GET", f"{stub.url}/v1/balance", headers=ST))[0] == 200
        assert len(stub.state.writes) == 1
        assert stub.allowed_capacity(0.0, 1.0, key=SK, bucket="POST /v1/charges") == 2

    run(body)


# -- Binance ---------------------------------------------------------------------------

# the documented HMAC example (rest-api.md "SIGNED Endpoint Examples for POST /api/v3/order")
DOC_KEY = "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zvsw0MuIgwCIPy6utIco14y7Ju91duEh8A"
DOC_SECRET = "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP1e3UZjInClVN65XAbvqqM6A7H5fATj0j"
DOC_QUERY = "symbol=LTCBTC&side=BUY&type=LIMIT&timeInForce=GTC&quantity=1&price=0.1&recvWindow=5000&timestamp=1499827319559"
DOC_SIGNATURE = "c8db56825ae71d6d79447849e617115f4a920fa2acdcab2b053c4b2838bd6b71"


def binance_sig(payload: str, secret: str = DOC_SECRET) -> str:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()


def test_binance_documented_signature_passes_and_a_wrong_one_fails() -> None:
    async def body() -> None:
        assert binance_sig(DOC_QUERY) == DOC_SIGNATURE  # the recipe as documented
        clock = FakeClock(1499827319.559 + 0.2)
        stub = await start_binance(clock=clock, keys={DOC_KEY: DOC_SECRET})
        key = {"X-MBX-APIKEY": DOC_KEY}
        async with stub, aiohttp.ClientSession() as s:
            url = URL(f"{stub.url}/api/v3/order?{DOC_QUERY}&signature={DOC_SIGNATURE}", encoded=True)
            status, order, h = await call(s, "POST", url, headers=key)
            assert status == 200 and order["symbol"] == "LTCBTC"
            assert (h["X-MBX-USED-WEIGHT-1M"], h["X-MBX-ORDER-COUNT-10S"], h["X-MBX-ORDER-COUNT-1D"]) == (
                "1",
                "1",
                "1",
            )
            upper = URL(
                f"{stub.url}/api/v3/order?{DOC_QUERY}&signature={DOC_SIGNATURE.upper()}", encoded=True
            )
            assert (await call(s, "POST", upper, headers=key))[
                0
            ] == 200  # HMAC signatures are not case-sensitive
            wrong = URL(f"{stub.url}/api/v3/order?{DOC_QUERY}&signature={DOC_SIGNATURE[:-1]}0", encoded=True)
            status, err, _ = await call(s, "POST", wrong, headers=key)
            assert (status, err["code"]) == (400, -1022)
            # parameters split between query and body: the payload is query + body, no separator
            q, b = "symbol=LTCBTC&side=BUY", "type=MARKET&quantity=1&timestamp=1499827319600"
            url = URL(f"{stub.url}/api/v3/order?{q}", encoded=True)
            form = {**key, "Content-Type": "application/x-www-form-urlencoded"}
            status, _, _ = await call(
                s, "POST", url, data=f"{b}&signature={binance_sig(q + b)}", headers=form
            )
            assert status == 200
            status, err, _ = await call(
                s, "POST", url, data=f"{b}&signature={binance_sig(q + '&' + b)}", headers=form
            )
            assert (status, err["code"]) == (400, -1022)
        assert stub.ledger.counts() == {"ok": 3, "bad_signature": 2}
        assert stub.ledger.charged() == 5  # failed requests use their weight too

    run(body)


def test_binance_timing_and_key_checks() -> None:
    async def body() -> None:
        clock = FakeClock(T0)
        stub = await start_binance(clock=clock, keys={"k": "s"})
        now_ms = int(T0 * 1000)

        def signed(ts: int, extra: str = "") -> str:
            q = f"timestamp={ts}{extra}"
            return f"{q}&signature={binance_sig(q, 's')}"

        async with stub, aiohttp.ClientSession() as s:
            acct = f"{stub.url}/api/v3/account"
            assert (
                await call(
                    s,
                    "GET",
                    URL(f"{acct}?{signed(now_ms - 5000)}", encoded=True),
                    headers={"X-MBX-APIKEY": "k"},
                )
            )[0] == 200
            status, err, h = await call(
                s, "GET", URL(f"{acct}?{signed(now_ms - 5001)}", encoded=True), headers={"X-MBX-APIKEY": "k"}
            )
            assert (status, err["code"]) == (400, -1021) and "recvWindow" in err["msg"]
            status, err, _ = await call(
                s, "GET", URL(f"{acct}?{signed(now_ms + 1000)}", encoded=True), headers={"X-MBX-APIKEY": "k"}
            )
            assert (status, err["code"]) == (400, -1021) and "ahead" in err["msg"]
            ok = URL(f"{acct}?{signed(now_ms - 9000, '&recvWindow=10000')}", encoded=True)
            assert (await call(s, "GET", ok, headers={"X-MBX-APIKEY": "k"}))[0] == 200
            status, err, _ = await call(s, "GET", URL(f"{acct}?{signed(now_ms)}", encoded=True))
            assert (status, err["code"]) == (401, -2014)
            status, err, h = await call(
                s, "GET", URL(f"{acct}?{signed(now_ms)}", encoded=True), headers={"X-MBX-APIKEY": "x"}
            )
            assert (status, err["code"]) == (401, -2015)
            assert h["X-MBX-USED-WEIGHT-1M"] == "120"  # six account calls of weight 20, whatever their answer
        assert stub.ledger.counts() == {"ok": 2, "bad_timestamp": 2, "unauthorized": 2}

    run(body)


def test_binance_weights_429_then_escalating_418_bans() -> None:
    async def body() -> None:
        clock = FakeClock(T0 + 2)
        stub = await start_binance(
            clock=clock, weight_limits=[(30, 10)], ban_after=3, ban_base=12, ban_max=20
        )
        async with stub, aiohttp.ClientSession() as s:
            status, _, h = await call(s, "GET", f"{stub.url}/api/v3/exchangeInfo")
            assert status == 200 and h["X-MBX-USED-WEIGHT-10S"] == "20"
            status, _, h = await call(s, "GET", f"{stub.url}/api/v3/depth?symbol=BTCUSDT&limit=100")
            assert status == 200 and h["X-MBX-USED-WEIGHT-10S"] == "25"
            status, err, h = await call(
                s, "GET", f"{stub.url}/api/v3/depth?symbol=BTCUSDT&limit=500"
            )  # 25 more: over 30
            assert (status, err["code"], h["Retry-After"], h["X-MBX-USED-WEIGHT-10S"]) == (
                429,
                -1003,
                "8",
                "50",
            )
            assert "current limit is 30 request weight per 10 SECOND" in err["msg"]
            for expected in (429, 429):  # not backing off: violations
                assert (await call(s, "GET", f"{stub.url}/api/v3/ping"))[0] == expected
            status, err, h = await call(s, "GET", f"{stub.url}/api/v3/ping")  # the third: banned
            assert (status, err["code"], h["Retry-After"]) == (418, -1003, "12")
            clock.advance(9)  # a new weight window, but still banned
            status, _, h = await call(s, "GET", f"{stub.url}/api/v3/ping")
            assert (status, h["Retry-After"]) == (418, "3")
            clock.advance(3)  # ban over
            status, _, h = await call(s, "GET", f"{stub.url}/api/v3/ping")
            assert status == 200 and h["X-MBX-USED-WEIGHT-10S"] == "1"
            # a repeat offender gets a longer ban (doubled, capped at ban_max)
            for _ in range(2):
                await call(s, "GET", f"{stub.url}/api/v3/depth?symbol=BTCUSDT&limit=1000")
            for _ in range(2):
                await call(s, "GET", f"{stub.url}/api/v3/ping")
            status, _, h = await call(s, "GET", f"{stub.url}/api/v3/ping")
            assert (status, h["Retry-After"]) == (418, "20")
        assert [round(until - start) for _, start, until in stub.state.ban_log] == [12, 20]
        assert stub.ledger.counts() == {"ok": 3, "rate_limited": 6, "banned": 4}

    run(body)


def test_binance_order_limit_duplicates_and_capacity() -> None:
    async def body() -> None:
        clock = FakeClock(T0 + 5)
        stub = await start_binance(
            clock=clock, keys={"k": "s"}, weight_limits=[(30, 10)], order_limits=[(2, 10)]
        )
        ts = int((T0 + 5) * 1000)

        def order(client_id: str) -> URL:
            q = f"symbol=BTCUSDT&side=BUY&type=MARKET&quantity=1&newClientOrderId={client_id}&timestamp={ts}"
            return URL(f"{stub.url}/api/v3/order?{q}&signature={binance_sig(q, 's')}", encoded=True)

        async with stub, aiohttp.ClientSession() as s:
            h1 = (await call(s, "POST", order("a"), headers={"X-MBX-APIKEY": "k"}))[2]
            status, err, _ = await call(s, "POST", order("a"), headers={"X-MBX-APIKEY": "k"})
            assert (status, err["code"], err["msg"]) == (400, -2010, "Duplicate order sent.")
            h2 = (await call(s, "POST", order("b"), headers={"X-MBX-APIKEY": "k"}))[2]
            assert (h1["X-MBX-ORDER-COUNT-10S"], h2["X-MBX-ORDER-COUNT-10S"]) == ("1", "2")
            status, err, h = await call(s, "POST", order("c"), headers={"X-MBX-APIKEY": "k"})
            assert (status, err["code"], h["Retry-After"]) == (429, -1015, "5")
        assert stub.ledger.counts() == {"ok": 2, "invalid_request": 1, "order_limited": 1}
        # weight: 4 used in the window [T0, T0+10) before T0+6; then two full windows
        assert stub.allowed_capacity(T0 + 6, T0 + 25, key="ip:127.0.0.1") == (30 - 4) + 30 + 30
        assert stub.share(T0 + 5, T0 + 10, key="ip:127.0.0.1") == 2 / 30

    run(body)


# -- Kraken ----------------------------------------------------------------------------

# the documented example (docs.kraken.com "Spot REST Authentication")
KR_SECRET = "kQH5HW/8p1uGOVjbgWA7FunAmGO8lsSUXNsu3eow76sz84Q18fWxnyRzBHCd3pd5nE9qa99HAZtuZuj6F1huXg=="
KR_PAYLOAD = "nonce=1616492376594&ordertype=limit&pair=XBTUSD&price=37500&type=buy&volume=1.25"
KR_SIGN = "4/dpxb3iT4tp/ZCVEwSnEsLxx0bqyhLpdfOpc6fn7OR8+UClSV5n9E6aSS8MPtnRfp32bAb0nmbRn6H8ndwLUQ=="
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def krak_sig(path: str, nonce: int | str, body: str, secret: str = KR_SECRET) -> str:
    """The documented recipe, written out here independently of the stub."""
    inner = hashlib.sha256((str(nonce) + body).encode()).digest()
    mac = hmac.new(base64.b64decode(secret), path.encode() + inner, hashlib.sha512)
    return base64.b64encode(mac.digest()).decode()


class KrakenClient:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, key: str = "doc", secret: str = KR_SECRET
    ) -> None:
        self.s, self.url, self.key, self.secret, self.nonce = session, url, key, secret, 1000

    async def __call__(
        self, method: str, nonce: int | None = None, sign: str | None = None, **params: str
    ) -> Any:
        if nonce is None:
            self.nonce += 1
            nonce = self.nonce
        body = "&".join([f"nonce={nonce}"] + [f"{k}={v}" for k, v in params.items()])
        path = f"/0/private/{method}"
        headers = {**FORM, "API-Key": self.key, "API-Sign": sign or krak_sig(path, nonce, body, self.secret)}
        status, answer, _ = await call(self.s, "POST", self.url + path, data=body, headers=headers)
        assert status == 200
        return answer


def test_kraken_documented_signature_passes_and_a_wrong_one_fails() -> None:
    async def body() -> None:
        path = "/0/private/AddOrder"
        assert (
            krak_sig(path, "1616492376594", KR_PAYLOAD)
            == KR_SIGN
            == kraken_sign(path, "1616492376594", KR_PAYLOAD, KR_SECRET)
        )
        stub = await start_kraken(clock=FakeClock(0.0), keys={"doc": KR_SECRET})
        async with stub, aiohttp.ClientSession() as s:
            headers = {**FORM, "API-Key": "doc", "API-Sign": KR_SIGN}
            status, answer, _ = await call(s, "POST", stub.url + path, data=KR_PAYLOAD, headers=headers)
            assert status == 200 and answer["error"] == [] and answer["result"]["txid"]
            assert answer["result"]["descr"]["order"] == "buy 1.25 XBTUSD @ limit 37500"
            k = KrakenClient(s, stub.url)
            k.nonce = 1616492376594
            assert (await k("Balance", sign=KR_SIGN))["error"] == ["EAPI:Invalid signature"]
            assert (await k("Balance"))["error"] == []
            other = base64.b64encode(b"another secret").decode()
            assert (await KrakenClient(s, stub.url, "doc", other)("Balance", nonce=k.nonce + 5))["error"] == [
                "EAPI:Invalid signature"
            ]
            assert (await KrakenClient(s, stub.url, "nobody")("Balance", nonce=k.nonce + 6))["error"] == [
                "EAPI:Invalid key"
            ]
        assert stub.ledger.counts(key="doc") == {"ok": 2, "bad_signature": 2}

    run(body)


def test_kraken_nonce_must_increase() -> None:
    async def body() -> None:
        stub = await start_kraken(clock=FakeClock(0.0), keys={"doc": KR_SECRET})
        async with stub, aiohttp.ClientSession() as s:
            k = KrakenClient(s, stub.url)
            assert (await k("Balance", nonce=50))["error"] == []
            assert (await k("Balance", nonce=50))["error"] == ["EAPI:Invalid nonce"]
            assert (await k("Balance", nonce=49))["error"] == ["EAPI:Invalid nonce"]
            assert (await k("Balance", nonce=51))["error"] == []
        assert stub.ledger.counts() == {"ok": 2, "invalid_nonce": 2}
        assert stub.state.counter("doc").read(0.0) == 4  # bad-nonce calls cost their units too

    run(body)


def test_kraken_call_counter_max_cost_and_decay() -> None:
    async def body() -> None:
        clock = FakeClock(0.0)
        stub = await start_kraken(clock=clock, keys={"doc": KR_SECRET}, tier="starter")
        async with stub, aiohttp.ClientSession() as s:
            k = KrakenClient(s, stub.url)
            for _ in range(15):
                assert (await k("Balance"))["error"] == []
            answer = await k("Balance")
            assert answer == {"error": ["EAPI:Rate limit exceeded"]}  # the 16th, with HTTP 200
            status, pub, _ = await call(s, "GET", f"{stub.url}/0/public/Time")  # public calls cost nothing
            assert status == 200 and pub["error"] == []
            # the refused call added 1 (16): back under the max for a cost-1 call takes 2 / 0.33 s
            clock.advance(6.0)
            assert (await k("Balance"))["error"] == ["EAPI:Rate limit exceeded"]
            clock.advance(3.1)  # 17 - 0.33 * 9.1 = 14.0
            assert (await k("Balance"))["error"] == []
        assert stub.ledger.counts(key="doc") == {"ok": 16, "rate_limited": 2}
        assert stub.ledger.backoff_ignored(key="doc") == 1
        # an ideal client over [0, 9): 15 at once, then 0.33 a second (17.97 units)
        assert stub.allowed_capacity(0.0, 9.0, key="doc") == 17
        assert stub.share(0.0, 9.0, key="doc") == 15 / 17

    run(body)


def test_kraken_ledger_calls_cost_two_and_trading_has_its_own_counter() -> None:
    async def body() -> None:
        clock = FakeClock(0.0)
        stub = await start_kraken(clock=clock, keys={"doc": KR_SECRET}, trading_threshold=10)
        async with stub, aiohttp.ClientSession() as s:
            k = KrakenClient(s, stub.url)
            for _ in range(7):
                assert (await k("Ledgers"))["error"] == []
            assert (await k("TradesHistory"))["error"] == ["EAPI:Rate limit exceeded"]  # 14 + 2 > 15
            # orders do not use the REST counter; an order cancelled at once costs +8
            txid = (await k("AddOrder", ordertype="limit", type="buy", volume="1", pair="XBTUSD", price="1"))[
                "result"
            ]["txid"][0]
            assert (await k("CancelOrder", txid=txid))["error"] == []
            assert (await k("AddOrder", ordertype="market", type="buy", volume="1", pair="XBTUSD"))[
                "error"
            ] == []
            answer = await k("AddOrder", ordertype="market", type="buy", volume="1", pair="XBTUSD")
            assert answer["error"] == ["EOrder:Rate limit exceeded"]  # 1 + 8 + 1 + 1 > 10
            assert (await k("AddOrder", ordertype="market", type="buy", volume="1", pair="ETHUSD"))[
                "error"
            ] == []  # per pair
        assert stub.ledger.units(key="doc", bucket="rest") == 14
        assert stub.ledger.units(key="doc", bucket="trading:XBTUSD") == 10
        assert stub.ledger.counts(key="doc") == {"ok": 11, "rate_limited": 1, "order_limited": 1}

    run(body)
