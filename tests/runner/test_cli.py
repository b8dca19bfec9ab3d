"""The `ratedeck` command as a user meets it: bad input, headless runs, Ctrl-C/SIGTERM, secrets."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tomllib

import pytest

from ratedeck.config import load_config
from ratedeck.core.study_server import STUDY_KEYS
from ratedeck.runner.cli import main
from tests.runner.test_report_schema import accounted, validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "content,needles",
    [
        ('[engine]\nin_flight_per_key = "x"\n', ["engine.in_flight_per_key", "whole number", "'x'"]),
        ("[engine]\nqueue_max = 0\n", ["engine.queue_max", "at least 1"]),
        ("[enigne]\nqueue_max = 3\n", ["enigne", "unknown section"]),
        ('[engine]\nheadroom = "wide"\n', ["engine.headroom", "wide"]),
        ('[keys]\nsecrets = ["env:RATEDECK_TEST_NOPE"]\n', ["keys.secrets[0]", "RATEDECK_TEST_NOPE"]),
        ('[keys]\nsecrets = ["a-key-1234567"]\nlimits = ["fast"]\n', ["keys.limits", "fast"]),
        ('[target]\nurl = "ftp://x"\n', ["target.url", "http://"]),
        ("this is not toml", ["not valid TOML"]),
    ],
)
def test_a_bad_config_gets_one_clear_line_and_exit_2(tmp_path, capsys, content, needles):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    code, out, err = run_cli(capsys, "--config", str(path), "--no-ui")
    assert code == 2
    assert err.count("\n") == 1 and str(path) in err
    for needle in needles:
        assert needle in err
    assert "Traceback" not in err + out


def test_missing_config_file_and_bad_flags(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "nope.toml" in err and "no such file" in err
    code, _, err = run_cli(capsys, "--limit", "abc", "--no-ui")
    assert code == 2 and "keys.limits" in err and "abc" in err
    code, _, err = run_cli(capsys, "--headroom", "lots", "--no-ui")
    assert code == 2 and "--headroom" in err
    code, _, err = run_cli(capsys, "--keys", "@" + str(tmp_path / "keys.txt"), "--no-ui")
    assert code == 2 and "keys.txt" in err


def test_save_config_round_trips_and_never_writes_a_literal_key(tmp_path, capsys):
    out_path = tmp_path / "profile.toml"
    code, _, _ = run_cli(
        capsys,
        "--keys",
        "SECRET-AAAA-1111,SECRET-BBBB-2222",
        "--limit",
        "10/1s",
        "--limit",
        "500/1h",
        "--in-flight",
        "3",
        "--save-config",
        str(out_path),
    )
    assert code == 0
    text = out_path.read_text()
    assert "SECRET-AAAA" not in text and "env:RATEDECK_KEYS" in text
    data = tomllib.loads(text)
    assert data["keys"]["limits"] == ["10/1s", "500/1h"] and data["engine"]["in_flight_per_key"] == 3
    os.environ["RATEDECK_KEYS"] = "SECRET-AAAA-1111,SECRET-BBBB-2222"
    try:
        cfg = load_config(str(out_path))
    finally:
        del os.environ["RATEDECK_KEYS"]
    assert [k.secret for k in cfg.engine_settings.keys] == ["SECRET-AAAA-1111", "SECRET-BBBB-2222"]
    # a seed-preset profile keeps the preset instead of the keys
    code, _, _ = run_cli(capsys, "--save-config", str(tmp_path / "seed.toml"))
    saved = (tmp_path / "seed.toml").read_text()
    assert 'preset = "study"' in saved and STUDY_KEYS[0] not in saved
    assert load_config(str(tmp_path / "seed.toml")).engine_settings.keys == load_config().engine_settings.keys


@pytest.mark.slow
def test_headless_run_reports_balanced_accounts_and_masks_keys(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        RATEDECK
        + [
            "--no-ui",
            "--duration",
            "3",
            "--interval",
            "1",
            "--report",
            str(report),
            "--plot",
            "--graveyard",
            str(tmp_path / "g.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--- ratedeck metrics at" in proc.stdout and "final summary" in proc.stdout
    assert "Throughput per second" in proc.stdout  # the plot
    data = json.loads(report.read_text())
    assert validate(data) == []  # the report schema (runner/report.schema.json)
    req = data["requests"]
    assert data["balance_ok"] and req["succeeded"] > 100 and req["rejected_429"] == 0
    # The engine runs on uvloop where it is installed (a dependency off Windows), and says so.
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert data["client"]["loop"] == loop and f"1 process on {loop}" in proc.stdout
    # the loop's lateness as p50/p99 on the client line, and the run's in the report
    assert re.search(r"loop late p50 [\d.]+ ms p99 [\d.]+ ms, up to [\d.]+ ms", proc.stdout)
    assert data["loop"]["ticks"] >= 10 and data["loop"]["cpu_s"] == data["client"]["cpu_s"]
    assert req["generated"] == accounted(req)
    for name in (
        "duration_s",
        "capacity_tps",
        "throughput_tps",
        "latency_ms",
        "headroom_ms",
        "queues",
        "keys",
    ):
        assert name in data
    everything = proc.stdout + proc.stderr + report.read_text()
    assert not any(key in everything for key in STUDY_KEYS)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_stops_gracefully_with_report(tmp_path, sig):
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        RATEDECK + ["--no-ui", "--interval", "0.5", "--report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        for line in proc.stdout:  # wait for real traffic, not for wall time
            if line.startswith("requests") and "succeeded 0 " not in line:
                break
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopping" in out and "final summary" in out and "Traceback" not in err
    data = json.loads(report.read_text())
    assert validate(data) == []
    assert data["balance_ok"] and data["requests"]["succeeded"] > 0
