"""The gateway's own cost: the same client straight at a stub and through `ratedeck gateway`.

An opt-in scenario (`ratedeck bench --scenarios gateway`). The OpenAI stub runs
in a thread of the bench process with limits far above the load, so nothing
queues; the gateway is the real command in its own process. One client sends
small chat completions at a fixed, modest rate, first straight to the stub,
then through the gateway, and the rows say the client's latency (p50, p99),
what the gateway added, and the gateway process's CPU per proxied request
(from /proc, user + system), beside `ratedeck --no-ui` sending the same
prompts at the same rate as a run (its whole process's CPU per answer).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from ratedeck.server.stubs.openai import start_openai

from .cluster import free_port, process_cpu_s
from .output import ScenarioResult

NAME = "gateway"
SUMMARY = "OpenAI stub, 2 keys far above the load; one client at 40 req/s, 4 at once: straight, then through the gateway"
KEYS = ("sk-bench-gw-a", "sk-bench-gw-b")
TOKEN = "bench-gateway-token"
RATE = 40.0
CONCURRENCY = 4
_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 8}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _drive(url: str, headers: dict[str, str], seconds: float) -> tuple[list[float], int]:
    """Requests at RATE for `seconds`, at most CONCURRENCY at once: each answered one's latency, and errors."""
    latencies: list[float] = []
    errors = 0
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        async with gate:
            t0 = time.perf_counter()
            try:
                async with session.post(url, json=_BODY, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1

    async with aiohttp.ClientSession() as session:
        tasks = []
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            tasks.append(asyncio.create_task(one(session)))
            n += 1
            await asyncio.sleep(max(0.0, start + n / RATE - time.perf_counter()))
        await asyncio.gather(*tasks)
    return latencies, errors


def _start_gateway(target: str, port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "ratedeck.runner.cli", "gateway", "--preset", "openai", "--target", target]
    argv += [
        "--keys",
        ",".join(KEYS),
        "--listen",
        f"127.0.0.1:{port}",
        "--gateway-token",
        "env:RATEDECK_BENCH_TOKEN",
    ]
    argv += ["--no-ui", "--interval", "60"]
    env = dict(os.environ, RATEDECK_BENCH_TOKEN=TOKEN)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the gateway exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the gateway did not listen within 30 s")


def _direct_run(target: str, seconds: float, workdir: str) -> tuple[float, int]:
    """`ratedeck --no-ui` on the same prompts at the same rate: its CPU seconds and the answers it got."""
    import json

    work = os.path.join(workdir, "prompts.jsonl")
    with open(work, "w") as f:
        for i in range(int(seconds * RATE)):
            f.write(json.dumps({"_id": i, "_path": "/v1/chat/completions", "_body": _BODY}) + "\n")
    report = os.path.join(workdir, "report.json")
    argv = [sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--preset", "openai", "--target", target]
    argv += ["--keys", ",".join(KEYS), "--workload", work, "--rate", f"{RATE:g}", "--report", report]
    argv += ["--graveyard", os.path.join(workdir, "graveyard.jsonl"), "--interval", "60"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(_status)
    with open(report) as f:
        succeeded = int(json.load(f)["requests"]["succeeded"])
    return usage.ru_utime + usage.ru_stime, succeeded


def _row(strategy: str, latencies: list[float], errors: int, seconds: float) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "ok_per_s": round(len(latencies) / seconds, 2),
        "pct_capacity": 0.0,
        "rejected_429": 0,
        "errors": errors,
        "p50_ms": round(1000 * _percentile(latencies, 0.5), 2),
        "p99_ms": round(1000 * _percentile(latencies, 0.99), 2),
    }


async def _measure(seconds: float, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    stub = await start_openai(keys=KEYS, rpm=1_000_000, tpm=1_000_000_000)
    try:
        direct_headers = {"Authorization": f"Bearer {KEYS[0]}"}
        await _drive(f"{stub.url}/v1/chat/completions", direct_headers, 1.0)  # warm the connections
        progress(f"{NAME}: straight to the stub for {seconds:g} s")
        lat, err = await _drive(f"{stub.url}/v1/chat/completions", direct_headers, seconds)
        direct = _row("direct", lat, err, seconds)
        port = free_port()
        gateway = await asyncio.to_thread(_start_gateway, stub.url, port)
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {TOKEN}"}
            await _drive(url, headers, 2.0)  # each key's first answer, and warm connections
            progress(f"{NAME}: through the gateway for {seconds:g} s")
            cpu0 = process_cpu_s(gateway.pid) or 0.0
            lat, err = await _drive(url, headers, seconds)
            cpu = (process_cpu_s(gateway.pid) or cpu0) - cpu0
        finally:
            gateway.send_signal(signal.SIGTERM)
            await asyncio.to_thread(gateway.wait, 30)
        through = _row("gateway", lat, err, seconds)
        through["added_p50_ms"] = round(through["p50_ms"] - direct["p50_ms"], 2)
        through["added_p99_ms"] = round(through["p99_ms"] - direct["p99_ms"], 2)
        through["gateway_cpu_us_per_req"] = round(1e6 * cpu / max(1, len(lat) + err), 1)
        progress(f"{NAME}: ratedeck --no-ui on the same prompts at the same rate")
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ratedeck-bench-gw-") as tmp:
            run_cpu, run_ok = await asyncio.to_thread(_direct_run, stub.url, seconds, tmp)
        run = {"strategy": "ratedeck", "ok_per_s": round(run_ok / seconds, 2), "pct_capacity": 0.0}
        run |= {"rejected_429": 0, "errors": 0, "p50_ms": "-", "p99_ms": "-"}
        run["gateway_cpu_us_per_req"] = round(1e6 * run_cpu / max(1, run_ok), 1)
        return [direct, through, run]
    finally:
        await stub.close()


def run_gateway(duration_s: float, progress: Callable[[str], None]) -> ScenarioResult:
    """The scenario's two rows: straight to the stub, then through the gateway."""
    result = ScenarioResult(NAME, SUMMARY, RATE)
    result.rows.extend(asyncio.run(_measure(duration_s, progress)))
    return result


def gateway_table(result: ScenarioResult) -> str:
    head = f"{'strategy':<10}{'ok/s':>8}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'added p99':>11}{'CPU µs/req':>11}"
    lines = [f"{result.name}: {result.summary}", head, "-" * len(head)]
    for r in result.rows:
        lines.append(
            f"{r['strategy']:<10}{r['ok_per_s']:>8}{r['errors']:>8}{r['p50_ms']:>9}{r['p99_ms']:>9}"
            f"{r.get('added_p50_ms', '-'):>11}{r.get('added_p99_ms', '-'):>11}"
            f"{r.get('gateway_cpu_us_per_req', '-'):>11}"
        )
    return "\n".join(lines)
