"""The client's own cost in the headless lines and the report: the loop's lag as p50/p99, the
CPU per answer, and one line (one report field) when the client, not the server, is the limit."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys

import pytest
from aiohttp import web

from ratedeck.core.vocab import Phase
from ratedeck.engine.snapshot import LatencySummary, LoopLag, Snapshot
from ratedeck.runner.client_cost import CLIENT_IS_THE_LIMIT
from ratedeck.runner.headless import metrics_block, summary_lines
from ratedeck.runner.report import build_report
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
RUN = LatencySummary(mean=0.6, p50=0.5, p99=4.2, max=18.0, count=1_200)


def _snap(**kw) -> Snapshot:
    """A run 120 s in: 41,000 answers for 1.7 s of CPU on uvloop, a quiet loop."""
    base = dict(
        elapsed_s=120.0,
        sent=41_010,
        in_flight=10,
        cpu_s=1.7,
        loop="uvloop",
        loop_lag_ms=12.0,
        lag=LoopLag(p50_ms=0.24, p99_ms=3.1, run=RUN, core_share=0.02, run_core_share=0.014),
    )
    base.update(kw)
    return Snapshot(**base)


def _client(lines: list[str]) -> list[str]:
    at = next(i for i, line in enumerate(lines) if line.startswith("client "))
    return [lines[at], *(line for line in lines[at + 1 :] if CLIENT_IS_THE_LIMIT in line)]


def test_the_client_line_gives_the_loop_s_lag_as_p50_and_p99():
    lines = _client(metrics_block(_snap()))
    assert lines == [
        "client       cpu 41 µs per answered request (1.7 s in 1 process on uvloop, 1% of a core)"
        "  loop late p50 0.2 ms p99 3.1 ms, up to 12 ms"
    ]
    assert not [line for line in metrics_block(Snapshot()) if line.startswith("client")]  # nothing answered


def test_one_line_says_when_the_client_is_the_limit_and_what_to_try():
    bound = _snap(lag=LoopLag(p50_ms=4.0, p99_ms=25.0, limit="loop late p99 25 ms, 97% of a core busy"))
    block = metrics_block(bound)
    said = [line for line in block if CLIENT_IS_THE_LIMIT in line]
    assert said == [
        "             the client, not the server, is the limit: loop late p99 25 ms, 97% of a core busy;"
        " try --procs auto (an engine process per core)"
    ]
    assert block.index(said[0]) == block.index(_client(block)[0]) + 1  # right under the client line
    several = [
        line
        for line in metrics_block(dataclasses.replace(bound, procs=2, loop="asyncio"))
        if CLIENT_IS_THE_LIMIT in line
    ]
    assert several[0].endswith(
        "try more --procs if cores are idle, or uvloop (a quarter less CPU per request)"
    )


def test_a_gateway_s_verdict_names_no_flag_it_does_not_take():
    """A gateway runs one engine and takes no --procs: its lines never name it (a run's do)."""
    from ratedeck.engine.snapshot import ClientView

    lag = LoopLag(p50_ms=4.0, p99_ms=25.0, limit="loop late p99 25 ms, 97% of a core busy")
    gateway = _snap(lag=lag, clients=ClientView(answered=400))
    said = [line for line in metrics_block(gateway) if CLIENT_IS_THE_LIMIT in line]
    assert said == [f"             {CLIENT_IS_THE_LIMIT}: loop late p99 25 ms, 97% of a core busy"]
    on_asyncio = metrics_block(dataclasses.replace(gateway, loop="asyncio"))
    said = [line for line in on_asyncio if CLIENT_IS_THE_LIMIT in line]
    assert said[0].endswith("; try uvloop (a quarter less CPU per request)")
    stopped = dataclasses.replace(gateway, phase=Phase.STOPPED, lag=dataclasses.replace(lag, run_limit="x"))
    for block in (metrics_block(gateway), on_asyncio, summary_lines(stopped)):
        assert not [line for line in block if "--procs" in line], block


def test_the_final_summary_gives_the_whole_run_s_figures_and_verdict():
    # The last minute was quiet; over the whole run the loop was late: the summary says the run's.
    lag = LoopLag(
        p50_ms=0.2,
        p99_ms=0.4,
        run=dataclasses.replace(RUN, p99=31.0, max=80.0),
        run_limit="loop late p99 31 ms",
    )
    stopped = _snap(phase=Phase.STOPPED, lag=lag)
    lines = _client(summary_lines(stopped))
    assert lines[0].endswith("loop late p50 0.5 ms p99 31 ms, up to 80 ms")
    assert lines[1].strip().startswith(f"{CLIENT_IS_THE_LIMIT}: loop late p99 31 ms;")
    running = _client(metrics_block(dataclasses.replace(stopped, phase=Phase.RUNNING)))
    assert running == [running[0]] and running[0].endswith("p50 0.2 ms p99 0.4 ms, up to 12 ms")


def test_the_report_s_loop_section():
    report = build_report(_snap(phase=Phase.STOPPED))
    assert validate(report) == []
    assert report["loop"] == {
        "lag_p50_ms": 0.5,
        "lag_p99_ms": 4.2,
        "lag_max_ms": 18.0,
        "ticks": 1_200,
        "cpu_s": 1.7,
        "cpu_us_per_request": 41.5,
        "core_share": 0.014,
        "client_is_the_limit": False,
        "why": None,
    }
    bound = build_report(_snap(lag=LoopLag(run=RUN, run_core_share=0.96, run_limit="96% of a core busy")))
    assert validate(bound) == []
    assert bound["loop"]["client_is_the_limit"] is True and bound["loop"]["why"] == "96% of a core busy"
    assert build_report(Snapshot())["loop"]["cpu_us_per_request"] is None  # nothing answered yet


def test_a_run_can_fail_when_the_client_was_the_limit():
    """`--fail-on loop.client_is_the_limit==true` (the schema names the field: no list to keep)."""
    from ratedeck.runner.thresholds import evaluate, parse

    checks = [parse("loop.client_is_the_limit==true"), parse("loop.lag_p99_ms>20")]
    quiet = build_report(_snap(phase=Phase.STOPPED))
    bound = build_report(
        _snap(lag=LoopLag(run=dataclasses.replace(RUN, p99=31.0), run_limit="loop late p99 31 ms"))
    )
    assert [v.failed for v in evaluate(checks, quiet)] == [False, False]
    assert [v.failed for v in evaluate(checks, bound)] == [True, True]


def test_the_client_line_says_when_the_embedded_simulator_s_cpu_is_in_it():
    line = _client(metrics_block(_snap(cpu_with="the embedded simulator")))[0]
    assert "(1.7 s in 1 process on uvloop, 1% of a core; the embedded simulator included)" in line


def test_the_report_says_so_too():
    with_sim, alone = _snap(cpu_with="the embedded simulator"), _snap()
    report, plain = build_report(with_sim), build_report(alone)
    assert validate(report) == [] and validate(plain) == []
    assert report["client"]["cpu_with"] == "the embedded simulator" and plain["client"]["cpu_with"] is None


@pytest.mark.slow
def test_a_run_on_the_embedded_simulator_says_its_cpu_is_counted_and_one_on_a_target_does_not(tmp_path):
    """The simulator answers on the engine's own loop, so the process's CPU is both of theirs:
    the line says so, for a newcomer's first run. A run on a target of its own has no such words."""

    async def scenario() -> tuple[str, str]:
        async def answer(_request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))

        async def cli(*argv: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                *RATEDECK, "--no-ui", "--duration", "1", *argv, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, cwd=tmp_path, env=env,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode == 0, out.decode()
            return out.decode()

        try:
            own = await cli()
            target = await cli(
                "--target", f"http://127.0.0.1:{port}/api", "--keys", "k-0123456789", "--limit", "20/1s"
            )
        finally:
            await runner.cleanup()
        return own, target

    own, target = asyncio.run(asyncio.wait_for(scenario(), 60))
    client = [line for line in own.splitlines() if line.startswith("client ")]
    assert client and all("; the embedded simulator included)" in line for line in client)
    client = [line for line in target.splitlines() if line.startswith("client ")]
    assert client and not any("simulator" in line for line in client)
