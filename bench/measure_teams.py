"""Measure a gateway for a team (issue 42's "Done when") on the OpenAI stub, 3 keys, real (60 s) minutes.

    .venv/bin/python -m ratedeck.bench.measure_teams priority        # batch (200 waiting) + interactive, 30 s
    .venv/bin/python -m ratedeck.bench.measure_teams shares          # weights 1 and 3, 40 at a time each, 40 s
    .venv/bin/python -m ratedeck.bench.measure_teams quota           # tokens_per_minute 20,000, flooding, 75 s
    .venv/bin/python -m ratedeck.bench.measure_teams quota-refuse    # the same, quota = "refuse"
    .venv/bin/python -m ratedeck.bench.measure_teams cost --litellm /tmp/litellm-venv/bin/litellm
    .venv/bin/python -m ratedeck.bench.measure_teams cost-binding --litellm /tmp/litellm-venv/bin/litellm

The pool: the OpenAI stub with 3 keys of 30,000 TPM and 500 RPM each (tokens bind: a prompt
of 800 characters + max_tokens 200 is 400 tokens as the stub charges them, at arrival),
0.3 s of latency. `priority`, `shares` and the `quota` cases run a `GatewayService` in this
process with `[[gateway.clients]]` (as bench/measure_gateway.py does); the clients are the
official openai SDK (`AsyncOpenAI`, `max_retries=0`) but for the interactive client of
`priority`, plain aiohttp. What is judged comes from the stub's ledger (arrival times,
tokens charged, 429s) and from what each client saw.

`cost` and `cost-binding` run `ratedeck gateway` as the real command in a child process
(a config file with two `[[gateway.clients]]`, so the flows' path is what is measured) and,
beside it, the LiteLLM proxy (its own venv, `--litellm PATH`; skipped, saying so, when the
path is absent). `cost`: the stub in a child process of its own with limits that never bind
and no latency; added p50 at 40 requests/s (bench/gateway.py's client), requests/s at 32 at
a time, CPU per proxied request of each proxy's processes (/proc, user + system).
`cost-binding`: limits that bind, the SDK 40 at a time: capacity used (the stub's accepted
tokens over its full buckets + refill from the first arrival to the last) by each.

Prints a small table per case and exits 1 when a target is missed. `--seconds` shortens a
case (the tests' runs); the windows judged scale with it (see each case's function).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ratedeck.bench.cluster import free_port, process_cpu_s
from ratedeck.bench.gateway import _drive as paced_drive
from ratedeck.bench.gateway import _percentile
from ratedeck.bench.measure_gateway import Seen, _drive, _openai_call
from ratedeck.bench.measure_pool import batch_lines
from ratedeck.config import load_config
from ratedeck.config.settings import GatewaySettings
from ratedeck.engine.snapshot import Snapshot
from ratedeck.gateway.service import GatewayService
from ratedeck.server.stubs.common import Stub
from ratedeck.server.stubs.openai import start_openai

KEYS = [
    "sk-proj-teams-alpha0000000000001",
    "sk-proj-teams-bravo0000000000002",
    "sk-proj-teams-charlie000000000003",
]
TPM = 30_000
RPM = 500
LATENCY = 0.3
MODEL = "gpt-4o-mini"
PROMPT_CHARS, MAX_TOKENS = 800, 200  # 400 tokens as the stub charges
#: The default length of each case, as the issue's "Done when" says it.
SECONDS = {
    "priority": 30.0,
    "shares": 40.0,
    "quota": 75.0,
    "quota-refuse": 75.0,
    "cost": 20.0,
    "cost-binding": 60.0,
}
TARGETS = {
    "priority": "interactive slowest <= 1.2 s; 0 errors either client; tokens from 5 s >= 0.90 of the refill; <= 3 429s",
    "shares": "shares of the answers from 5 s to 35 s 0.25 and 0.75, each within 0.05",
    "quota": "any 60 s <= 1.1 Q; best 60 s >= 0.8 Q",
    "quota-refuse": "every 429 carries Retry-After; any 60 s <= 1.1 Q",
    "cost": "added p50 <= 1.5 ms and <= LiteLLM's; rps at 32 >= 2x LiteLLM's; CPU <= 300 us/request and <= 0.5x LiteLLM's",
    "cost-binding": "ratedeck: 0 client errors, <= 3 429s; capacity used beside LiteLLM's",
}
LITELLM_DEFAULT = "/tmp/litellm-venv/bin/litellm"
#: The LiteLLM proxy's master key (it refuses to start without one), what its clients present.
LITELLM_KEY = "sk-litellm-measure-0123456789abcdef"


@dataclass
class Result:
    """One case: its table's lines, the targets missed (none: passed), and the numbers (JSON)."""

    case: str
    lines: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.missed.append(what)

    def table(self) -> str:
        verdict = "all targets met" if not self.missed else "MISSED: " + "; ".join(self.missed)
        return "\n".join(
            [f"{self.case}: target {TARGETS[self.case]}", *("  " + x for x in self.lines), "  " + verdict]
        )


# ------------------------------------------------------------------ shared pieces
def prompt_bodies(n: int, prefix: str = "") -> list[dict]:
    """`n` chat bodies of 400 tokens each (as the stub counts), each prompt its own."""
    out = []
    for line in batch_lines(n, PROMPT_CHARS, MAX_TOKENS):
        body = line["body"]
        if prefix:  # keep the length: the prefix replaces the prompt's first characters
            text = body["messages"][0]["content"]
            body["messages"][0]["content"] = (prefix + text)[:PROMPT_CHARS]
        out.append(body)
    return out


async def in_process_gateway(url: str, clients: list[dict[str, Any]]) -> GatewayService:
    """A `GatewayService` for the openai preset (as shipped, no tier told) with `clients`."""
    data: dict[str, Any] = {
        "target": {"url": url, "http_client": os.environ.get("RATEDECK_HTTP_CLIENT", "reqwest")},
        "keys": {"secrets": KEYS},
        "engine": {"graveyard_path": ""},
        "gateway": {"clients": clients},
    }
    cfg = load_config(None, "openai", data)
    service = GatewayService(cfg, GatewaySettings(listen="127.0.0.1:0", clients=cfg.gateway.clients))
    await service.start()
    return service


@contextlib.asynccontextmanager
async def stub_and_gateway(
    clients: list[dict[str, Any]], tpm: int
) -> AsyncIterator[tuple[Stub, GatewayService]]:
    async with await start_openai(keys=KEYS, rpm=RPM, tpm=tpm, latency=LATENCY) as stub:
        service = await in_process_gateway(stub.url, clients)
        try:
            yield stub, service
        finally:
            await service.stop(drain_timeout_s=5.0)


def sdk(url: str, token: str) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=600)


def _error_name(exc: Exception) -> str:
    return f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()


async def run_for(seconds: float, *workers: Awaitable[Any]) -> int:
    """Run `workers` for `seconds`, then cancel what is left (requests still waiting: their
    clients leave, the gateway withdraws them); how many were cancelled."""
    tasks = [asyncio.ensure_future(w) for w in workers]
    done, pending = await asyncio.wait(tasks, timeout=seconds)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        t.result()  # a worker's own bug is not hidden
    return len(pending)


def stub_429s(stub: Stub) -> int:
    return sum(1 for r in stub.ledger.records if r.status == 429)


def tokens_in(stub: Stub, start: float, end: float) -> float:
    return stub.ledger.units(start=start, end=end)


# ------------------------------------------------------------------ priority
async def run_priority(seconds: float = 30.0, tpm: int = TPM, warm_s: float | None = None) -> Result:
    """A batch client (SDK) keeps 200 requests waiting, resubmitting each as it ends; an
    interactive client (aiohttp) sends 2 small prompts a second alongside. Judged: the
    interactive client's slowest answer, both clients' errors, the stub's accepted tokens
    from `warm_s` (5 s; a quarter of a shorter run) to the end over the keys' refill in that
    time, and the stub's 429s."""
    warm = min(5.0, seconds / 4) if warm_s is None else warm_s
    clients = [
        {"name": "chat", "token": "tok-chat-0123456789", "priority": "interactive"},
        {"name": "nightly", "token": "tok-nightly-0123456789", "priority": "batch"},
    ]
    r = Result("priority")
    async with stub_and_gateway(clients, tpm) as (stub, service):
        started = stub.now()
        batch = sdk(service.url, "tok-nightly-0123456789")
        # the full buckets, the refill, and 200 more always held: the bodies never run out
        bodies = iter(prompt_bodies(int((seconds / 60 + 1) * 3 * tpm / 400) * 2 + 400))
        batch_seen = Seen()
        holding = 0  # batch requests sent and not answered

        async def batch_worker() -> None:
            nonlocal holding
            for body in bodies:
                holding += 1
                await _openai_call(batch, {"_body": body}, False, batch_seen)
                holding -= 1

        latencies: list[float] = []
        inter_errors: Counter[str] = Counter()

        async def interactive() -> None:
            headers = {"Authorization": "Bearer tok-chat-0123456789"}
            url = service.url + "/v1/chat/completions"
            async with aiohttp.ClientSession() as session:

                async def one(i: int) -> None:
                    body = {
                        "model": MODEL,
                        "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"#{i} hi"}],
                    }
                    t0 = time.monotonic()
                    try:
                        async with session.post(url, json=body, headers=headers) as resp:
                            await resp.read()
                            if resp.status != 200:
                                inter_errors[str(resp.status)] += 1
                                return
                    except aiohttp.ClientError as exc:
                        inter_errors[type(exc).__name__] += 1
                        return
                    latencies.append(time.monotonic() - t0)

                tasks, n, t_start = [], 0, time.monotonic()
                while time.monotonic() - t_start < seconds - 1.0:  # the last answers come within the run
                    tasks.append(asyncio.create_task(one(n)))
                    n += 1
                    await asyncio.sleep(max(0.0, t_start + n / 2.0 - time.monotonic()))
                await asyncio.gather(*tasks)

        try:
            await run_for(seconds, interactive(), *(batch_worker() for _ in range(200)))
        finally:
            await batch.close()
        end = started + seconds
        used = tokens_in(stub, started + warm, end)
        refill = len(KEYS) * tpm / 60 * (end - started - warm)
        share = used / refill if refill else 0.0
        n429 = stub_429s(stub)
        snap = service.snapshot()
    slowest = max(latencies) if latencies else math.inf
    r.numbers = {
        "interactive_answers": len(latencies),
        "interactive_p50_s": _percentile(latencies, 0.5),
        "interactive_max_s": slowest,
        "interactive_errors": dict(inter_errors),
        "batch_ok": batch_seen.ok,
        "batch_errors": dict(batch_seen.errors),
        "batch_left_waiting": holding,
        "tokens_from_warm": used,
        "refill_from_warm": refill,
        "share": share,
        "stub_429s": n429,
        "warm_s": warm,
    }
    r.lines += [
        f"interactive: {len(latencies)} answers, p50 {_percentile(latencies, 0.5):.3f} s, slowest {slowest:.3f} s; "
        f"errors {dict(inter_errors) or 0}",
        f"batch: {batch_seen.ok} answers, errors {dict(batch_seen.errors) or 0}; "
        f"{r.numbers['batch_left_waiting']} still waiting at {seconds:g} s (withdrawn)",
        f"stub: {used:,.0f} tokens accepted from {warm:g} s to {seconds:g} s of {refill:,.0f} refilled ({share:.3f}); "
        f"429s {n429}",
        "gateway clients: " + _clients_line(snap),
    ]
    r.check(slowest <= 1.2, f"interactive slowest {slowest:.3f} s > 1.2 s")
    r.check(not inter_errors and not batch_seen.errors, "a client saw errors")
    r.check(share >= 0.90, f"tokens {share:.3f} < 0.90 of the refill")
    r.check(n429 <= 3, f"{n429} 429s at the stub > 3")
    return r


def _clients_line(snap: Snapshot) -> str:
    """Each client as the gateway's snapshot shows it: sent, queue wait p50/p99, quota refusals."""
    rows = snap.clients.rows if snap.clients is not None else ()
    return (
        "; ".join(
            f"{c.name} sent {c.sent}, wait p50 {c.wait_p50_ms / 1000:.1f} s p99 {c.wait_p99_ms / 1000:.1f} s"
            + (f", refused {c.refused}" if c.refused else "")
            for c in rows
        )
        or "-"
    )


# ------------------------------------------------------------------ shares
async def run_shares(
    seconds: float = 40.0, tpm: int = TPM, window: tuple[float, float] | None = None
) -> Result:
    """Two standard clients, weights 1 and 3, each 40 at a time (SDK), prompts of one size.
    Judged: each one's share of the answers that came from 5 s to 35 s (for a shorter run:
    from a quarter in to an eighth before the end; `window` to choose)."""
    lo, hi = window if window is not None else (min(5.0, seconds / 4), seconds - min(5.0, seconds / 8))
    clients = [
        {"name": "light", "token": "tok-light-0123456789", "weight": 1},
        {"name": "heavy", "token": "tok-heavy-0123456789", "weight": 3},
    ]
    r = Result("shares")
    stamps: dict[str, list[float]] = {"light": [], "heavy": []}
    errors: Counter[str] = Counter()
    async with stub_and_gateway(clients, tpm) as (stub, service):
        n = int((seconds / 60 + 1) * 3 * tpm / 400) + 400  # each client's: more than all answers
        sdks = {name: sdk(service.url, f"tok-{name}-0123456789") for name in stamps}
        t0 = time.monotonic()

        def worker(name: str, bodies: Any) -> Awaitable[None]:
            import openai

            async def go() -> None:
                for body in bodies:
                    try:
                        await sdks[name].chat.completions.create(**body)
                        stamps[name].append(time.monotonic() - t0)
                    except openai.APIError as exc:
                        errors[f"{name}: {_error_name(exc)}"] += 1

            return go()

        light, heavy = iter(prompt_bodies(n, "L")), iter(prompt_bodies(n, "H"))
        try:
            await run_for(
                seconds,
                *(worker("light", light) for _ in range(40)),
                *(worker("heavy", heavy) for _ in range(40)),
            )
        finally:
            for c in sdks.values():
                await c.close()
        n429 = stub_429s(stub)
        snap = service.snapshot()
    counted = {name: sum(1 for t in ts if lo <= t < hi) for name, ts in stamps.items()}
    total = sum(counted.values())
    shares = {name: c / total if total else 0.0 for name, c in counted.items()}
    r.numbers = {
        "answers_in_window": counted,
        "shares": shares,
        "window_s": [lo, hi],
        "errors": dict(errors),
        "stub_429s": n429,
    }
    r.lines += [
        f"answers from {lo:g} s to {hi:g} s: light (weight 1) {counted['light']}, heavy (weight 3) {counted['heavy']}",
        f"shares: light {shares['light']:.3f}, heavy {shares['heavy']:.3f}; "
        f"all answers light {len(stamps['light'])}, heavy {len(stamps['heavy'])}",
        f"client errors {dict(errors) or 0}; stub 429s {n429}",
        "gateway clients: " + _clients_line(snap),
    ]
    r.check(abs(shares["light"] - 0.25) <= 0.05, f"light's share {shares['light']:.3f} not 0.25 +- 0.05")
    r.check(abs(shares["heavy"] - 0.75) <= 0.05, f"heavy's share {shares['heavy']:.3f} not 0.75 +- 0.05")
    return r


# ------------------------------------------------------------------ quota
def sliding_max(records: list[tuple[float, float]], window_s: float) -> tuple[float, float]:
    """The most charged in any `window_s` starting at a record: (amount, its start)."""
    records = sorted(records)
    best, best_at, j, acc = 0.0, records[0][0] if records else 0.0, 0, 0.0
    for i, (t, _c) in enumerate(records):
        while j < len(records) and records[j][0] < t + window_s:
            acc += records[j][1]
            j += 1
        if acc > best:
            best, best_at = acc, t
        acc -= records[i][1]
    return best, best_at


async def run_quota(
    seconds: float = 75.0, refuse: bool = False, quota: int = 20_000, tpm: int = TPM
) -> Result:
    """One client with tokens_per_minute `quota`, alone, 40 at a time (SDK) for `seconds`.
    Judged from the stub's arrival stamps and charged tokens: the most charged in any 60 s
    (a window starting at each record). With `refuse`, a refused request (429) waits 1 s and
    is sent again (a client that presses, not one that waits as told): each 429 must carry
    Retry-After."""
    import openai

    case = "quota-refuse" if refuse else "quota"
    clients = [
        {
            "name": "capped",
            "token": "tok-capped-0123456789",
            "tokens_per_minute": quota,
            "quota": "refuse" if refuse else "wait",
        }
    ]
    r = Result(case)
    refused, with_retry, retry_values = 0, 0, []
    seen = Seen()
    async with stub_and_gateway(clients, tpm) as (stub, service):
        client = sdk(service.url, "tok-capped-0123456789")
        bodies = iter(prompt_bodies(int(seconds * quota / 60 / 400) * 2 + 400))

        async def worker() -> None:
            nonlocal refused, with_retry
            for body in bodies:
                while True:
                    try:
                        await client.chat.completions.create(**body)
                        seen.ok += 1
                        break
                    except openai.RateLimitError as exc:
                        if not refuse:
                            seen.errors[_error_name(exc)] += 1
                            break
                        refused += 1
                        after = exc.response.headers.get("retry-after")
                        if after is not None:
                            with_retry += 1
                            retry_values.append(float(after))
                        await asyncio.sleep(1.0)
                    except openai.APIError as exc:
                        seen.errors[_error_name(exc)] += 1
                        break

        try:
            left = await run_for(seconds, *(worker() for _ in range(40)))
        finally:
            await client.close()
        accepted = [(x.at, x.cost) for x in stub.ledger.accepted()]
        first = min((t for t, _ in accepted), default=stub.now())
        best, best_at = sliding_max(accepted, 60.0)
        first_minute = sum(c for t, c in accepted if t < first + 60.0)
        n429 = stub_429s(stub)
        snap = service.snapshot()
    r.numbers = {
        "quota": quota,
        "max_60s": best,
        "max_60s_ratio": best / quota,
        "max_60s_from_s": best_at - first,
        "first_60s": first_minute,
        "stub_accepted": len(accepted),
        "stub_429s": n429,
        "client_ok": seen.ok,
        "client_errors": dict(seen.errors),
        "left_waiting": left,
        "gateway_429s": refused,
        "gateway_429s_with_retry_after": with_retry,
        "retry_after_s": sorted(Counter(retry_values).items()),
    }
    r.lines += [
        f"Q {quota:,} tokens/min; the stub accepted {len(accepted)} requests, {sum(c for _, c in accepted):,.0f} tokens "
        f"over {accepted[-1][0] - first if accepted else 0:.1f} s; stub 429s {n429}",
        f"most in any 60 s: {best:,.0f} ({best / quota:.3f} Q, from {best_at - first:.1f} s); "
        f"first 60 s: {first_minute:,.0f} ({first_minute / quota:.3f} Q)",
        f"client ok {seen.ok}, errors {dict(seen.errors) or 0}; {left} still waiting at {seconds:g} s (withdrawn)",
    ]
    if refuse:
        spread = Counter(retry_values)
        r.lines.append(
            f"gateway 429s {refused}, with Retry-After {with_retry}; Retry-After values (s: count) "
            + ", ".join(f"{v:g}: {c}" for v, c in sorted(spread.items())[:12])
        )
        r.check(refused == with_retry, f"{refused - with_retry} 429s without Retry-After")
        r.check(refused > 0, "no 429 from the gateway: the quota was never met")
    r.lines.append("gateway clients: " + _clients_line(snap))
    r.check(best <= 1.1 * quota, f"a 60 s window {best / quota:.3f} Q > 1.1 Q")
    if not refuse:
        r.check(best >= 0.8 * quota, f"best 60 s {best / quota:.3f} Q < 0.8 Q")
        r.check(not seen.errors, "the client saw errors")
    return r


# ------------------------------------------------------------------ cost: child processes
_STUB_CHILD = """
import asyncio, sys
from ratedeck.server.stubs.openai import start_openai
async def main():
    stub = await start_openai(keys=sys.argv[2].split(","), rpm=int(sys.argv[3]), tpm=int(sys.argv[4]), latency=float(sys.argv[5]))
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(stub.url)
    import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Child:
    """A server in a child process (output to a file), its CPU from /proc (with its children's)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.log_path = log
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )

    def cpu_s(self) -> float:
        """User + system CPU of the process and every descendant alive now."""
        total = 0.0
        for pid in self._tree():
            total += process_cpu_s(pid) or 0.0
        return total

    def _tree(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(parents.get(pid, ()))
        return out

    async def wait_port(self, port: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not _listening(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not listen on {port}: {self.tail()}")
            await asyncio.sleep(0.1)

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: it and its workers
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers it left behind
        self.log.close()


async def stub_child(workdir: Path, rpm: int, tpm: int, latency: float) -> tuple[Child, str]:
    """The OpenAI stub in its own process: (the child, its URL)."""
    url_file = workdir / "stub.url"
    argv = [
        sys.executable,
        "-c",
        _STUB_CHILD,
        str(url_file),
        ",".join(KEYS),
        str(rpm),
        str(tpm),
        str(latency),
    ]
    child = Child("stub", argv, workdir / "stub.log")
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if child.proc.poll() is not None or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"the stub did not start: {child.tail()}")
        await asyncio.sleep(0.05)
    return child, url_file.read_text().strip()


RD_TOKENS = ("tok-cost-alpha-0123456789", "tok-cost-bravo-0123456789")


async def ratedeck_child(target: str, workdir: Path, clients: bool = True) -> tuple[Child, str]:
    """`ratedeck gateway` (the real command) with two [[gateway.clients]] (`clients`; else one
    `--gateway-token`, no flows: the path before issue 42): (the child, its URL)."""
    port = free_port()
    argv = [sys.executable, "-m", "ratedeck.runner.cli", "gateway", "--preset", "openai"]
    argv += ["--target", target, "--keys", "env:RD_KEYS", "--listen", f"127.0.0.1:{port}", "--no-ui"]
    argv += ["--interval", "60", "--graveyard", ""]
    if clients:
        config = workdir / "gateway.toml"
        config.write_text(
            '[[gateway.clients]]\nname = "alpha"\ntoken = "env:RD_TOK_A"\npriority = "interactive"\n\n'
            '[[gateway.clients]]\nname = "bravo"\ntoken = "env:RD_TOK_B"\nweight = 2\n'
        )
        argv += ["--config", str(config)]
    else:
        argv += ["--gateway-token", "env:RD_TOK_A"]
    env = dict(os.environ, RD_KEYS=",".join(KEYS), RD_TOK_A=RD_TOKENS[0], RD_TOK_B=RD_TOKENS[1])
    child = Child("ratedeck gateway", argv, workdir / "ratedeck.log", env=env, cwd=workdir)
    await child.wait_port(port, 30)
    return child, f"http://127.0.0.1:{port}"


async def litellm_child(litellm: str, target: str, workdir: Path, binding: int | None) -> tuple[Child, str]:
    """The LiteLLM proxy: a model_list entry per key, all named gpt-4o-mini, pointing at the stub;
    with `binding` (TPM per key) each deployment is told its tpm and rpm and the router routes by
    usage (usage-based-routing-v2) with retries, the most it is told to do about limits."""
    lines = ["model_list:"]
    for key in KEYS:
        lines += [
            f"  - model_name: {MODEL}",
            "    litellm_params:",
            f"      model: openai/{MODEL}",
            f"      api_base: {target}/v1",
            f"      api_key: {key}",
        ]
        if binding is not None:
            lines += [f"      tpm: {binding}", f"      rpm: {RPM}"]
    lines += ["litellm_settings:", "  drop_params: true", "  telemetry: false"]
    if binding is not None:
        lines += ["router_settings:", "  routing_strategy: usage-based-routing-v2", "  num_retries: 3"]
    config = workdir / "litellm.yaml"
    config.write_text("\n".join(lines) + "\n")
    port = free_port()
    env = dict(
        os.environ,
        LITELLM_MASTER_KEY=LITELLM_KEY,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        NO_DOCS="True",
    )
    for name in ("OPENAI_API_KEY", "DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name, None)
    argv = [litellm, "--config", str(config), "--port", str(port), "--host", "127.0.0.1"]
    child = Child("litellm proxy", argv, workdir / "litellm.log", env=env, cwd=workdir)
    await child.wait_port(port, 180)
    return child, f"http://127.0.0.1:{port}"


async def closed_loop(url: str, tokens: list[str], seconds: float, at_once: int = 32) -> tuple[int, int]:
    """`at_once` workers send small chat completions back to back for `seconds`: (ok, errors)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 8}
    ok = errors = 0
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=at_once * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(i: int) -> None:
            nonlocal ok, errors
            headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
            while time.monotonic() < stop_at:
                try:
                    async with session.post(url, json=body, headers=headers) as resp:
                        await resp.read()
                        if resp.status == 200:
                            ok += 1
                        else:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1

        await asyncio.gather(*(worker(i) for i in range(at_once)))
    return ok, errors


async def _measure_proxy(
    name: str, child: Child, base: str, tokens: list[str], seconds: float, rps_s: float
) -> dict[str, Any]:
    url = base + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {tokens[0]}"}
    await paced_drive(url, headers, 2.0)  # warm: connections, each key's first answer
    await closed_loop(url, tokens, 2.0)
    cpu0 = child.cpu_s()
    lat, err = await paced_drive(url, headers, seconds)
    cpu_paced = child.cpu_s() - cpu0
    cpu1 = child.cpu_s()
    t0 = time.monotonic()
    ok, errs = await closed_loop(url, tokens, rps_s)
    wall = time.monotonic() - t0
    cpu_loaded = child.cpu_s() - cpu1
    return {
        "name": name,
        "p50_ms": 1000 * _percentile(lat, 0.5),
        "p99_ms": 1000 * _percentile(lat, 0.99),
        "paced_ok": len(lat),
        "paced_errors": err,
        "cpu_us_paced": 1e6 * cpu_paced / max(1, len(lat) + err),
        "rps_32": ok / wall,
        "rps_errors": errs,
        "cpu_us_loaded": 1e6 * cpu_loaded / max(1, ok + errs),
    }


async def run_cost(seconds: float, litellm: str | None, workdir: Path, one_token: bool = True) -> Result:
    """The gateway's own cost beside LiteLLM's: limits far above the load, a stub (its own
    process) that answers at once. Added p50 at 40 requests/s (4 at once, bench/gateway.py's
    client) over `seconds`; requests/s at 32 at a time over `seconds` * 3/4; CPU of each proxy's
    processes per request, in each phase (the targets judge the one at 32 at a time, where a
    process's fixed work is spread over many requests; the paced figure is beside it). With
    `one_token`, a row for the same command with one `--gateway-token` and no flows (not judged)."""
    r = Result("cost")
    rps_s = max(5.0, seconds * 0.75)
    stub, target = await stub_child(workdir, rpm=10_000_000, tpm=2_000_000_000, latency=0.0)
    rows: list[dict[str, Any]] = []
    try:
        direct_headers = {"Authorization": f"Bearer {KEYS[0]}"}
        await paced_drive(target + "/v1/chat/completions", direct_headers, 1.0)
        lat, err = await paced_drive(target + "/v1/chat/completions", direct_headers, seconds)
        t0 = time.monotonic()
        ok, errs = await closed_loop(target + "/v1/chat/completions", [KEYS[0]], rps_s)
        direct = {
            "name": "straight to the stub",
            "p50_ms": 1000 * _percentile(lat, 0.5),
            "p99_ms": 1000 * _percentile(lat, 0.99),
            "paced_ok": len(lat),
            "paced_errors": err,
            "rps_32": ok / (time.monotonic() - t0),
            "rps_errors": errs,
        }
        rows.append(direct)
        child, base = await ratedeck_child(target, workdir)
        try:
            rows.append(
                await _measure_proxy("ratedeck gateway", child, base, list(RD_TOKENS), seconds, rps_s)
            )
        finally:
            child.stop()
        if one_token:  # the same command without flows: what the clients' path adds
            child, base = await ratedeck_child(target, workdir, clients=False)
            try:
                rows.append(
                    await _measure_proxy("ratedeck, one token", child, base, [RD_TOKENS[0]], seconds, rps_s)
                )
            finally:
                child.stop()
        if litellm and Path(litellm).exists():
            child, base = await litellm_child(litellm, target, workdir, None)
            try:
                rows.append(await _measure_proxy("litellm proxy", child, base, [LITELLM_KEY], seconds, rps_s))
            finally:
                child.stop()
        else:
            r.lines.append(f"LiteLLM skipped: {litellm or '(no --litellm)'} is absent")
    finally:
        stub.stop()
    for row in rows[1:]:
        row["added_p50_ms"] = row["p50_ms"] - direct["p50_ms"]
        row["added_p99_ms"] = row["p99_ms"] - direct["p99_ms"]
    head = f"{'path':<22}{'p50 ms':>8}{'p99 ms':>8}{'added p50':>10}{'errors':>7}{'rps@32':>9}{'errors':>7}{'CPU us/req @32':>15}{'@40/s':>8}"
    r.lines += [head, "-" * len(head)]
    for row in rows:
        r.lines.append(
            f"{row['name']:<22}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}{_fmt(row.get('added_p50_ms'), '.2f'):>10}"
            f"{row['paced_errors']:>7}{row['rps_32']:>9.0f}{row['rps_errors']:>7}"
            f"{_fmt(row.get('cpu_us_loaded'), '.0f'):>15}{_fmt(row.get('cpu_us_paced'), '.0f'):>8}"
        )
    r.numbers = {"rows": rows, "seconds_paced": seconds, "seconds_rps": rps_s}
    rd = rows[1]
    r.check(rd["added_p50_ms"] <= 1.5, f"ratedeck added p50 {rd['added_p50_ms']:.2f} ms > 1.5 ms")
    r.check(rd["cpu_us_loaded"] <= 300, f"ratedeck CPU {rd['cpu_us_loaded']:.0f} us/request > 300")
    r.check(not rd["paced_errors"] and not rd["rps_errors"], "ratedeck: client errors")
    litellm_rows = [row for row in rows if row["name"] == "litellm proxy"]
    if litellm_rows:
        ll = litellm_rows[0]
        r.check(rd["added_p50_ms"] <= ll["added_p50_ms"], "ratedeck's added p50 above LiteLLM's")
        r.check(
            rd["rps_32"] >= 2 * ll["rps_32"], f"rps at 32 {rd['rps_32'] / ll['rps_32']:.2f}x LiteLLM's < 2x"
        )
        r.check(
            rd["cpu_us_loaded"] <= 0.5 * ll["cpu_us_loaded"],
            f"CPU {rd['cpu_us_loaded'] / ll['cpu_us_loaded']:.2f}x LiteLLM's > 0.5x",
        )
        r.lines.append(
            f"ratedeck / LiteLLM: rps at 32 {rd['rps_32'] / ll['rps_32']:.2f}x, CPU per request at 32 "
            f"{rd['cpu_us_loaded'] / ll['cpu_us_loaded']:.2f}x (at 40/s {rd['cpu_us_paced'] / ll['cpu_us_paced']:.2f}x)"
        )
    return r


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


async def _sdk_call(client: Any, body: dict, seen: Seen, samples: dict[str, str]) -> None:
    """One SDK call; an error counted by type, its first message kept."""
    import openai

    try:
        await client.chat.completions.create(**body)
        seen.ok += 1
    except openai.APIError as exc:
        name = _error_name(exc)
        seen.errors[name] += 1
        samples.setdefault(name, str(exc)[:300])


async def run_binding(seconds: float, litellm: str | None, workdir: Path, tpm: int = TPM) -> Result:
    """Limits that bind (3 keys x `tpm`, 0.3 s latency), each proxy a child process before a
    fresh stub (this process: its ledger), the SDK 40 at a time for `seconds`, then the
    requests held finish. Capacity used: the stub's accepted tokens over its full buckets +
    refill from the first arrival to the later of the last arrival and the end of the sending
    (a proxy that stops forwarding while its client still asks is charged for that time)."""
    r = Result("cost-binding")
    rows: list[dict[str, Any]] = []
    proxies: list[tuple[str, Callable[[str], Awaitable[tuple[Child, str]]], str]] = [
        ("ratedeck gateway", lambda target: ratedeck_child(target, workdir), RD_TOKENS[1])
    ]
    if litellm and Path(litellm).exists():
        proxies.append(
            ("litellm proxy", lambda target: litellm_child(litellm, target, workdir, tpm), LITELLM_KEY)
        )
    else:
        r.lines.append(f"LiteLLM skipped: {litellm or '(no --litellm)'} is absent")
    for name, start, token in proxies:
        async with await start_openai(keys=KEYS, rpm=RPM, tpm=tpm, latency=LATENCY) as stub:
            child, base = await start(stub.url)
            seen = Seen()
            samples: dict[str, str] = {}
            client = sdk(base, token)
            lines = [{"_body": b} for b in prompt_bodies(int(seconds * 3 * tpm / 60 / 400) * 2 + 600)]
            sending = stub.now()
            try:
                await asyncio.wait_for(
                    _drive(
                        lambda i, line, c=client, s=seen, m=samples: _sdk_call(c, line["_body"], s, m),
                        lines,
                        seconds,
                        40,
                    ),
                    seconds + 180,
                )
            finally:
                await client.close()
                child.stop()
            arrivals = stub.ledger.arrivals()
            first, last = (min(arrivals), max(arrivals)) if arrivals else (sending, sending)
            end = max(last, sending + seconds)
            used = stub.ledger.units()
            cap = stub.allowed_capacity(first, end)
            rows.append(
                {
                    "name": name,
                    "used": used,
                    "capacity": cap,
                    "share": used / cap if cap else 0.0,
                    "stub_429s": stub_429s(stub),
                    "client_ok": seen.ok,
                    "client_errors": dict(seen.errors),
                    "error_samples": samples,
                    "window_s": end - first,
                    "last_arrival_s": last - first,
                }
            )
    for row in rows:
        r.lines.append(
            f"{row['name']:<17} {row['used']:>9,.0f} of {row['capacity']:>9,.0f} tokens ({row['share']:.3f}) "
            f"over {row['window_s']:.1f} s (last arrival at {row['last_arrival_s']:.1f} s); "
            f"stub 429s {row['stub_429s']}; client ok {row['client_ok']}, errors {row['client_errors'] or 0}"
        )
        for err, text in row["error_samples"].items():
            r.lines.append(f"  first {err}: {text}")
    rd = rows[0]
    r.check(not rd["client_errors"], "ratedeck: client errors")
    r.check(rd["stub_429s"] <= 3, f"ratedeck: {rd['stub_429s']} 429s > 3")
    r.numbers = {"rows": rows}
    return r


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="measure_teams", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("case", choices=list(SECONDS))
    parser.add_argument("--seconds", type=float, help="the case's length (default: the issue's)")
    parser.add_argument("--litellm", default=LITELLM_DEFAULT, help="the LiteLLM proxy's command (cost cases)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else SECONDS[args.case]
    with tempfile.TemporaryDirectory(prefix="measure-teams-") as tmp:
        work = Path(tmp)
        runs: dict[str, Callable[[], Coroutine[Any, Any, Result]]] = {
            "priority": lambda: run_priority(seconds),
            "shares": lambda: run_shares(seconds),
            "quota": lambda: run_quota(seconds),
            "quota-refuse": lambda: run_quota(seconds, refuse=True),
            "cost": lambda: run_cost(seconds, args.litellm, work),
            "cost-binding": lambda: run_binding(seconds, args.litellm, work),
        }
        result = asyncio.run(runs[args.case]())
    print(result.table())
    print(json.dumps({"case": result.case, "missed": result.missed, **result.numbers}, default=str))
    return 1 if result.missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
