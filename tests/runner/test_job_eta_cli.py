"""A job's ETA through the CLI in a subprocess, against the real OpenAI stub on loopback (wall
clock): 3,000 prompts on 5 keys, the `openai` preset as shipped, the stub's limits per model
(its minute scaled to 12 s so the job takes seconds). The first periodic headless line already
says `of 3,000` and an ETA, and that ETA foresees the finish (the virtual-time checks at 10%
done are tests/engine/test_progress.py's)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from ratedeck.core.exits import ExitCode
from ratedeck.server.stubs.openai import start_openai
from tests.support.cli import spawn_ratedeck

KEYS = [f"sk-proj-eta-live{i:02d}000000000000000000" for i in range(5)]
PROMPTS = 3000
_JOBS = re.compile(r"^jobs\s+([\d,]+) of ([\d,]+) \((\d+)%\)\s+ETA (\S+)")


def seconds(text: str) -> float:
    """The headless ETA's "45s", "2m10s" or "3h05m" in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert parts is not None and text, text
    h, m, s = (int(x) if x else 0 for x in parts.groups())
    return 3600 * h + 60 * m + s


def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    with path.open("w") as f:
        for i in range(PROMPTS):
            body = {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"prompt {i}: say ok"}],
                "max_tokens": 16,
            }
            f.write(json.dumps({"_id": f"p{i}", "_path": "/v1/chat/completions", "_body": body}) + "\n")
    return path


async def run_job(tmp_path: Path) -> tuple[int, list[tuple[float, str]], str]:
    """(exit code, [(seconds since the start, stdout line)], stderr) of one headless run."""
    models = {"gpt-4o-mini": {"rpm": 500, "tpm": 30_000}}
    async with await start_openai(keys=KEYS, models=models, minute_s=12.0, latency=0.05) as stub:
        start = time.monotonic()
        proc = await spawn_ratedeck(
            *("--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS), "--no-ui"),
            *("--workload", str(prompts(tmp_path)), "--interval", "1"),
            cwd=tmp_path,
        )
        assert proc.stdout is not None and proc.stderr is not None
        lines = [(time.monotonic() - start, raw.decode().rstrip()) async for raw in proc.stdout]
        err = (await proc.stderr.read()).decode()
        await proc.wait()
        assert proc.returncode is not None
        return proc.returncode, lines, err


@pytest.mark.slow
def test_the_first_periodic_line_of_an_openai_job_says_of_3000_and_an_eta(tmp_path):
    code, lines, err = asyncio.run(asyncio.wait_for(run_job(tmp_path), 120))
    assert code == ExitCode.OK, err
    jobs = [(at, m) for at, line in lines if (m := _JOBS.match(line))]
    assert jobs, [line for _, line in lines]
    at, first = jobs[0]
    assert first.group(2) == f"{PROMPTS:,}" and first.group(4) != "unknown", first.group(0)
    ended = max(t for t, line in lines if line.startswith("jobs") and f"{PROMPTS:,} of" in line)
    # the finish the first line foresaw (the ETA is in whole seconds), against the real one
    assert at + seconds(first.group(4)) == pytest.approx(ended, rel=0.35, abs=1.5), (
        at,
        first.group(0),
        ended,
    )
