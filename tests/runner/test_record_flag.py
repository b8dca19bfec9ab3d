"""`--record FILE`: the run's answers recorded for replay (engine/observe/recording.py), asked
for on the command line; a path that cannot be written is one line and exit 2 before the run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ratedeck.engine.path.replay import replay

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
SECRET = "sk-RECORDME-4f7a9c"


def _cli(tmp_path: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"))
    return subprocess.run(
        RATEDECK + list(argv), capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env
    )


@pytest.mark.parametrize(
    ("where", "says"),
    [("no/such/dir/run.jsonl", "no such directory no/such/dir"), (".", "is a directory")],
)
def test_a_recording_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, where, says):
    proc = _cli(tmp_path, "--no-ui", "--duration", "1", "--record", where)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"ratedeck: recording {where}: {says}\n"
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_a_run_records_its_answers_with_their_rate_limit_headers_and_no_key(tmp_path):
    # The embedded simulator allows 20/1s and says so in its headers; the run is told 25/1s.
    (tmp_path / "server.toml").write_text(
        '[server]\nmode = "standard"\npolicies = ["20/1s"]\nratelimit_headers = true\nretry_after = true\n'
    )
    argv = ["--no-ui", "--config", "server.toml", "--keys", SECRET, "--limit", "25/1s"]
    proc = _cli(tmp_path, *argv, "--duration", "2", "--interval", "3600", "--record", "run.jsonl")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "run.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert SECRET not in text and SECRET[-4:] not in text  # neither the key nor its shown tail
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["keys"] == {"k1": ["25/1s"]} and len(lines) > 20
    headers = {name.lower() for line in lines[1:] for name in line.get("headers", {})}
    assert {"ratelimit-policy", "x-ratelimit-remaining"} <= headers
    assert not headers & {"content-type", "date", "server", "content-length"}
    # Replayed: the limit the server advertises is adopted at its first answer.
    key = replay(path).keys["k1"]
    assert key.estimate[:2] == [(0.0, 25, "told"), (lines[1]["at"], 20, "advertised")]
    # Without the flag, nothing is recorded.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "server.toml").write_text((tmp_path / "server.toml").read_text())
    proc = _cli(plain, *argv, "--duration", "1", "--interval", "3600")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in plain.rglob("*") if p.is_file()] == ["server.toml"]
