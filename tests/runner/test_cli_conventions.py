"""The command behaves as command-line tools do: --version, --help naming every command,
durations with units on every flag that takes a time, `--report -` for pipes, shell
completion."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ratedeck.runner.cli import main
from ratedeck.runner.commands import COMMANDS
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _cli(tmp_path, *argv, timeout=60):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    return subprocess.run(
        RATEDECK + list(argv), capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env
    )


def test_version(tmp_path):
    from importlib.metadata import version

    proc = _cli(tmp_path, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"ratedeck {version('ratedeck')}"


def test_help_lists_every_subcommand_with_one_line(tmp_path):
    proc = _cli(tmp_path, "--help")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    start = lines.index("commands:")
    listed = {line.split()[0]: line for line in lines[start + 1 :] if line.startswith("  ") and line.split()}
    for name in ("serve", "bench", "sweep", "replay", "config", "completion"):
        assert name in COMMANDS and name in listed and len(listed[name].split()) > 2, name
    assert "99" in proc.stdout and "exit codes" in proc.stdout.lower()
    for name in COMMANDS:  # each one answers --help
        sub = _cli(tmp_path, name, "--help")
        assert sub.returncode == 0 and "usage" in sub.stdout.lower(), name


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--no-ui", "--duration", "5 parsecs"], "--duration"),
        (["--no-ui", "--ttl", "3 fortnights"], "--ttl"),
        (["--no-ui", "--interval", "1 jiffy"], "--interval"),
        (["--no-ui", "--metrics-port", "0", "--metrics-linger", "2 eons"], "--metrics-linger"),
        (["sweep", "--duration", "5 parsecs"], "--duration"),
        (["sweep", "--ttl", "5 parsecs"], "--ttl"),
        (["bench", "--duration", "5 parsecs"], "--duration"),
        (["replay", "x.jsonl", "--duration", "5 parsecs"], "--duration"),
        (["config", "show", "--ttl", "nan"], "--ttl"),
    ],
)
def test_a_bad_duration_is_one_line_exit_2_everywhere(capsys, argv, needle):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_durations_take_units_everywhere(capsys):
    import argparse

    from ratedeck.runner.cli import build_parser, overrides_from_args
    from ratedeck.runner.commands.common import durations_as_seconds as _durations_as_seconds
    from ratedeck.runner.sweep import build_parser as sweep_parser

    args = build_parser().parse_args(["--duration", "2m", "--ttl", "500ms", "--interval", "1.5s"])
    o = overrides_from_args(args)
    assert o["run"]["duration_s"] == 120 and o["engine"]["ttl_s"] == 0.5 and o["run"]["interval_s"] == 1.5
    sweep = sweep_parser().parse_args(["--duration", "1m", "--ttl", "250ms"])
    assert (sweep.duration, sweep.ttl) == (60, 0.25)
    assert _durations_as_seconds(["--quick", "--duration", "2m"], ("--duration",)) == [
        "--quick",
        "--duration",
        "120.0",
    ]
    assert _durations_as_seconds(["--duration=90s"], ("--duration",)) == ["--duration=90.0"]
    assert isinstance(args, argparse.Namespace)


@pytest.mark.slow
def test_report_dash_writes_json_to_stdout_and_the_rest_to_stderr(tmp_path):
    proc = _cli(tmp_path, "--no-ui", "--duration", "1s", "--interval", "500ms", "--report", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # nothing else on stdout
    assert validate(data) == [] and data["requests"]["succeeded"] > 0
    assert "final summary" in proc.stderr and "--- ratedeck metrics at" in proc.stderr
    assert "report written" not in proc.stderr + proc.stdout
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_is_valid_shell(tmp_path, shell):
    proc = _cli(tmp_path, "completion", shell)
    assert proc.returncode == 0
    script = proc.stdout
    for word in (
        "--fail-on",
        "--metrics-port",
        "replay",
        "config",
        "complete -o default -F _ratedeck ratedeck",
    ):
        assert word in script
    if shutil.which("bash"):
        check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_bash_completion_completes(tmp_path):
    script = _cli(tmp_path, "completion", "bash").stdout
    probe = (
        script
        + '\nCOMP_WORDS=(ratedeck --fail); COMP_CWORD=1; _ratedeck; echo "${COMPREPLY[@]}"'
        + '\nCOMP_WORDS=(ratedeck rep); COMP_CWORD=1; _ratedeck; echo "${COMPREPLY[@]}"'
        + '\nCOMP_WORDS=(ratedeck config s); COMP_CWORD=2; _ratedeck; echo "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.splitlines()
    assert out == ["--fail-on", "replay", "show"]


def test_completion_without_a_shell_is_exit_2(capsys):
    assert main(["completion"]) == 2
    assert main(["completion", "fish"]) == 2
    assert "bash" in capsys.readouterr().err


def test_the_startup_interrupt_exits_with_the_interrupted_code():
    """The handler that runs before any import writes the code out; it must be ExitCode's."""
    from ratedeck.core.exits import ExitCode
    from ratedeck.runner import INTERRUPTED

    assert INTERRUPTED == ExitCode.INTERRUPTED
