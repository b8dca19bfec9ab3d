"""Money through the CLI in a subprocess against the real OpenAI stub on loopback: `--dry-run`
sends nothing and its range holds the real bill; `--max-cost` stops admission under the cap
(by the stub's own counts), exits 5, and a resumed SQLite store finishes the rest."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
from pathlib import Path

from ratedeck.core.exits import ExitCode
from ratedeck.core.numbers import usd_range
from ratedeck.server.stubs.openai import start_openai

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
SECRET = "sk-test-0123456789abcdef"
MAX_TOKENS = 200
# gpt-4o-mini, config/prices/openai.toml: USD per million tokens
INPUT, OUTPUT = 0.15, 0.60


def run_async(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 90))

    return run


def prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [
        {
            "_id": f"q{i}",
            "_path": "/v1/chat/completions",
            "_body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "a few words " * (10 + 7 * i)}],
                "max_tokens": MAX_TOKENS,
            },
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


async def cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *RATEDECK,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env=dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg")),
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def server_spend(stub) -> float:
    """What the stub billed, from its own ledger: each accepted request was charged its prompt
    + max_tokens, and wrote ceil(max_tokens * 0.5) tokens."""
    total = 0.0
    for r in stub.ledger.accepted():
        prompt = r.cost - MAX_TOKENS
        total += (prompt * INPUT + math.ceil(MAX_TOKENS * 0.5) * OUTPUT) / 1e6
    return total


def target(stub) -> list[str]:
    return ["--preset", "openai", "--target", stub.url, "--keys", SECRET, "--no-ui"]


@run_async
async def test_a_dry_run_sends_nothing_and_its_range_holds_the_real_bill(tmp_path):
    work = prompts(tmp_path, 12)
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000) as stub:
        code, out, err = await cli(
            tmp_path, *target(stub), "--workload", str(work), "--dry-run", "--report", "dry.json"
        )
        assert code == ExitCode.OK, err
        assert stub.ledger.records == []  # nothing reached the server
        dry = json.loads((tmp_path / "dry.json").read_text())
        assert dry["dry_run"] is True and dry["requests"] == 12 and dry["sent"] == 0
        (model,) = dry["models"]
        assert model["model"] == "gpt-4o-mini" and model["output_tokens_max"] == 12 * MAX_TOKENS
        assert usd_range(dry["usd_min"], dry["usd_max"]) in out  # like $0.0026–$0.0074
        assert dry["least_s"] is not None
        code, out, err = await cli(tmp_path, *target(stub), "--workload", str(work), "--report", "run.json")
        assert code == ExitCode.OK, err
        billed = server_spend(stub)
    report = json.loads((tmp_path / "run.json").read_text())
    spent = report["spend"]["total_usd"]
    assert dry["usd_min"] <= spent <= dry["usd_max"], (dry["usd_min"], spent, dry["usd_max"])
    assert spent == round(billed, 9) or abs(spent - billed) < 1e-9
    assert report["spend"]["rows"][0]["key"] == "k1" and report["spend"]["rows"][0]["answers"] == 12
    assert SECRET not in out + err


@run_async
async def test_a_dry_run_with_a_bad_line_exits_2_naming_it(tmp_path):
    work = prompts(tmp_path, 3)
    work.write_text(work.read_text() + "{not json\n")
    async with await start_openai(keys=[SECRET]) as stub:
        code, _, err = await cli(tmp_path, *target(stub), "--workload", str(work), "--dry-run")
        assert stub.ledger.records == []
    assert code == ExitCode.USAGE
    assert "prompts.jsonl: line 4: not JSON" in err and "Traceback" not in err


@run_async
async def test_max_cost_stops_under_the_cap_and_a_resumed_store_finishes_the_rest(tmp_path):
    n = 40
    work = prompts(tmp_path, n)
    db = f"sqlite:{tmp_path / 'jobs.db'}"
    code, _, err = await cli(tmp_path, "enqueue", "--store", db, str(work))
    assert code == 0, err
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000, latency=0.05) as stub:
        # what the whole job costs, as the stub bills it: the cap is about half of it
        code, out, err = await cli(
            tmp_path, *target(stub), "--workload", str(work), "--dry-run", "--report", "-"
        )
        dry = json.loads(out)
        cap = round((dry["usd_min"] + dry["usd_max"]) / 4, 6)
        code, out, err = await cli(
            tmp_path, *target(stub), "--store", db, "--max-cost", str(cap), "--report", "capped.json"
        )
        assert code == ExitCode.COST_CAP, err
        first = len(stub.ledger.accepted())
        billed = server_spend(stub)
        assert 0 < first < n
        # in flight at the stop was at most what the cap had reserved: the server never sees more
        assert billed <= cap, (billed, cap)
        assert "cost cap" in err and "jobs still pending in the store" in err
        report = json.loads((tmp_path / "capped.json").read_text())
        assert report["spend"]["capped"] is True and report["spend"]["cap_usd"] == cap
        assert report["spend"]["total_usd"] <= cap
        assert report["store"]["pending"] == n - first
        # the same store without the cap: the rest, each prompt once
        code, out, err = await cli(tmp_path, *target(stub), "--store", db, "--resume")
        assert code == ExitCode.OK, err
        assert len(stub.ledger.accepted()) == n
        assert stub.state.book.duplicates() == 0


@run_async
async def test_max_cost_on_a_workload_file_reports_the_lines_not_sent(tmp_path):
    n = 30
    work = prompts(tmp_path, n)
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000, latency=0.05) as stub:
        code, out, _ = await cli(
            tmp_path, *target(stub), "--workload", str(work), "--dry-run", "--report", "-"
        )
        dry = json.loads(out)
        cap = round(dry["usd_max"] / 2, 6)
        code, out, err = await cli(tmp_path, *target(stub), "--workload", str(work), "--max-cost", f"${cap}")
        sent = len(stub.ledger.accepted())
        billed = server_spend(stub)
    assert code == ExitCode.COST_CAP, err
    assert 0 < sent < n and billed <= cap
    assert f"{n - sent} of {n} lines not sent" in err
    assert "cap $" in out and "reached" in out  # the summary's spend line
    assert SECRET not in out + err
