"""Every file ratedeck creates is its user's alone: 0600, in directories of its own 0700,
whatever the umask (core/files.py, the one place files are created; docs/files.md).

The real CLI in child processes, under a HOME and XDG directories of the test's own and
a permissive umask (0o022: what most systems give a user, under which a plain `open`
makes 0644 files anyone can read).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratedeck.core.files import private_dir, private_open, private_write_text
from ratedeck.store.sqlite import SqliteStore
from tests.store.test_store_cli import JobTarget, _config

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def _env(home: Path) -> dict[str, str]:
    """The environment of a user whose HOME is `home`, with no XDG directory made yet."""
    return dict(
        os.environ,
        HOME=str(home),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CONFIG_HOME=str(home / ".config"),
    )


def _ratedeck(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RATEDECK, *args], capture_output=True, text=True, timeout=90, env=env)


# ---------------------------------------------------------------- the helper


def test_a_new_file_is_0600_whatever_the_umask(tmp_path):
    for i, mask in enumerate((0o022, 0o000, 0o277)):
        path = tmp_path / f"new{i}.jsonl"
        with umask(mask), private_open(path, "w", encoding="utf-8") as fh:
            fh.write("x\n")
        assert mode(path) == 0o600, oct(mask)
        assert path.read_text() == "x\n"


def test_a_file_it_empties_is_tightened_one_it_adds_to_is_left_as_the_user_set_it(tmp_path):
    emptied, added = tmp_path / "emptied.json", tmp_path / "added.jsonl"
    for path in (emptied, added):
        path.write_text("old\n")
        path.chmod(0o644)
    private_write_text(emptied, "new\n")
    with private_open(added, "a", encoding="utf-8") as fh:
        fh.write("more\n")
    assert (mode(emptied), emptied.read_text()) == (0o600, "new\n")
    assert (mode(added), added.read_text()) == (0o644, "old\nmore\n")  # the user's file, the user's mode
    group_only = tmp_path / "group.json"
    group_only.write_text("")
    group_only.chmod(0o640)
    private_write_text(group_only, "{}\n")
    assert mode(group_only) == 0o600  # never loosened, only tightened


def test_a_device_or_a_pipe_is_written_as_it_is(tmp_path):
    with private_open(os.devnull, "w", encoding="utf-8") as fh:  # no chmod of a file not ours
        fh.write("gone\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o644)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with private_open(fifo, "w", encoding="utf-8") as fh:
            fh.write("through\n")
        assert os.read(reader, 100) == b"through\n"
    finally:
        os.close(reader)
    assert mode(fifo) == 0o644


def test_directories_it_makes_are_0700_and_those_it_finds_are_left(tmp_path):
    tmp_path.chmod(0o755)
    with umask(0o022):
        made = private_dir(tmp_path / "a" / "b" / "c")
    assert made == tmp_path / "a" / "b" / "c"
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", made)] == [0o700] * 3
    assert mode(tmp_path) == 0o755
    private_dir(tmp_path)  # there already: nothing changes
    assert mode(tmp_path) == 0o755
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        private_dir(tmp_path / "file" / "sub")


def test_a_sqlite_stores_files_wal_and_shm_included_are_0600(tmp_path):
    import asyncio

    db = tmp_path / "jobs.db"
    with umask(0o022):
        store = SqliteStore.open(str(db))
        try:
            asyncio.run(store.enqueue([{"job": 1, "prompt": "mine"}]))
            files = sorted(p.name for p in tmp_path.iterdir())
            assert "jobs.db-wal" in files and "jobs.db-shm" in files, files  # while it is open
            assert {p.name: mode(p) for p in tmp_path.iterdir()} == dict.fromkeys(files, 0o600)
        finally:
            asyncio.run(store.close())
    assert mode(db) == 0o600


# ---------------------------------------------------------------- the CLI, as a user runs it


@pytest.mark.slow
def test_every_file_a_run_creates_is_0600_and_its_directories_0700(tmp_path):
    home = tmp_path / "home"
    out = home / "out"  # the user's own directory: ratedeck writes in it, does not make it
    out.mkdir(parents=True)
    env = _env(home)
    jobs = home / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"job": i}) + "\n" for i in range(1, 31)))  # 3 refused: 400
    theirs = {p: mode(p) for p in (home, out, jobs)}
    with umask(0o022), JobTarget(delay_s=0.01) as target:
        cfg = _config(home, target, idempotent=False)
        theirs[cfg] = mode(cfg)
        db = out / "jobs.db"
        enq = _ratedeck(env, "enqueue", "--store", f"sqlite:{db}", str(jobs))
        assert enq.returncode == 0, enq.stderr
        outputs = [out / n for n in ("results.jsonl", "errors.jsonl", "graveyard.jsonl", "report.json")]
        run = _ratedeck(
            env,
            "--no-ui",
            "--config",
            str(cfg),
            "--store",
            f"sqlite:{db}",
            "--results",
            str(outputs[0]),
            "--errors",
            str(outputs[1]),
            "--graveyard",
            str(outputs[2]),
            "--report",
            str(outputs[3]),
        )
        assert "graveyard: 3 requests" in run.stdout, run.stdout + run.stderr
        saved = _ratedeck(env, "--config", str(cfg), "--save-config", str(out / "saved.toml"))
        assert saved.returncode == 0, saved.stderr
        # No graveyard named and no report: it goes to the XDG state directory, made now.
        auto = _ratedeck(env, "--no-ui", "--config", str(cfg), "--workload", str(jobs))
        assert "graveyard: 3 requests in" in auto.stdout, auto.stdout + auto.stderr
    for path in (*outputs, db, out / "saved.toml"):
        assert path.stat().st_size > 0, path
    with sqlite3.connect(db) as con:  # the store holds every job, each ended
        assert con.execute("SELECT count(*) FROM jobs WHERE state = 'pending'").fetchone() == (0,)
    state = home / ".local" / "state" / "ratedeck"
    graves = list(state.glob("graveyard-*.jsonl"))
    assert len(graves) == 1 and graves[0].stat().st_size > 0
    made_dirs = [home / ".local", home / ".local" / "state", state]
    assert {str(p): oct(mode(p)) for p in made_dirs} == dict.fromkeys(map(str, made_dirs), oct(0o700))
    created = [p for p in home.rglob("*") if p not in theirs and p not in made_dirs]
    assert created, "the run created no file"
    assert {str(p): oct(mode(p)) for p in created} == dict.fromkeys(map(str, created), oct(0o600))
    assert {p: mode(p) for p in theirs} == theirs  # the user's own files and directories untouched
