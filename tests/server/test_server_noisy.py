"""The simulator's noisy-server parts: processing time, Server-Timing, /health,
the sustained share in /stats, and the options that turn them on."""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace

import aiohttp
import pytest

from ratedeck.core.policy import Policy
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec
from ratedeck.server.app import start_server
from ratedeck.server.rules import SHARE_WARMUP_S, RateRules
from ratedeck.server.serve import add_serve_arguments, run_serve, settings_from_args
from ratedeck.server.settings import ServerSettings, standard_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual

TIMEOUT = aiohttp.ClientTimeout(total=5)


class FakeTime:
    """A clock that only moves when the app sleeps; logs every sleep."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds * 1000.0, 6))
        self.now_ms += seconds * 1000.0

    def clock_ms(self) -> float:
        return self.now_ms


def noisy(**changes) -> ServerSettings:
    base = replace(
        standard_settings(),
        keys=("key-a", "key-b"),
        latency_in_ms=(7, 7),
        latency_out_ms=(3, 3),
        processing_ms=(40, 40),
        server_timing=True,
        health=True,
        seed=1,
    )
    return replace(base, **changes)


def serve(settings: ServerSettings, scenario, fake: FakeTime | None = None):
    async def main():
        kwargs = {"sleep": fake.sleep, "clock_ms": fake.clock_ms} if fake else {}
        server = await start_server(settings, "127.0.0.1", 0, **kwargs)
        try:
            async with aiohttp.ClientSession(server.url, timeout=TIMEOUT) as session:
                return await scenario(session, server)
        finally:
            await server.close()

    return asyncio.run(main())


def test_processing_sits_between_the_stamp_and_the_answer_and_server_timing_reports_it():
    fake = FakeTime()

    async def scenario(session, server):
        async with session.get("/api/request", params={"api_key": "key-a"}) as r:
            return r.status, dict(r.headers), fake.sleeps[:]

    status, headers, sleeps = serve(noisy(), scenario, fake)
    assert status == 200
    assert sleeps == [7.0, 40.0, 3.0]  # way in, server time, way back
    assert headers["Server-Timing"] == "app;dur=40.0"  # stamp to answer, measured


def test_a_rejection_is_answered_without_processing():
    fake = FakeTime()
    settings = noisy(policies=(Policy(1, 1.0),))

    async def scenario(session, server):
        for _ in range(2):
            async with session.get("/api/request", params={"api_key": "key-a"}) as r:
                last = (r.status, dict(r.headers))
        return last, fake.sleeps[:]

    (status, headers), sleeps = serve(settings, scenario, fake)
    assert status == 429
    assert sleeps == [7.0, 40.0, 3.0, 7.0, 3.0]
    assert headers["Server-Timing"] == "app;dur=0.0"


def test_hints_are_off_by_default():
    settings = standard_settings()
    assert settings.processing_ms == (0, 0)
    assert not settings.server_timing and not settings.health

    async def scenario(session, server):
        async with session.get("/api/request", params={"api_key": settings.keys[0]}) as r:
            headers = dict(r.headers)
        async with session.get("/health") as r:
            return headers, r.status

    headers, health = serve(replace(settings, latency_in_ms=(0, 0), latency_out_ms=(0, 0)), scenario)
    assert "Server-Timing" not in headers
    assert health == 404


def test_health_costs_nothing_against_any_limit():
    fake = FakeTime()
    settings = noisy(policies=(Policy(1, 1.0),))

    async def scenario(session, server):
        for _ in range(5):
            async with session.get("/health") as r:
                assert r.status == 200 and (await r.json()) == {"status": "OK"}
        async with session.get("/api/request", params={"api_key": "key-a"}) as r:
            status = r.status
        return status, server.rules.stats()["totals"], fake.sleeps[:]

    status, totals, sleeps = serve(settings, scenario, fake)
    assert status == 200  # five probes did not spend the one slot
    assert totals["requests"] == 1 and totals["accepted"] == 1
    assert sleeps[:10] == [7.0, 3.0] * 5  # the network's delays, no processing


def test_sustained_share_is_the_window_over_the_mean_gap_of_n_arrivals():
    rules = RateRules(replace(standard_settings(), keys=("k",), policies=(Policy(10, 1.0),)))
    t = 0.0
    while t < 20_000.0:  # 10 per 1.05 s: a share of 1/1.05
        assert rules.decide("k", None, t).status == 200
        t += 105.0
    share = rules.share()
    assert share["sustained"] == pytest.approx(1 / 1.05, abs=1e-3)
    assert share["all"] == pytest.approx(1 / 1.05, abs=1e-3)
    assert share["warmup_s"] == SHARE_WARMUP_S
    # the first seconds of accepts are left out of the sustained share only
    n = 10
    early = sum(1 for i in range(int(20_000 / 105) + 1) if i >= n and (i - n) * 105.0 < SHARE_WARMUP_S * 1000)
    assert rules.stats()["share"]["pairs"] == int(20_000 / 105) + 1 - n - early


def test_share_is_none_before_a_pair_and_ignores_rejections():
    rules = RateRules(replace(standard_settings(), keys=("k",), policies=(Policy(2, 1.0),)))
    assert rules.share()["sustained"] is None
    rules.decide("k", None, 0.0)
    rules.decide("k", None, 1.0)
    assert rules.decide("k", None, 2.0).status == 429
    assert rules.share()["all"] is None  # a rejection is no arrival
    stats = rules.stats(arrivals=True)  # but its stamp is kept apart, where it fell
    assert stats["arrivals_ms"] == [[0.0, 1.0]] and stats["rejected_ms"] == [[2.0]]


def test_simulated_transport_plays_processing_server_timing_and_health_on_virtual_time():
    settings = noisy(ratelimit_headers=True)
    transport = SimulatedTransport(settings, seed=3)
    key = KeySpec("k1", "key-a", settings.policies)

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await transport.send(key, Request(1, 0.0, 99.0), None)
        t1 = loop.time()
        status = await transport.probe()
        return out, t1 - t0, loop.time() - t1, status

    out, rtt, probe_rtt, status = run_virtual(main())
    assert out.status == 200
    assert rtt == pytest.approx(0.050)
    assert out.server_time_s == pytest.approx(0.040)
    assert out.remaining == 19
    assert probe_rtt == pytest.approx(0.010) and status == 200 and transport.probes == 1


def test_a_stall_of_the_client_process_does_not_move_the_simulated_server_s_stamp():
    """The in-process server stamps an arrival when the network delivered it, as a server of its
    own would: a client stalled while its request is on the way is late to read the answer, not
    counted later (which made a burst's arrivals land in the next one's window: 429s the client
    could not have known of, seen in CI under load)."""
    settings = noisy(latency_in_ms=(20, 20), latency_out_ms=(0, 0), processing_ms=(0, 0))
    transport = SimulatedTransport(settings, seed=3)
    key = KeySpec("k1", "key-a", settings.policies)

    async def main():
        loop = asyncio.get_running_loop()
        sent = loop.time()
        task = asyncio.ensure_future(transport.send(key, Request(1, 0.0, 99.0), None))
        await asyncio.sleep(0)  # the send starts: its 20 ms leg is on the way
        time.sleep(0.25)  # the process stalls past the arrival (this is the case itself, not a wait)
        out = await task
        return sent, out

    sent, out = asyncio.run(main())
    (stamp_ms,) = transport.rules.arrivals_ms()[0]
    assert out.status == 200 and out.latency_s >= 0.25  # the answer is read late
    assert stamp_ms / 1000.0 - sent == pytest.approx(0.020, abs=0.005)  # the arrival is not


class _StallsWhileServing(SimulatedTransport):
    """This process stalls 250 ms while the in-process server takes its 40 ms."""

    async def _delay(self, bounds, extra):
        drawn = await super()._delay(bounds, extra)
        if bounds == self.settings.processing_ms:
            time.sleep(0.25)  # the case itself: a stall of the process, not a wait for a result
        return drawn


def test_a_stall_of_the_client_process_is_not_told_as_the_server_s_time():
    """`Server-Timing` says the server's own time: a stall of the (client's) process while the
    in-process server works is the client's, on the way out, as it would be with a server of
    its own; told as server time it would hide a slow way back from the headroom."""
    settings = noisy(latency_in_ms=(20, 20), latency_out_ms=(0, 0), processing_ms=(40, 40))
    transport = _StallsWhileServing(settings, seed=3)
    out = asyncio.run(transport.send(KeySpec("k1", "key-a", settings.policies), Request(1, 0.0, 99.0), None))
    assert out.status == 200 and out.latency_s >= 0.25
    assert out.server_time_s == pytest.approx(0.040)


def test_simulated_transport_can_send_nonsense_hints():
    transport = SimulatedTransport(noisy(), seed=3, timing_hint=lambda ms: "app;dur=-5")
    out = run_virtual(transport.send(KeySpec("k1", "key-a", (Policy(20, 1.0),)), Request(1, 0.0, 9.0), None))
    assert out.server_time_s is None  # unusable: the parser drops it


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_serve_options_for_noisy_servers():
    settings = settings_from_args(
        parse(
            "--mode",
            "standard",
            "--latency",
            "5:45",
            "--latency-out",
            "1:2",
            "--processing",
            "20:80",
            "--server-timing",
            "--health",
        )
    )
    assert settings.latency_in_ms == (5, 45) and settings.latency_out_ms == (1, 2)
    assert settings.processing_ms == (20, 80)
    assert settings.server_timing and settings.health
    assert ServerSettings.from_dict(settings.to_dict()) == settings


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--processing=-5:10"], "--processing"),
        (["--processing", "-5"], "--processing"),
        (["--processing", "80:20"], "--processing"),
        (["--processing", "a:b"], "--processing"),
        (["--latency-in=-1:3"], "--latency-in"),
    ],
)
def test_a_bad_processing_range_is_one_message_and_exit_2(argv, needle, capsys):
    assert run_serve(parse("--mode", "standard", *argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ratedeck serve: error: ") and needle in err[0]


def test_a_negative_processing_range_in_settings_names_the_field():
    with pytest.raises(ValueError, match="processing_ms"):
        ServerSettings.from_dict({"mode": "standard", "processing_ms": [-5, 10]})
