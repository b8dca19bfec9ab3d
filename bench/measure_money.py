"""Measure the bill on the OpenAI stub (wall time), as docs/measurements.md's money runs are made.

    .venv/bin/python -m ratedeck.bench.measure_money 200
    .venv/bin/python -m ratedeck.bench.measure_money 200 told   # the dry run's least time

Writes `n` prompts of many sizes (bench/measure_llm.py's: 20..2,000 characters, max_tokens
50..400, gpt-4o-mini) and runs the `ratedeck` command in a subprocess against one loopback
stub (2 keys; it writes half of each max_tokens):

1. `--dry-run`: the range it prints, and the requests the stub received (0);
2. the real run: the spend its report gives, beside what the stub billed by its own ledger
   (each accepted request's prompt tokens as it charged them, and the completion it wrote);
3. `--max-cost` at half the dry run's ceiling, on a SQLite store: the exit code, the spend,
   what the stub billed for that run, the jobs left pending; then the same store without the
   cap (`--resume`): the rest, and each prompt sent once.

`told`: the stub allows each key 60 requests at once and 10 a second (its minute scaled to
6 s), and the run is told the same (`--limit 60@10/s`): the dry run's least time beside
the real run's makespan (its last success) and the least time the engine worked out.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from ratedeck.bench.measure_llm import OPENAI_KEYS, prompts
from ratedeck.server.stubs.llm_common import prompt_identity
from ratedeck.server.stubs.openai import start_openai

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
# gpt-4o-mini, config/prices/openai.toml: USD per million tokens
INPUT, OUTPUT = 0.15, 0.60
KEYS = OPENAI_KEYS[:2]


async def cli(cwd: Path, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *RATEDECK,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(os.environ, XDG_CONFIG_HOME=str(cwd / "xdg")),
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


def billed(records, max_tokens: dict[str, int]) -> float:
    """USD the stub billed for `records`: the prompt it charged (its charge less max_tokens) and the
    completion it wrote (half of max_tokens, rounded up)."""
    total = 0.0
    for r in records:
        m = max_tokens[r.detail]
        total += ((r.cost - m) * INPUT + math.ceil(m * 0.5) * OUTPUT) / 1e6
    return total


async def measure(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        lines = prompts(n, "/v1/chat/completions")
        work = cwd / "prompts.jsonl"
        work.write_text("".join(json.dumps(x) + "\n" for x in lines))
        max_tokens = {prompt_identity(x["_body"]["messages"]): x["_body"]["max_tokens"] for x in lines}
        db = f"sqlite:{cwd / 'jobs.db'}"
        async with await start_openai(keys=KEYS, rpm=3000, tpm=2_000_000, latency=0.2) as stub:
            target = ["--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS), "--no-ui"]
            code, out, err = await cli(cwd, *target, "--workload", str(work), "--dry-run", "--report", "-")
            assert code == 0, err
            dry = json.loads(out)
            received_dry = len(stub.ledger.records)
            code, _, err = await cli(cwd, *target, "--workload", str(work), "--report", "run.json")
            assert code == 0, err
            spend = json.loads((cwd / "run.json").read_text())["spend"]["total_usd"]
            stub_billed = billed(stub.ledger.accepted(), max_tokens)
            code, _, err = await cli(cwd, "enqueue", "--store", db, str(work))
            assert code == 0, err
            before = len(stub.ledger.accepted())
            cap = round(dry["usd_max"] / 2, 6)
            capped_code, _, err = await cli(
                cwd, *target, "--store", db, "--max-cost", str(cap), "--report", "capped.json"
            )
            capped = json.loads((cwd / "capped.json").read_text())
            capped_records = stub.ledger.accepted()[before:]
            resume_code, _, err = await cli(cwd, *target, "--store", db, "--resume")
            after = stub.ledger.accepted()[before:]
            duplicates = len(after) - len({r.detail for r in after})
        return {
            "requests": n,
            "dry_range": (dry["usd_min"], dry["usd_max"]),
            "dry_least_s": dry["least_s"],
            "dry_received": received_dry,
            "spend": spend,
            "stub_billed": stub_billed,
            "cap": cap,
            "capped_exit": capped_code,
            "capped_spend": capped["spend"]["total_usd"],
            "capped_stub_billed": billed(capped_records, max_tokens),
            "capped_sent": len(capped_records),
            "capped_pending": capped["store"]["pending"],
            "resume_exit": resume_code,
            "store_total_sent": len(after),
            "duplicates": duplicates,
        }


async def measure_told(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        work = cwd / "prompts.jsonl"
        work.write_text("".join(json.dumps(x) + "\n" for x in prompts(n, "/v1/chat/completions")))
        async with await start_openai(keys=KEYS, rpm=60, tpm=2_000_000, minute_s=6.0, latency=0.2) as stub:
            target = ["--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS), "--no-ui"]
            target += ["--limit", "60@10/s"]
            code, out, err = await cli(cwd, *target, "--workload", str(work), "--dry-run", "--report", "-")
            assert code == 0, err
            dry = json.loads(out)
            code, _, err = await cli(cwd, *target, "--workload", str(work), "--report", "run.json")
            assert code == 0, err
            report = json.loads((cwd / "run.json").read_text())
        return {
            "requests": n,
            "dry_least_s": dry["least_s"],
            "makespan": report["makespan"],
            "rejected_429": report["requests"]["rejected_429"],
        }


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 200
    told = len(argv) > 1 and argv[1] == "told"
    print(json.dumps(asyncio.run(measure_told(n) if told else measure(n)), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
