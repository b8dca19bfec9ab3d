"""Measure an OpenAI Batch file through the CLI on the OpenAI stub (wall time), as docs/measurements.md's batch run is made.

    .venv/bin/python -m ratedeck.bench.measure_batch 600        # 600 lines, 3 keys, a 6 s minute
    .venv/bin/python -m ratedeck.bench.measure_batch 600 kill   # in SQLite, kill -9 a third in, --resume

The file is OpenAI's Batch input format as it is (`custom_id`, `method`, `url`, `body`; the
prompts of `measure_llm`, 20 to 2,000 characters, max_tokens 50 to 400), run with the openai
preset as shipped, no tier told, no --rate, `--results` and `--errors` in the Batch API's output
format. Prints: output lines and whether every custom_id is there exactly once, the stub's
duplicate prompts, the tokens the stub charged against the capacity over the time the run was
sending (`measure_llm.sending_window`), 429s, and the run's wall time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ratedeck.bench.measure_llm import MINUTE_S, prompts, sending_window
from ratedeck.server.stubs.openai import start_openai

KEYS = [
    "sk-proj-batch-alpha0000000000001",
    "sk-proj-batch-bravo0000000000002",
    "sk-proj-batch-charlie00000000003",
]


def batch_lines(n: int) -> list[dict]:
    """`n` lines of an OpenAI Batch input file."""
    return [
        {"custom_id": f"request-{i}", "method": "POST", "url": line["_path"], "body": line["_body"]}
        for i, line in enumerate(prompts(n, "/v1/chat/completions"))
    ]


async def measure(n: int, latency: float = 0.3) -> dict:
    lines = batch_lines(n)
    with tempfile.TemporaryDirectory() as tmp:
        work, out, errors = Path(tmp) / "batch.jsonl", Path(tmp) / "output.jsonl", Path(tmp) / "errors.jsonl"
        work.write_text("".join(json.dumps(x) + "\n" for x in lines))
        async with await start_openai(
            keys=KEYS, rpm=500, tpm=30_000, minute_s=MINUTE_S, latency=latency
        ) as stub:
            started = time.monotonic()
            first = stub.now()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--preset", "openai",
                "--target", stub.url, "--keys", ",".join(KEYS), "--workload", str(work),
                "--results", str(out), "--errors", str(errors), "--graveyard", "",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=tmp,
            )  # fmt: skip
            _, err = await proc.communicate()
            wall = time.monotonic() - started
            start, end = sending_window(stub, first)
            used = sum(stub.ledger.units(key=k) for k in KEYS)
            capacity = sum(stub.allowed_capacity(start, end, key=k) for k in KEYS)
            book = stub.state.book
            rate_429 = sum(c["rate_limit_exceeded"] for c in book.refusals.values())
            duplicates = book.duplicates()
        written = [json.loads(x) for f in (out, errors) for x in f.read_text().splitlines()]
    counts = Counter(x["custom_id"] for x in written)
    return {
        "exit": proc.returncode,
        "stderr": err.decode().strip()[-300:],
        "lines": len(written),
        "errors": sum(1 for x in written if x["response"] is None or x["response"]["status_code"] != 200),
        "exactly_once": counts == Counter(x["custom_id"] for x in lines),
        "duplicates": duplicates,
        "rate_429": rate_429,
        "used": used,
        "capacity": capacity,
        "share": used / capacity,
        "sending_s": end - start,
        "wall_s": wall,
    }


async def killed(n: int, at: int, latency: float = 0.3) -> dict:
    """The same file enqueued in SQLite, the run killed (kill -9) once `at` lines are written, then
    `--resume` on the same output files: what the two runs wrote, and what the stub answered twice."""
    lines = batch_lines(n)
    with tempfile.TemporaryDirectory() as tmp:
        work, db = Path(tmp) / "batch.jsonl", Path(tmp) / "jobs.db"
        out, errors = Path(tmp) / "output.jsonl", Path(tmp) / "errors.jsonl"
        work.write_text("".join(json.dumps(x) + "\n" for x in lines))
        cli = [sys.executable, "-m", "ratedeck.runner.cli"]
        enqueue = await asyncio.create_subprocess_exec(
            *cli, "enqueue", "--store", f"sqlite:{db}", str(work), stdout=asyncio.subprocess.DEVNULL
        )
        await enqueue.wait()
        async with await start_openai(
            keys=KEYS, rpm=500, tpm=30_000, minute_s=MINUTE_S, latency=latency
        ) as stub:
            run = [*cli, "--no-ui", "--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS)]
            run += [
                "--store",
                f"sqlite:{db}",
                "--results",
                str(out),
                "--errors",
                str(errors),
                "--graveyard",
                "",
            ]
            first = await asyncio.create_subprocess_exec(*run, stdout=asyncio.subprocess.DEVNULL, cwd=tmp)
            while (out.read_text().count("\n") if out.exists() else 0) < at and first.returncode is None:
                await asyncio.sleep(0.01)
            first.send_signal(signal.SIGKILL)
            await first.wait()
            before = out.read_text().count("\n")
            sent_before = len(stub.ledger.accepted())
            second = await asyncio.create_subprocess_exec(
                *run, "--resume", stdout=asyncio.subprocess.DEVNULL, cwd=tmp
            )
            await second.wait()
            duplicates = stub.state.book.duplicates()
        written = [json.loads(x) for f in (out, errors) if f.exists() for x in f.read_text().splitlines()]
    counts = Counter(x["custom_id"] for x in written)
    return {
        "exit": second.returncode,
        "before": before,
        "sent_before": sent_before,
        "lines": len(written),
        "exactly_once": counts == Counter(x["custom_id"] for x in lines),
        "duplicates": duplicates,
    }


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "kill":
        k = asyncio.run(killed(int(sys.argv[1]), int(sys.argv[1]) // 3))
        print(
            f"batch killed: {k['before']} lines written and {k['sent_before']} prompts answered by the stub before"
            f" the kill -9; after --resume {k['lines']} output lines, every custom_id exactly once:"
            f" {k['exactly_once']}; prompts the stub answered twice {k['duplicates']}; exit {k['exit']}"
        )
        sys.exit(0)
    r = asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 600))
    print(
        f"batch: {r['lines']} output lines ({r['errors']} errors), every custom_id exactly once: {r['exactly_once']};"
        f" duplicates {r['duplicates']}, rate-limit 429s {r['rate_429']};"
        f" tokens {r['used']:,.0f} of {r['capacity']:,.0f} ({r['share']:.3f}) over {r['sending_s']:.1f} s sending,"
        f" {r['wall_s']:.1f} s wall; exit {r['exit']}"
    )
    if r["exit"] != 0:
        print(r["stderr"])
