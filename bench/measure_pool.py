"""Measure one pool over many endpoints (issue 41's "Done when") on the Azure and OpenAI stubs, through the real CLI.

    .venv/bin/python -m ratedeck.bench.measure_pool batch                 # 1,200 Batch lines, ~3 min
    .venv/bin/python -m ratedeck.bench.measure_pool failover              # the same, "east" refuses a third in
    .venv/bin/python -m ratedeck.bench.measure_pool failover --dark hang  # ... or accepts and answers nothing
    .venv/bin/python -m ratedeck.bench.measure_pool failover --dark-at-s 60  # dark a third of the makespan in
    .venv/bin/python -m ratedeck.bench.measure_pool gateway --seconds 90  # `ratedeck gateway`, the openai SDK

The pool: two Azure resources (`start_azure`, deployment `mini` serving `gpt-4o-mini`, 20,000
and 40,000 TPM, told in `models`; RPM as Azure derives it, 6 per 1,000 TPM over 10 s windows)
and one OpenAI key (`start_openai`, 60,000 TPM and 500 RPM, sent in its x-ratelimit-* headers,
nothing told), one `[[endpoints]]` config, real (60 s) minutes. Every line asks the same
tokens (an 800-character prompt + max_tokens 200 = 400 as both stubs count), so 1,200 lines
are the pool's full buckets (120,000) plus three minutes of its refill (360,000).

What is printed comes from the stubs' ledgers and the run's own files: the exit code, the
output lines (`--results` and `--errors`, the Batch API's output format) by status, whether
every custom_id is there exactly once, 429s per endpoint (with when they came, seconds after
the first arrival), tokens charged against the combined capacity (each endpoint's full bucket
at the first arrival at any stub plus its refill until the last arrival at any stub; in
failover the dark endpoint's capacity ends when it went dark), and the CPU of the ratedeck
process (its rusage) per request. Then one JSON line with the numbers.

"A third of the way in" is by lines written (400 of 1,200) unless `--dark-at-s` says a time:
as the buckets start full, 400 lines end about 30 s into a ~3.5 min run; `--dark-at-s 60` is a
third of the makespan instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratedeck.bench.cluster import free_port
from ratedeck.bench.measure_gateway import Seen, _drive, _openai_call
from ratedeck.server.stubs.azure import start_azure
from ratedeck.server.stubs.common import Stub
from ratedeck.server.stubs.openai import start_openai

MODEL = "gpt-4o-mini"
DEPLOYMENT = "mini"
TOKEN = "measure-pool-token"
TARGETS = {
    "batch": "<= 3 429s, share >= 0.90",
    "failover": "<= 10 not 200",
    "gateway": "0 errors, share >= 0.90, <= 3 429s",
}


@dataclass(frozen=True)
class Endpoint:
    name: str
    kind: str  # "azure" or "openai"
    tpm: int
    rpm: int | None = None  # None: Azure's 6 per 1,000 TPM (azure), told by nobody (openai: required)
    tell_rpm: bool = False  # write rpm into the config's `models` table (azure)


@dataclass(frozen=True)
class PoolSpec:
    endpoints: tuple[Endpoint, ...] = (
        Endpoint("east", "azure", 20_000),
        Endpoint("west", "azure", 40_000),
        Endpoint("openai", "openai", 60_000, rpm=500),
    )
    latency: float = 0.3

    @property
    def tpm(self) -> int:
        return sum(e.tpm for e in self.endpoints)


@dataclass
class Running:
    """The stubs of a pool, by endpoint name, and the config that lists them."""

    spec: PoolSpec
    stubs: dict[str, Stub]
    keys: dict[str, list[str]]
    dark_at: dict[str, float] = field(default_factory=dict)  # endpoint -> when it went dark (stub clock)

    def toml(self) -> str:
        parts = []
        for e in self.spec.endpoints:
            preset = "azure-openai" if e.kind == "azure" else "openai"
            text = (
                f'[[endpoints]]\nname = "{e.name}"\npreset = "{preset}"\nurl = "{self.stubs[e.name].url}"\n'
            )
            keys = self.keys[e.name][:1]  # an Azure resource's two keys share its quota: one is told
            text += f"keys = {json.dumps(keys)}\n"
            if e.kind == "azure":
                rpm = f", rpm = {e.rpm}" if e.tell_rpm and e.rpm else ""
                text += f'models = {{ "{MODEL}" = {{ deployment = "{DEPLOYMENT}", tpm = {e.tpm}{rpm} }} }}\n'
            parts.append(text)
        return "\n".join(parts)

    async def go_dark(self, name: str, how: str) -> None:
        stub = self.stubs[name]
        self.dark_at[name] = stub.now()
        await stub.state.go_dark(how)


@contextlib.asynccontextmanager
async def pool(spec: PoolSpec):
    """Start every endpoint's stub; close them all at the end."""
    async with contextlib.AsyncExitStack() as stack:
        stubs: dict[str, Stub] = {}
        keys: dict[str, list[str]] = {}
        for e in spec.endpoints:
            if e.kind == "azure":
                keys[e.name] = [f"{e.name}-key1-0123456789abcdef", f"{e.name}-key2-0123456789abcdef"]
                dep: dict[str, Any] = {"model": MODEL, "tpm": e.tpm}
                if e.rpm:
                    dep["rpm"] = e.rpm
                stub = await start_azure(
                    keys=keys[e.name], deployments={DEPLOYMENT: dep}, latency=spec.latency
                )
            else:
                keys[e.name] = [f"sk-proj-{e.name}-000000000000000001"]
                stub = await start_openai(
                    keys=keys[e.name], rpm=e.rpm or 500, tpm=e.tpm, latency=spec.latency
                )
            stubs[e.name] = await stack.enter_async_context(stub)
        yield Running(spec, stubs, keys)


def batch_lines(n: int, prompt_chars: int = 800, max_tokens: int = 200) -> list[dict]:
    """`n` OpenAI Batch lines for gpt-4o-mini, each prompt_chars/4 + max_tokens tokens, each prompt its own."""
    lines = []
    for i in range(n):
        head = f"#{i} "
        text = head + ("rate limits hold " * (prompt_chars // 17 + 1))[: prompt_chars - len(head)]
        body = {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
        lines.append(
            {"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    return lines


def ledgers(run: Running) -> dict[str, Any]:
    """Per endpoint: tokens charged (answered), 429s and when; the combined capacity over the window
    from the first arrival at any stub to the last arrival at any stub."""
    arrivals = [t for s in run.stubs.values() for t in s.ledger.arrivals()]
    if not arrivals:
        return {"used": 0.0, "capacity": 0.0, "share": 0.0, "rate_429": 0, "window_s": 0.0, "endpoints": {}}
    start, end = min(arrivals), max(arrivals)
    rows: dict[str, Any] = {}
    for e in run.spec.endpoints:
        stub = run.stubs[e.name]
        until = min(end, run.dark_at.get(e.name, end))
        if e.kind == "azure":
            capacity = stub.allowed_capacity(start, until, bucket=DEPLOYMENT)
        else:
            capacity = sum(stub.allowed_capacity(start, until, key=k) for k in run.keys[e.name])
        refused = [r for r in stub.ledger.records if r.status == 429]
        rows[e.name] = {
            "used": stub.ledger.units(),
            "capacity": capacity,
            "ok": len(stub.ledger.accepted()),
            "rate_429": len(refused),
            "429_at_s": [round(r.at - start, 1) for r in refused[:20]],
            "outcomes": dict(stub.ledger.counts()),
        }
    used = sum(r["used"] for r in rows.values())
    capacity = sum(r["capacity"] for r in rows.values())
    return {
        "used": used,
        "capacity": capacity,
        "share": used / capacity if capacity else 0.0,
        "rate_429": sum(r["rate_429"] for r in rows.values()),
        "window_s": end - start,
        "endpoints": rows,
    }


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ratedeck.runner.cli", *args]


def _count_lines(*paths: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


async def _wait_with_usage(proc: subprocess.Popen) -> tuple[int, float]:
    """Reap `proc` with wait4: its exit code and its user + system CPU seconds."""
    _pid, status, usage = await asyncio.to_thread(os.wait4, proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


async def run_batch(
    spec: PoolSpec,
    lines: list[dict],
    workdir: Path,
    dark: tuple[str, str] | None = None,
    dark_after: int | None = None,
    dark_after_s: float | None = None,
) -> dict[str, Any]:
    """`ratedeck --no-ui --config pool.toml --workload batch.jsonl` on `lines`; with `dark`
    (endpoint, "refuse"|"hang") that endpoint goes dark once `dark_after` lines are written
    (a third of them by default), or with `dark_after_s` that many seconds after the start."""
    work, out, errors = workdir / "batch.jsonl", workdir / "out.jsonl", workdir / "errors.jsonl"
    work.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for p in (out, errors):
        p.unlink(missing_ok=True)
    async with pool(spec) as run:
        config = workdir / "pool.toml"
        config.write_text(run.toml())
        argv = _cli("--no-ui", "--config", str(config), "--workload", str(work))
        argv += ["--results", str(out), "--errors", str(errors), "--graveyard", ""]
        log = (workdir / "ratedeck.log").open("w")
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir
        )
        reaped = asyncio.ensure_future(_wait_with_usage(proc))
        dark_lines = None
        try:
            if dark is not None:
                after = len(lines) // 3 if dark_after is None else dark_after
                while not reaped.done() and (
                    time.monotonic() - started < dark_after_s
                    if dark_after_s is not None
                    else _count_lines(out, errors) < after
                ):
                    await asyncio.sleep(0.1)
                if not reaped.done():
                    dark_lines = _count_lines(out, errors)
                    await run.go_dark(*dark)
            code, cpu = await reaped
        finally:
            if proc.returncode is None:  # interrupted: the run must not outlive the measurement
                proc.kill()
        wall = time.monotonic() - started
        log.close()
        audit = ledgers(run)
        dark_s = None
        if dark is not None and dark[0] in run.dark_at:
            first = min(t for s in run.stubs.values() for t in s.ledger.arrivals())
            dark_s = run.dark_at[dark[0]] - first
        if dark is not None and dark[1] == "hang":
            await run.stubs[dark[0]].state.come_back()  # drop what it parked, so the stub closes
    written = [
        json.loads(x) for p in (out, errors) if p.exists() for x in p.read_text().splitlines() if x.strip()
    ]
    statuses = Counter((x.get("response") or {}).get("status_code") for x in written)
    counts = Counter(x.get("custom_id") for x in written)
    wanted = Counter(x["custom_id"] for x in lines)
    return {
        "exit": code,
        "lines": len(written),
        "statuses": {str(k): v for k, v in statuses.items()},
        "not_200": sum(v for k, v in statuses.items() if k != 200),
        "exactly_once": counts == wanted,
        "missing": sum(1 for k in wanted if k not in counts),
        "twice": sum(1 for v in counts.values() if v > 1),
        "cpu_s": cpu,
        "cpu_ms_per_request": 1000 * cpu / max(1, len(written)),
        "wall_s": wall,
        "dark": None
        if dark is None
        else {"endpoint": dark[0], "how": dark[1], "at_lines": dark_lines, "at_s": dark_s},
        "log_tail": (workdir / "ratedeck.log").read_text()[-1500:],
        **audit,
    }


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


async def run_gateway(spec: PoolSpec, seconds: float, workdir: Path, at_once: int = 40) -> dict[str, Any]:
    """`ratedeck gateway --config pool.toml`, the official openai SDK (retries off) `at_once` at a time."""
    import openai

    async with pool(spec) as run:
        config = workdir / "pool.toml"
        config.write_text(run.toml())
        port = free_port()
        argv = _cli("gateway", "--config", str(config), "--listen", f"127.0.0.1:{port}")
        argv += ["--gateway-token", "env:RATEDECK_MEASURE_POOL_TOKEN", "--no-ui", "--graveyard", ""]
        env = dict(os.environ, RATEDECK_MEASURE_POOL_TOKEN=TOKEN)
        log = (workdir / "gateway.log").open("w")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        reaped = asyncio.ensure_future(_wait_with_usage(proc))
        deadline = time.monotonic() + 30
        while not _listening(port):
            if reaped.done() or time.monotonic() > deadline:
                if not reaped.done():
                    proc.kill()
                await reaped
                raise RuntimeError(
                    f"the gateway did not start: {(workdir / 'gateway.log').read_text()[-1500:]}"
                )
            await asyncio.sleep(0.05)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKEN, max_retries=0, timeout=600
        )
        seen = Seen()
        prompts = [
            {"_body": x["body"]} for x in batch_lines(int(2 * spec.tpm * (1 + seconds / 60) / 400) + 400)
        ]
        started = time.monotonic()
        try:
            await _drive(lambda i, line: _openai_call(client, line, False, seen), prompts, seconds, at_once)
        finally:
            await client.close()
            wall = time.monotonic() - started
            proc.send_signal(signal.SIGINT)
            try:
                code, cpu = await asyncio.wait_for(asyncio.shield(reaped), 30)
            except TimeoutError:
                proc.kill()
                code, cpu = await reaped
            log.close()
        audit = ledgers(run)
    return {
        "exit": code,
        "ok": seen.ok,
        "errors": sum(seen.errors.values()),
        "errors_by_type": dict(seen.errors),
        "cpu_s": cpu,
        "cpu_ms_per_request": 1000 * cpu / max(1, seen.ok),
        "wall_s": wall,
        "log_tail": (workdir / "gateway.log").read_text()[-1500:],
        **audit,
    }


def table(case: str, r: dict[str, Any]) -> str:
    rows = [f"{case}: target {TARGETS[case]}"]
    if case == "gateway":
        rows.append(f"  client ok {r['ok']}, errors {r['errors']} {r['errors_by_type'] or ''}".rstrip())
    else:
        rows.append(
            f"  exit {r['exit']}; {r['lines']} output lines, statuses {r['statuses']}, not 200: {r['not_200']}; "
            f"every custom_id exactly once: {r['exactly_once']} (missing {r['missing']}, twice {r['twice']})"
        )
    if r.get("dark"):
        d = r["dark"]
        at_s = f"{d['at_s']:.1f}" if d["at_s"] is not None else "?"
        rows.append(f"  {d['endpoint']} went dark ({d['how']}) after {d['at_lines']} lines, {at_s} s in")
    rows.append(
        f"  {'endpoint':<8} {'tokens':>9} {'capacity':>9} {'share':>6} {'ok':>5} {'429s':>5}  429s at (s)"
    )
    for name, e in r["endpoints"].items():
        share = e["used"] / e["capacity"] if e["capacity"] else 0.0
        rows.append(
            f"  {name:<8} {e['used']:>9,.0f} {e['capacity']:>9,.0f} {share:>6.3f} {e['ok']:>5} {e['rate_429']:>5}  "
            f"{e['429_at_s'] or ''}"
        )
    rows.append(
        f"  {'pool':<8} {r['used']:>9,.0f} {r['capacity']:>9,.0f} {r['share']:>6.3f} {'':>5} {r['rate_429']:>5}  "
        f"over {r['window_s']:.1f} s (first to last arrival), wall {r['wall_s']:.1f} s"
    )
    rows.append(f"  ratedeck CPU {r['cpu_s']:.2f} s, {r['cpu_ms_per_request']:.2f} ms per request")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="measure_pool", description=__doc__.split("\n")[0])
    parser.add_argument("case", choices=["batch", "failover", "gateway"])
    parser.add_argument("--lines", type=int, default=1200)
    parser.add_argument("--dark", choices=["refuse", "hang"], default="refuse")
    parser.add_argument("--dark-endpoint", default="east")
    parser.add_argument(
        "--dark-at-s",
        type=float,
        help="go dark this many seconds in (default: once a third of the lines are written)",
    )
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--latency", type=float, default=0.3)
    args = parser.parse_args(argv)
    spec = PoolSpec(latency=args.latency)
    with tempfile.TemporaryDirectory(prefix="measure-pool-") as tmp:
        if args.case == "gateway":
            r = asyncio.run(run_gateway(spec, args.seconds, Path(tmp)))
        else:
            dark = (args.dark_endpoint, args.dark) if args.case == "failover" else None
            lines = batch_lines(args.lines)
            r = asyncio.run(run_batch(spec, lines, Path(tmp), dark, dark_after_s=args.dark_at_s))
    print(table(args.case, r))
    if r["exit"] != 0 or r.get("errors") or r.get("not_200"):
        print("  the run's last output:\n" + "\n".join("    " + x for x in r["log_tail"].splitlines()[-15:]))
    print(json.dumps({"case": args.case, **{k: v for k, v in r.items() if k != "log_tail"}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
