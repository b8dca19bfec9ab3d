"""`--fail-on EXPR`: a run fails with exit 99 when an expression holds over its report.

The end-to-end case is the issue's: against the embedded simulator (study mode: 20/1s per
key, whatever the run is told), a run told 30/1s meets real 429s; with
`--fail-on "rejected_429>0"` it exits 99 and says which threshold failed with the value,
without it it exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ratedeck.core.exits import ExitCode
from ratedeck.runner import thresholds as th
from ratedeck.runner.cli import main
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _cli(tmp_path, *argv):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    return subprocess.run(
        RATEDECK + list(argv), capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env
    )


# ---------------------------------------------------------------- the target


@pytest.mark.slow
def test_a_run_told_a_higher_limit_fails_its_threshold_and_passes_without_it(tmp_path):
    report = tmp_path / "r.json"
    # Told 30/1s per key and offered that much, against a seed server that allows 20/1s.
    flags = ["--no-ui", "--limit", "30/1s", "--rate", "150", "--duration", "3s", "--interval", "10s"]
    failing = _cli(tmp_path, *flags, "--fail-on", "rejected_429>0", "--report", str(report))
    assert failing.returncode == ExitCode.THRESHOLD == 99, failing.stderr
    data = json.loads(report.read_text())
    assert validate(data) == []
    n = data["requests"]["rejected_429"]
    assert n > 0 and data["server"]["totals"]["rejected_429"] > 0  # the simulator really rejects at 20/1s
    line = f"ratedeck: threshold failed: rejected_429>0 (requests.rejected_429 = {n})"
    assert line in failing.stderr.splitlines()
    assert f"threshold    FAILED rejected_429>0 (requests.rejected_429 = {n})" in failing.stdout
    assert data["thresholds"] == [
        {"expression": "rejected_429>0", "field": "requests.rejected_429", "value": n, "failed": True}
    ]
    passing = _cli(tmp_path, *flags)
    assert passing.returncode == 0, passing.stderr
    assert "threshold" not in passing.stdout + passing.stderr


@pytest.mark.slow
def test_thresholds_that_do_not_hold_exit_0_and_config_fail_on_counts(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('preset = "study"\n[run]\nfail_on = ["graveyard>0", "latency_ms.p99>60000"]\n')
    report = tmp_path / "r.json"
    ok = _cli(tmp_path, "--no-ui", "--config", str(config), "--duration", "1s", "--report", str(report))
    assert ok.returncode == 0, ok.stderr
    assert [t["failed"] for t in json.loads(report.read_text())["thresholds"]] == [False, False]
    assert "threshold    ok     graveyard>0 (requests.graveyard = 0)" in ok.stdout
    # flags replace the config's list
    bad = _cli(tmp_path, "--no-ui", "--config", str(config), "--duration", "1s", "--fail-on", "tps<100000")
    assert bad.returncode == 99 and "threshold failed: tps<100000 (throughput_tps = " in bad.stderr
    assert "graveyard>0" not in bad.stdout


# ---------------------------------------------------------------- bad expressions: exit 2 before the run


@pytest.mark.parametrize(
    "expr,needle",
    [
        ("foo>>1", "unknown field 'foo'"),
        ("rejected_429>>1", "is not a number"),
        ("latency_ms.p99 > 5 parsecs", "'5 parsecs' is not a number"),
        ("rejected_428>0", "did you mean rejected_429"),
        ("requests", "is not FIELD OP VALUE"),
        ("rejected_429 = 0", "is not FIELD OP VALUE"),
        ("balance_ok>1", "compare it with == or !="),
        ("latency_ms.p99>inf", "not a number"),
        ("keys>0", "unknown field 'keys'"),
    ],
)
def test_a_malformed_threshold_is_one_line_and_exit_2(capsys, expr, needle):
    code = main(["--no-ui", "--duration", "30s", "--fail-on", "rejected_429>0", "--fail-on", expr])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ratedeck: command line: --fail-on: ") and needle in err
    assert "ratedeck metrics" not in out  # nothing ran


def test_a_bad_threshold_in_the_config_names_the_file(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('preset = "study"\n[run]\nfail_on = ["rejected_429>0", "nope<1"]\n')
    assert main(["--no-ui", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{config}: run.fail_on[1]: unknown field 'nope'" in err
    config.write_text('preset = "study"\n[run]\nfail_on = 3\n')
    assert main(["--no-ui", "--config", str(config)]) == 2
    assert "run.fail_on" in capsys.readouterr().err


# ---------------------------------------------------------------- the expression language


def test_fields_aliases_and_operators():
    report = {
        "requests": {"rejected_429": 3, "graveyard": 0, "succeeded": 10},
        "latency_ms": {"p99": 250.0},
        "throughput_tps": 89.5,
        "balance_ok": True,
        "failures": {"timeout": 2},
        "server": {"totals": {"escalations": 0}},
    }
    cases = {
        "rejected_429>0": True,
        "requests.rejected_429 >= 3": True,
        "rejected_429<3": False,
        "rejected_429<=3": True,
        "rejected_429==3": True,
        "rejected_429!=3": False,
        "graveyard>0": False,
        "tps<90": True,
        "throughput_tps<89": False,
        "latency_ms.p99>500": False,
        "p99>=250": True,
        "balance_ok==false": False,
        "balance_ok!=false": True,
        "failures.timeout>1": True,
        "failures.connection_refused>0": False,  # a cause that never happened is 0
        "server.totals.escalations>0": False,
    }
    thresholds = [th.parse(e) for e in cases]
    verdicts = th.evaluate(thresholds, report)
    assert {v.threshold.expression: v.failed for v in verdicts} == cases


def test_a_field_missing_from_the_report_fails_the_threshold():
    (v,) = th.evaluate([th.parse("messages.failed>0")], {"requests": {}})
    assert v.failed and v.actual is None and "not in this run's report" in v.line()


def test_every_requests_counter_has_its_short_name():
    aliases = th.aliases()
    for name in ("rejected_429", "graveyard", "expired", "succeeded", "shed", "failed", "generated"):
        assert aliases[name] == f"requests.{name}"
