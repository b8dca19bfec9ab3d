"""`ratedeck bench --scenarios live`: the jitter proxy forwards and delays within its bounds,
and the live group is registered and opt-in."""

from __future__ import annotations

import asyncio

import pytest

from ratedeck.bench import parse_args
from ratedeck.bench.jitter import JitterProxy, parse_ms_range, release_at
from ratedeck.bench.output import ScenarioResult, cpu_ratio_line, scenario_table
from ratedeck.bench.scenarios import DEFAULT_SCENARIOS, GROUPS, SCENARIOS
from tests.bench.test_bench_noisy import serve_settings


def test_a_chunk_never_overtakes_the_one_before_it():
    assert release_at(0.0, 1.0, 0.02) == pytest.approx(1.02)
    # the previous chunk drew a long delay: this one waits for it instead of going first
    assert release_at(1.045, 1.01, 0.005) == 1.045


def test_delay_ranges_parse_in_ms_and_bad_ones_say_so():
    assert parse_ms_range("5:45") == (0.005, 0.045)
    for bad in ("5", "45:5", "a:b", "-1:3"):
        with pytest.raises(ValueError, match="--delay"):
            parse_ms_range(bad)


async def _echo_through_proxy(low_s: float, high_s: float, messages: list[bytes]):
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = JitterProxy(("127.0.0.1", port), low_s, high_s, seed=3, keep=100)
    await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    got = []
    for message in messages:
        writer.write(message)
        await writer.drain()
        got.append(await asyncio.wait_for(reader.readexactly(len(message)), 5))
    writer.close()
    await proxy.close()
    server.close()
    return got, proxy.holds


def test_the_proxy_forwards_both_ways_and_holds_each_chunk_within_its_bounds():
    low, high = 0.010, 0.020
    messages = [f"message {i}".encode() for i in range(6)]
    got, holds = asyncio.run(_echo_through_proxy(low, high, messages))
    assert got == messages
    assert len(holds) == 2 * len(messages)  # every chunk, each way
    for arrival, release, sent in holds:
        # the scheduled hold is a draw in [low, high] (one in flight at a time: no ordering wait)
        assert low <= release - arrival <= high + 1e-5
        # and the write happened no earlier than its release (stamped on the loop's clock)
        assert sent >= release - 1e-3


def test_the_live_group_is_registered_and_opt_in():
    names = GROUPS["live"]
    assert names and not set(names) & set(DEFAULT_SCENARIOS)
    assert all(not set(names) & set(group) for key, group in GROUPS.items() if key != "live")
    assert parse_args(["--scenarios", "live"]).scenarios == list(names)
    heavy = SCENARIOS["live-heavy"]
    assert heavy.capacity_tps == 5000 and heavy.jitter_ms == "5:45"
    for name in names:
        sc = SCENARIOS[name]
        assert {"aiolimiter", "ratedeck"} <= set(sc.strategies)
        assert sc.jitter_ms is not None
        # the delay is the proxy's, on real sockets: the simulator adds none of its own
        settings = serve_settings(name)
        assert settings.latency_in_ms == (0, 0) and settings.latency_out_ms == (0, 0)
    # The heavy row twice: once with no hints, once with every hint a rate-limited API sends,
    # so what reading them costs shows beside the peer that reads none.
    quiet, hinted = serve_settings("live-heavy"), serve_settings("live-heavy+hints")
    assert not quiet.ratelimit_headers and not quiet.server_timing
    assert hinted.ratelimit_headers and hinted.server_timing
    assert SCENARIOS["live-heavy+hints"].capacity_tps == heavy.capacity_tps


def test_the_table_says_ratedecks_cpu_per_accepted_request_over_the_peers():
    rows = [
        {"strategy": "aiolimiter", "cpu_us_per_ok": 200.0, "succeeded": 60_000},
        {"strategy": "ratedeck", "cpu_us_per_ok": 150.0, "succeeded": 70_000},
    ]
    line = cpu_ratio_line(rows)
    assert "0.75x" in line and "70,000 vs 60,000" in line
    assert cpu_ratio_line(rows[:1]) == ""
    base = {
        "ok_per_s": 1.0,
        "pct_capacity": 1.0,
        "rejected_429": 0,
        "rejected_nonce": 0,
        "expired": 0,
        "p50_ms": 1.0,
        "p99_ms": 1.0,
        "cpu_s": 1.0,
        "peak_rss_mb": 1.0,
    }
    result = ScenarioResult("live-heavy", "x", 5000.0, [base | r for r in rows])
    assert "0.75x" in scenario_table(result, 20.0)
