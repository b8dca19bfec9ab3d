"""Measure the Batch APIs served by the gateway with the official SDKs (wall time, real minutes).

    .venv/bin/python -m ratedeck.bench.measure_batch_api openai        # 600 lines, 3 keys
    .venv/bin/python -m ratedeck.bench.measure_batch_api openai-kill   # the same on SQLite, SIGKILL at half
    .venv/bin/python -m ratedeck.bench.measure_batch_api anthropic     # 200 requests, 2 keys

The gateway is the real command (`ratedeck gateway --no-ui`) in a child process in front of
a stub in this process; the client is the official SDK with its retries off. `openai`: the
file is uploaded with `files.create(purpose="batch")`, the batch made with `batches.create`,
polled every second with `batches.retrieve` until it is final, and its output read with
`files.content`. The least time the limits allow is counted after the keys' first buckets:
the tokens and the requests left over, at the keys' refill (the stub's buckets refill in a
minute), the larger of the two. Target (issue 43): `completed`, every custom_id once with
status 200, upload to `completed` <= 1.25x that least time + 5 s. `openai-kill`: the gateway
on `--store sqlite:...` is killed with SIGKILL when half the lines are answered and started
again on the same store and port; the batch completes with every custom_id once.
`anthropic`: `messages.batches.create` with 200 requests, polled until `ended`, read with
`messages.batches.results`: all succeeded, every custom_id once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.openai import start_openai

from .procs import stop_child

TOKEN = "measure-batch-api-token"
OPENAI_KEYS = [
    "sk-proj-bapi-alpha000000000001",
    "sk-proj-bapi-bravo000000000002",
    "sk-proj-bapi-charlie0000000003",
]
ANTHROPIC_KEYS = ["sk-ant-bapi-alpha00000000001", "sk-ant-bapi-bravo00000000002"]
RPM, TPM = 500, 30_000
PROMPT_CHARS, MAX_TOKENS = 800, 200  # 200 + 200 = 400 tokens a line, as the stub charges them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def gateway(
    preset: str, target: str, keys: list[str], port: int, workdir: Path, *flags: str
) -> subprocess.Popen:
    """`ratedeck gateway` in a child process on `port` (its output in files under `workdir`)."""
    env = {**os.environ, "BAPI_KEYS": ",".join(keys), "BAPI_TOKEN": TOKEN}
    args = [sys.executable, "-m", "ratedeck.runner.cli", "gateway", "--preset", preset, "--target", target]
    args += ["--keys", "env:BAPI_KEYS", "--gateway-token", "env:BAPI_TOKEN", "--listen", f"127.0.0.1:{port}"]
    args += ["--no-ui", "--interval", "600", *flags]
    out = (workdir / "gateway.out").open("ab")
    proc = subprocess.Popen(
        args, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    for _ in range(300):
        if _listening(port):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(
                f"the gateway exited {proc.returncode}: {(workdir / 'gateway.out').read_text()[-500:]}"
            )
        time.sleep(0.05)
    raise RuntimeError("the gateway did not listen within 15 s")


def openai_lines(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"request-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"{i} " + "x" * (PROMPT_CHARS - len(str(i)) - 1)}],
                "max_tokens": MAX_TOKENS,
            },
        }
        for i in range(n)
    ]


def least_time_s(n: int, tokens_each: int, keys: int, rpm: int, tpm: int) -> float:
    """The least time `n` lines take at the keys' limits, after their first full buckets."""
    tokens_left = max(0, n * tokens_each - keys * tpm)
    requests_left = max(0, n - keys * rpm)
    return max(tokens_left / (keys * tpm / 60.0), requests_left / (keys * rpm / 60.0))


async def _poll(client: Any, batch_id: str, on_counts: Any = None) -> tuple[Any, float]:
    """Retrieve every second until final (a refused connection while the gateway restarts: again)."""
    import openai

    while True:
        try:
            batch = await client.batches.retrieve(batch_id)
        except (openai.APIConnectionError, openai.APITimeoutError):
            await asyncio.sleep(0.2)
            continue
        if on_counts is not None:
            await on_counts(batch)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch, time.monotonic()
        await asyncio.sleep(1.0)


async def openai_run(n: int = 600, kill: bool = False) -> dict[str, Any]:
    import openai

    tokens_each = PROMPT_CHARS // 4 + MAX_TOKENS
    result: dict[str, Any] = {"case": "openai-kill" if kill else "openai", "lines": n}
    with tempfile.TemporaryDirectory(prefix="bapi-") as tmp:
        workdir = Path(tmp)
        port = _free_port()
        flags = ("--store", f"sqlite:{workdir / 'gateway.db'}") if kill else ()
        async with await start_openai(keys=OPENAI_KEYS, rpm=RPM, tpm=TPM, latency=0.3) as stub:
            proc = await asyncio.to_thread(gateway, "openai", stub.url, OPENAI_KEYS, port, workdir, *flags)
            procs = [proc]
            try:
                client = openai.AsyncOpenAI(
                    api_key=TOKEN, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
                )
                content = "".join(json.dumps(line) + "\n" for line in openai_lines(n)).encode()
                t0 = time.monotonic()
                f = await client.files.create(file=("batch.jsonl", content), purpose="batch")
                batch = await client.batches.create(
                    input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
                killed: dict[str, Any] = {}

                async def maybe_kill(b: Any) -> None:
                    done = b.request_counts.completed + b.request_counts.failed if b.request_counts else 0
                    if kill and not killed and done >= n // 2:
                        procs[-1].send_signal(signal.SIGKILL)
                        procs[-1].wait()
                        killed.update(at_lines=done, at_s=round(time.monotonic() - t0, 1))
                        procs.append(
                            await asyncio.to_thread(
                                gateway, "openai", stub.url, OPENAI_KEYS, port, workdir, *flags
                            )
                        )

                final, t_end = await _poll(client, batch.id, maybe_kill)
                result["status"] = final.status
                result["seconds"] = round(t_end - t0, 1)
                result["counts"] = final.request_counts.model_dump() if final.request_counts else None
                records = []
                if final.output_file_id:
                    out = await client.files.content(final.output_file_id)
                    records = [json.loads(x) for x in out.text.splitlines() if x.strip()]
                ids = Counter(r["custom_id"] for r in records)
                result["output_lines"] = len(records)
                result["each_once"] = len(ids) == n and max(ids.values(), default=0) == 1
                result["statuses"] = dict(
                    Counter((r.get("response") or {}).get("status_code") for r in records)
                )
                if killed:
                    result["killed"] = killed
            finally:
                for p in procs:
                    stop_child(p, wait_s=30.0)  # a gateway drains its batches' lines in flight
            result["stub_429s"] = sum(1 for r in stub.ledger.records if r.status == 429)
            result["answered_twice_upstream"] = stub.state.book.duplicates()  # in flight at the kill
    least = least_time_s(n, tokens_each, len(OPENAI_KEYS), RPM, TPM)
    result["least_s"] = round(least, 1)
    result["target_s"] = round(1.25 * least + 5.0, 1)
    return result


async def anthropic_run(n: int = 200) -> dict[str, Any]:
    import anthropic

    result: dict[str, Any] = {"case": "anthropic", "lines": n}
    with tempfile.TemporaryDirectory(prefix="bapi-") as tmp:
        workdir = Path(tmp)
        port = _free_port()
        async with await start_anthropic(keys=ANTHROPIC_KEYS, latency=0.3) as stub:
            proc = await asyncio.to_thread(gateway, "anthropic", stub.url, ANTHROPIC_KEYS, port, workdir)
            try:
                client = anthropic.AsyncAnthropic(
                    api_key=TOKEN, base_url=f"http://127.0.0.1:{port}", max_retries=0
                )
                requests = [
                    {
                        "custom_id": f"q{i}",
                        "params": {
                            "model": "claude-3-5-haiku-latest",
                            "max_tokens": 100,
                            "messages": [{"role": "user", "content": f"question {i}"}],
                        },
                    }
                    for i in range(n)
                ]
                t0 = time.monotonic()
                batch = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
                while batch.processing_status != "ended":
                    await asyncio.sleep(1.0)
                    batch = await client.messages.batches.retrieve(batch.id)
                result["seconds"] = round(time.monotonic() - t0, 1)
                result["counts"] = batch.request_counts.model_dump()
                kinds: Counter[str] = Counter()
                ids: Counter[str] = Counter()
                async for entry in await client.messages.batches.results(batch.id):
                    ids[entry.custom_id] += 1
                    kinds[entry.result.type] += 1
                result["results"] = dict(kinds)
                result["each_once"] = len(ids) == n and max(ids.values(), default=0) == 1
            finally:
                stop_child(proc, wait_s=30.0)
            result["stub_429s"] = sum(1 for r in stub.ledger.records if r.status == 429)
    return result


def verdict(r: dict[str, Any]) -> list[str]:
    """What missed the issue's targets (empty: every target met)."""
    missed = []
    if r["case"] == "anthropic":
        if r.get("results") != {"succeeded": r["lines"]}:
            missed.append(f"results {r.get('results')}, not all succeeded")
    else:
        if r.get("status") != "completed":
            missed.append(f"status {r.get('status')}")
        if set(r.get("statuses", {})) != {200}:
            missed.append(f"statuses {r.get('statuses')}")
        if r["case"] == "openai" and r.get("seconds", 1e9) > r["target_s"]:
            missed.append(f"{r['seconds']} s > {r['target_s']} s")
    if not r.get("each_once"):
        missed.append("a custom_id missing or twice")
    return missed


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    case = args[0] if args else "openai"
    n = int(args[1]) if len(args) > 1 else (200 if case == "anthropic" else 600)
    if case == "anthropic":
        r = asyncio.run(anthropic_run(n))
    elif case in ("openai", "openai-kill"):
        r = asyncio.run(openai_run(n, kill=case == "openai-kill"))
    else:
        print(f"unknown case {case!r}: openai, openai-kill or anthropic", file=sys.stderr)
        return 2
    missed = verdict(r)
    r["missed"] = missed
    print(json.dumps(r))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
