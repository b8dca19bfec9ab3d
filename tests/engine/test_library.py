"""ratedeck as a library: results, unchanged errors, rate limits retried behind the gate."""

import asyncio

import pytest

from ratedeck.config import load_config
from ratedeck.engine.library import CallFailed, RateDeck, RateLimited
from ratedeck.server.app import start_server
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import run_virtual


class Slow(Exception):
    """What a vendor SDK raises for a rate limit, with its own delay."""

    def __init__(self, delay):
        super().__init__(f"slow down {delay}s")
        self.delay = delay


def cfg(**engine):
    return load_config(preset="study", overrides={"engine": {"ttl_s": 60.0, **engine}})


def test_run_returns_values_and_other_errors_reach_the_caller_unchanged():
    boom = KeyError("boom")
    calls = []

    async def fn(secret):
        calls.append(secret)
        if len(calls) == 2:
            raise boom
        return secret[-4:]

    async def main():
        async with RateDeck(cfg(), delay_error=lambda e: e.delay if isinstance(e, Slow) else None) as deck:
            first = await deck.run(fn)
            with pytest.raises(KeyError) as info:
                await deck.run(fn)
            return first, info.value

    first, err = run_virtual(main())
    assert first == "JYA6"  # the study preset's first key
    assert err is boom  # the very same exception object
    assert len(calls) == 2  # a non-rate-limit error is not retried


def test_rate_limits_are_retried_behind_the_gate_and_siblings_wait_too():
    loop_times = []
    state = {"limited_until": None}

    async def fn(secret):
        now = asyncio.get_running_loop().time()
        loop_times.append((secret, now))
        if state["limited_until"] is None:
            state["limited_until"] = now + 2.0
            raise Slow(2.0)
        return "ok"

    async def main():
        c = load_config(
            preset="study", overrides={"keys": {"secrets": ["ONLY-KEY-1234567"]}, "engine": {"ttl_s": 60.0}}
        )
        async with RateDeck(c, delay_error=lambda e: e.delay if isinstance(e, Slow) else None) as deck:
            return await asyncio.gather(*(deck.run(fn) for _ in range(5)))

    results = run_virtual(main())
    assert results == ["ok"] * 5
    first = loop_times[0][1]
    # after the rejection, nothing on that key until the 2 s delay has passed
    assert all(t >= first + 2.0 for _, t in loop_times[1:] if t > first + 0.06)


def test_a_rate_limit_that_never_ends_gives_up_after_max_attempts():
    async def fn(secret):
        raise Slow(0.1)

    async def main():
        async with RateDeck(cfg(max_attempts=3), delay_error=lambda e: 0.1) as deck:
            with pytest.raises(RateLimited, match="3 attempts"):
                await deck.run(fn)

    run_virtual(main())


async def _simulator(settings=None):
    return await start_server(settings or study_settings())


def test_http_calls_against_a_simulator_on_loopback():
    async def main():
        server = await _simulator()
        c = load_config(preset="study", overrides={"target": {"url": f"{server.url}/api/request"}})
        async with RateDeck(c) as deck:
            responses = await asyncio.gather(*(deck.call({"note": i}) for i in range(12)))
            snap = deck.snapshot()
        await server.close()
        return responses, snap

    responses, snap = asyncio.run(main())
    assert [r.status for r in responses] == [200] * 12
    assert responses[0].json()["status"] == "OK"
    assert snap.succeeded == 12 and snap.rejected_429 == 0


def test_an_http_error_answer_reaches_the_caller_as_call_failed():
    async def main():
        # The embedded seed server knows only its five keys: this one is refused with 401.
        server = await _simulator()
        c = load_config(
            preset="study",
            overrides={
                "keys": {"secrets": ["NOT-A-VALID-KEY-123"]},
                "target": {"url": f"{server.url}/api/request"},
            },
        )
        async with RateDeck(c) as deck:
            with pytest.raises(CallFailed) as info:
                await deck.call()
        await server.close()
        return info.value

    err = asyncio.run(main())
    assert err.response.status == 401
    assert "NOT-A-VALID-KEY" not in str(err)


def test_a_cancelled_call_is_never_sent_and_ends_as_shed():
    sent = []

    async def fn(secret):
        sent.append(secret)
        return "ok"

    async def main():
        c = load_config(
            preset="study", overrides={"keys": {"secrets": ["ONLY-KEY-1234567"]}, "engine": {"ttl_s": 60.0}}
        )
        async with RateDeck(c, delay_error=lambda e: None) as deck:
            first = [asyncio.ensure_future(deck.run(fn)) for _ in range(30)]  # more than 20/1s
            await asyncio.sleep(0.5)
            late = first[25]
            late.cancel()
            done = await asyncio.gather(*first, return_exceptions=True)
            return done, deck.snapshot()

    done, snap = run_virtual(main())
    assert isinstance(done[25], asyncio.CancelledError)
    assert done.count("ok") == 29 and len(sent) == 29
    assert snap.shed == 1 and snap.balance() == 0
