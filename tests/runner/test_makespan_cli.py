"""A job's makespan through the CLI in a subprocess, against the real OpenAI stub on loopback
(wall clock, its minute scaled to 12 s): a run that finds the server's bucket part spent (a
run killed a moment before, another client) counts its least time from the level it found."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest

from ratedeck.core.exits import ExitCode
from ratedeck.server.stubs.openai import start_openai
from tests.support.cli import spawn_ratedeck

KEY = "sk-proj-makespan00000000000000000000"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 8}
_MAKESPAN = re.compile(
    r"^makespan\s+(\d+) jobs in ([\d.]+) s, least ([\d.]+) s the limits allow: ratio ([\d.]+)"
)


def prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"p{i}", "_path": "/v1/chat/completions", "_body": BODY}) + "\n")
    return path


async def run(tmp_path: Path, spend: int, jobs: int) -> tuple[int, str, str]:
    # 120 requests a (12 s) minute: a bucket of 120 refilled 10 a second.
    models = {"gpt-4o-mini": {"rpm": 120, "tpm": 1_000_000}}
    async with await start_openai(keys=[KEY], models=models, minute_s=12.0, latency=0.02) as stub:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http:

            async def one() -> int:
                async with http.post(stub.url + "/v1/chat/completions", json=BODY) as resp:
                    await resp.read()
                    return resp.status

            statuses = await asyncio.gather(*(one() for _ in range(spend)))
        assert statuses.count(200) == spend
        proc = await spawn_ratedeck(
            *("--preset", "openai", "--target", stub.url, "--keys", KEY, "--no-ui"),
            *("--workload", str(prompts(tmp_path, jobs))),
            cwd=tmp_path,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
def test_a_job_on_a_part_spent_bucket_counts_its_least_time_from_the_level_it_found(tmp_path):
    # Another client spent all 120 just before: the job's 80 come at 10 a second, whatever the
    # bucket's size (counted from a full bucket, the least time was one round trip: the limits
    # "allowed them at once", and a resumed job read ratio 5.9).
    code, out, err = asyncio.run(asyncio.wait_for(run(tmp_path, spend=120, jobs=80), 120))
    assert code == ExitCode.OK, err
    lines = [m for line in out.splitlines() if (m := _MAKESPAN.match(line))]
    assert lines, out[-2000:]
    jobs, elapsed, least, ratio = lines[0].groups()
    assert int(jobs) == 80
    assert float(least) >= 5.0, lines[0].group(0)  # at least (80 - 30 refilled meanwhile) / 10
    assert 1.0 <= float(ratio) <= 1.3, lines[0].group(0)
