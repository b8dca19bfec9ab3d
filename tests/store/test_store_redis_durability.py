"""When the store cannot keep its promise: a Redis that keeps nothing across a restart is said at the
start (event log, summary, report); a restart that lost the state says how many claimed jobs went with it.

Real redis-servers, started with and without persistence (`appendonly yes` / nothing at all).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ratedeck.core.vocab import Ending
from ratedeck.runner.headless import store_lines
from ratedeck.store.base import Finished, StoreCounts, StoreError, StoreReport
from ratedeck.store.redis import RedisStore
from tests.runner.test_report_schema import validate
from tests.support.redis_cluster import _reset
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


@pytest.mark.parametrize("persist", [False, True])
def test_a_run_warns_once_when_a_restart_would_lose_the_work(persist: bool, tmp_path: Path):
    with RedisServer(persist=persist) as server:
        report = tmp_path / "r.json"
        proc = subprocess.run(
            [*RATEDECK, "--no-ui", "--store", server.url, "--duration", "1.5", "--report", str(report)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode in (0, 3), proc.stderr  # an empty store: nothing to do is fine
    data = json.loads(report.read_text())
    assert validate(data) == []
    warned = [line for line in proc.stderr.splitlines() if "keeps nothing across a restart" in line]
    if persist:
        assert data["store"]["persistence"] == "appendonly" and not warned
        assert "a restart loses the work" not in proc.stdout
    else:
        assert data["store"]["persistence"] == "none"
        assert len(warned) == 1, proc.stderr  # once
        assert "a restart loses the work" in proc.stdout  # the summary's store lines
    assert data["store"]["lost_claims"] == 0


def test_a_cluster_is_asked_on_every_master(shared_cluster):
    _reset(shared_cluster)

    async def main() -> str:
        store = RedisStore(shared_cluster.url)
        try:
            return await store.persistence()
        finally:
            await store.close()

    assert asyncio.run(main()) == "none"


def test_a_restart_that_lost_the_state_counts_the_claimed_jobs_it_took():
    with RedisServer() as server:

        async def main() -> tuple[int, StoreCounts]:
            a = RedisStore(server.url, namespace="d1")
            try:
                await a.enqueue([{"n": i} for i in range(8)])
                jobs = await a.claim("a", 5)
                await a.finish("a", [Finished(jobs[0].id, Ending.SUCCEEDED, 1)])
                server.stop()
                server.start()  # empty: the stream, the claims, the counts are gone
                for _ in range(20):  # the old connection fails once (as a journal's write would: next tick)
                    try:
                        await a.check()
                        break
                    except StoreError:
                        await asyncio.sleep(0.05)
                await a.enqueue([{"n": i} for i in range(3)])  # new work in the new state
                await a.finish("a", [Finished(j.id, Ending.SUCCEEDED, 1) for j in jobs[1:]])
                assert a.lost_claims == 4  # claimed, unfinished, gone with the state
                new = await a.claim("a", 5)
                await a.finish("a", [Finished(j.id, Ending.SUCCEEDED, 1) for j in new])
                return a.lost_claims, await a.counts()
            finally:
                await a.close()

        lost, counts = asyncio.run(main())
    # the old endings were not written against the new state (job ids start again there)
    assert lost == 4 and counts.done == {"succeeded": 3} and counts.pending == 0
    lines = store_lines(
        StoreReport("redis://x", counts, 0, False, 3, 0, persistence="none", lost_claims=lost)
    )
    assert any("a restart loses the work" in line for line in lines)
    assert any("lost 4 claimed jobs" in line for line in lines)
