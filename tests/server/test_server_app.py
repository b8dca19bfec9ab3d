"""The aiohttp app on a real socket (127.0.0.1, port 0), with recorded sleeps."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp

from ratedeck.core.policy import parse_policy
from ratedeck.server.app import start_server
from ratedeck.server.settings import STUDY_KEYS, ServerSettings, study_settings

KEY = STUDY_KEYS[0]
TIMEOUT = aiohttp.ClientTimeout(total=5)


class FakeTime:
    """A clock that only moves when the app sleeps, logging sleeps and clock reads in order."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000.0
        self.events: list[tuple[str, float]] = []

    async def sleep(self, seconds: float) -> None:
        self.events.append(("sleep", seconds))
        self.now_ms += seconds * 1000.0

    def clock_ms(self) -> float:
        self.events.append(("clock", self.now_ms))
        return self.now_ms


def zero_latency(settings: ServerSettings) -> ServerSettings:
    return replace(settings, latency_in_ms=(0, 0), latency_out_ms=(0, 0))


def run_against(settings: ServerSettings, scenario, fake: FakeTime | None = None):
    """Start a server, run `scenario(session, server)`, close everything, return its result."""

    async def main():
        kwargs = {"sleep": fake.sleep, "clock_ms": fake.clock_ms} if fake else {}
        server = await start_server(settings, "127.0.0.1", 0, reset_token="test-token", **kwargs)
        try:
            async with aiohttp.ClientSession(server.url, timeout=TIMEOUT) as session:
                return await scenario(session, server)
        finally:
            await server.close()

    return asyncio.run(main())


async def get(session: aiohttp.ClientSession, **params) -> tuple[int, dict, dict]:
    async with session.get("/api/request", params=params) as response:
        return response.status, await response.json(), dict(response.headers)


def test_unknown_key_is_answered_before_the_incoming_latency():
    fake = FakeTime()
    settings = replace(study_settings(), latency_in_ms=(30, 30), latency_out_ms=(7, 7))

    async def scenario(session, server):
        return await get(session, api_key="nope", nonce="1", req_id="r")

    status, body, _ = run_against(settings, scenario, fake)
    assert status == 401
    assert body == {"status": "error", "error_msg": "invalid api key"}
    assert fake.events == [("sleep", 0.007)]  # outgoing only, and no decision time taken


def test_decision_time_is_taken_after_the_incoming_latency():
    fake = FakeTime()
    settings = replace(study_settings(), latency_in_ms=(30, 30), latency_out_ms=(7, 7))

    async def scenario(session, server):
        return await get(session, api_key=KEY, nonce="1", req_id="r-1")

    status, body, _ = run_against(settings, scenario, fake)
    assert (status, body) == (200, {"status": "OK", "req_id": "r-1"})
    assert fake.events == [("sleep", 0.030), ("clock", 1_000_030.0), ("sleep", 0.007)]


def test_latency_is_drawn_within_the_configured_range():
    fake = FakeTime()
    settings = replace(
        study_settings(),
        latency_in_ms=(3, 9),
        latency_out_ms=(0, 0),
        policies=(parse_policy("1000/1s"),),
        seed=5,
    )

    async def scenario(session, server):
        for nonce in range(1, 41):
            await get(session, api_key=KEY, nonce=str(nonce))

    run_against(settings, scenario, fake)
    sleeps = [value for kind, value in fake.events if kind == "sleep"]
    assert len(sleeps) == 40
    assert {round(s * 1000) for s in sleeps} <= set(range(3, 10))
    assert len(set(sleeps)) > 1


def test_zero_latency_does_not_sleep():
    fake = FakeTime()

    async def scenario(session, server):
        return await get(session, api_key=KEY, nonce="1")

    status, _, _ = run_against(zero_latency(study_settings()), scenario, fake)
    assert status == 200
    assert [kind for kind, _ in fake.events] == ["clock"]


def test_seed_answers_over_http_with_the_real_clock():
    async def scenario(session, server):
        answers = [await get(session, api_key=KEY, nonce=str(n), req_id=str(n)) for n in range(1, 22)]
        answers.append(await get(session, api_key=STUDY_KEYS[1], nonce="1"))
        answers.append(await get(session, api_key=STUDY_KEYS[1], nonce="1"))
        return answers

    answers = run_against(zero_latency(study_settings()), scenario)
    assert [a[0] for a in answers[:20]] == [200] * 20
    assert answers[19][1] == {"status": "OK", "req_id": "20"}
    # Twenty-one requests within far less than a second: the last is over the limit.
    assert answers[20][:2] == (429, {"status": "error", "error_msg": "exceeded rate limit"})
    assert "Retry-After" not in answers[20][2]
    assert answers[22][:2] == (400, {"status": "error", "error_msg": "invalid nonce"})


def test_form_bodies_are_accepted_on_post_and_get():
    async def scenario(session, server):
        results = []
        async with session.post(
            "/api/request", data={"api_key": KEY, "nonce": "5", "req_id": "posted"}
        ) as response:
            results.append((response.status, await response.json()))
        async with session.get(
            "/api/request", data={"api_key": KEY, "nonce": "6", "req_id": "got"}
        ) as response:
            results.append((response.status, await response.json()))
        # The query string wins over the form, as in the study's Flask server.
        async with session.post(
            "/api/request?req_id=from-query", data={"api_key": KEY, "nonce": "7", "req_id": "form"}
        ) as response:
            results.append((response.status, await response.json()))
        return results

    results = run_against(zero_latency(study_settings()), scenario)
    assert results == [
        (200, {"status": "OK", "req_id": "posted"}),
        (200, {"status": "OK", "req_id": "got"}),
        (200, {"status": "OK", "req_id": "from-query"}),
    ]


def test_standard_mode_sends_retry_after_and_ratelimit_headers():
    settings = zero_latency(ServerSettings(policies=(parse_policy("1/1m"),), seed=1))

    async def scenario(session, server):
        first = await get(session, api_key="key-000")
        second = await get(session, api_key="key-000")
        return first, second

    first, second = run_against(settings, scenario)
    assert first[0] == 200
    assert first[2]["RateLimit-Policy"] == '"1/1m";q=1;w=60'
    assert first[2]["X-RateLimit-Remaining"] == "0"
    assert second[0] == 429
    assert second[2]["Retry-After"] == "60"


def test_stats_and_reset():
    async def scenario(session, server):
        await get(session, api_key=KEY, nonce="1")
        await get(session, api_key=KEY, nonce="1")
        await get(session, api_key="nope")
        async with session.get("/stats") as response:
            stats_before = await response.json()
            stats_text = await response.text()
        async with session.post("/reset") as response:
            assert response.status == 403  # the token is needed
        async with session.post("/reset", headers={"X-Reset-Token": server.reset_token}) as response:
            reset_status = response.status
        again = await get(session, api_key=KEY, nonce="1")
        async with session.get("/stats") as response:
            stats_after = await response.json()
        return stats_before, stats_text, reset_status, again, stats_after

    before, text, reset_status, again, after = run_against(zero_latency(study_settings()), scenario)
    assert before["totals"]["ok"] == 1
    assert before["totals"]["rejected_nonce"] == 1
    assert before["host"]["unknown_key"] == 1
    assert before["keys"][0]["key"] == "…JYA6"
    assert all(key not in text for key in STUDY_KEYS)
    assert reset_status == 200
    assert again[0] == 200  # nonce 1 is fresh again after the reset
    assert after["totals"]["requests"] == 1


def test_running_server_exposes_url_port_and_rules():
    async def scenario(session, server):
        assert server.url == f"http://127.0.0.1:{server.port}"
        await get(session, api_key=KEY, nonce="1")
        return server.rules.stats()["totals"]["ok"]

    assert run_against(zero_latency(study_settings()), scenario) == 1


def test_standard_mode_takes_a_bearer_key_as_a_named_target_sends_it():
    import aiohttp

    from ratedeck.server.app import start_server

    async def main():
        settings = ServerSettings(
            mode="standard", keys=("k-000000001",), latency_in_ms=(0, 0), latency_out_ms=(0, 0)
        )
        server = await start_server(settings)
        try:
            async with aiohttp.ClientSession() as session:
                url = f"{server.url}/api/request"
                async with session.get(url, headers={"Authorization": "Bearer k-000000001"}) as ok:
                    bearer = ok.status
                async with session.get(url, headers={"Authorization": "Bearer nope"}) as bad:
                    unknown = bad.status
        finally:
            await server.close()
        return bearer, unknown

    assert asyncio.run(main()) == (200, 401)
