"""`ratedeck status --store URL`: a store's jobs by state, read from real stores made by real runs.

SQLite: jobs enqueued, a run killed with kill -9 a third of the way (its jobs left
sending), then `--resume` (no Idempotency-Key: those become uncertain) to the end;
status is read after each and checked against the file itself. Redis: a real
redis-server (tests/support/redis_server.py). The CLI runs in a child process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ratedeck.runner.cli import main
from tests.store.test_store_cli import JOBS, JobTarget, _config, _enqueue, _kill_mid_run, _run, _states

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


def status(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        RATEDECK + ["status", "--store", url, *extra], capture_output=True, text=True, timeout=60
    )


def status_json(url: str) -> dict:
    proc = status(url, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_state_in_file(db: Path) -> dict[str, int]:
    """The same five counts, straight from the SQLite file."""
    counts: Counter[str] = Counter()
    for state, ending in _states(db).values():
        if state in ("claimed", "sending"):
            counts["sending"] += 1
        elif state == "done":
            counts["graveyard" if ending == "graveyard" else "done"] += 1
        else:
            counts[state] += 1
    return {s: counts[s] for s in ("pending", "sending", "done", "uncertain", "graveyard")}


@pytest.mark.slow
def test_status_reads_a_sqlite_store_a_killed_run_and_its_resume_left(tmp_path):
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    url = f"sqlite:{db}"
    with JobTarget(delay_s=0.3) as target:
        cfg = _config(tmp_path, target, idempotent=False)
        _enqueue(tmp_path, db)
        assert status_json(url) == {
            "store": url,
            "pending": JOBS,
            "sending": 0,
            "done": 0,
            "uncertain": 0,
            "graveyard": 0,
            "total": JOBS,
        }
        _kill_mid_run(cfg, db, target)
        killed = status_json(url)
        assert killed["sending"] > 0 and killed["pending"] > 0, killed  # the dead run's jobs
        assert {k: killed[k] for k in by_state_in_file(db)} == by_state_in_file(db)
        proc = _run(cfg, db, report, "--resume")
    assert proc.returncode == 0, proc.stderr
    after = status_json(url)
    assert after["pending"] == after["sending"] == 0 and after["total"] == JOBS
    assert after["uncertain"] > 0 and after["graveyard"] > 0 and after["done"] > 0, after  # every state
    assert {k: after[k] for k in by_state_in_file(db)} == by_state_in_file(db)
    # the resumed run's progress: the jobs pending as it started, every one of them ended
    progress = json.loads(report.read_text())["progress"]
    assert progress["total"] == progress["done"] == killed["pending"] + killed["sending"] - after["uncertain"]
    assert progress["eta_s"] == 0.0 and progress["fraction"] == 1.0
    # and the lines a person reads: each state, done with its endings
    text = status(url).stdout.splitlines()
    assert text[0] == f"store        {url}"
    assert [line.split()[0] for line in text[1:]] == [
        "pending",
        "sending",
        "done",
        "uncertain",
        "graveyard",
        "total",
    ]
    assert f"(succeeded {after['done']:,})" in text[3], text


@pytest.mark.slow
def test_status_reads_a_redis_store(redis_server, tmp_path):
    from ratedeck.store.redis import RedisStore

    url = redis_server.url
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"job": i}) + "\n" for i in range(50)))
    enqueue = subprocess.run(
        RATEDECK + ["enqueue", "--store", url, str(jobs)], capture_output=True, text=True
    )
    assert enqueue.returncode == 0, enqueue.stderr
    assert status_json(url) | {"store": ""} == {
        "store": "",
        "pending": 50,
        "sending": 0,
        "done": 0,
        "uncertain": 0,
        "graveyard": 0,
        "total": 50,
    }

    async def claim() -> None:
        store = RedisStore(url)
        try:
            await store.claim("a-member", 12)
        finally:
            await store.close()

    asyncio.run(claim())
    seen = status_json(url)
    assert (seen["pending"], seen["sending"], seen["total"]) == (38, 12, 50)


def test_a_bad_store_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a store\n")
    cases = {
        f"sqlite:{tmp_path / 'missing.db'}": "no such file",
        f"sqlite:{tmp_path / 'notes.txt'}": "not a SQLite database",
        f"sqlite:{tmp_path}": "is a directory",
        "memory": "memory keeps no jobs",
        "ftp://example": "not a store",
        "redis://127.0.0.1:1/0": "Redis did not answer",
    }
    for url, said in cases.items():
        assert main(["status", "--store", url]) == 2, url
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and said in err and "Traceback" not in err, (url, err)
    assert not (tmp_path / "missing.db").exists()  # status creates nothing
    assert main(["status"]) == 2
    assert "--store" in capsys.readouterr().err
