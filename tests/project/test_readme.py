"""The README's promises: its first two commands, its commands parse as written, its library
example runs as printed, and it stays a README (under 300 lines; the rest is in docs/)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_commands import check, commands

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_readme_starts_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    install_run, install_test = blocks[0].strip(), blocks[1].strip()
    assert README.index(blocks[0]) < README.index("## What it is")
    assert install_run.endswith(".venv/bin/ratedeck") and "pip install -e ." in install_run
    assert install_test.endswith(".venv/bin/pytest") and "'.[test]'" in install_test
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "pytest" in ci and "bash .ci/deps" in ci and install_test.startswith("bash .ci/deps && ")


@pytest.mark.slow
def test_library_example_runs(tmp_path):
    section = README[README.index("## As a library") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "[200, 200, 200, 200, 200]" in proc.stdout and "'status': 'OK'" in proc.stdout


def test_the_readme_stays_under_300_lines():
    """Reference material goes to docs/ (tests/project/test_docs.py checks those pages)."""
    assert len(README.splitlines()) < 300


def test_the_usage_commands_parse_and_load_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("MY_KEYS", "GH_TOKENS"):
        monkeypatch.setenv(name, "tok_0000000000000001,tok_0000000000000002")
    (tmp_path / "my.toml").write_text("[workload]\nrate = 50\n")
    section = README[README.index("## Usage") :]
    section = section[: section.index("\n## ", 5)]
    found = commands(section)
    assert [argv[:1] for argv in found].count(["serve"]) == 1 and len(found) >= 6
    for argv in found:
        check(argv)


def test_every_preset_recipe_loads_as_written(tmp_path, monkeypatch):
    """Each preset's README command parses and loads (keys from the environment or a file)."""
    import shlex

    from ratedeck.config import load_config
    from ratedeck.runner.cli import build_parser, overrides_from_args

    section = README[README.index("## Real APIs: presets") :]
    section = section[: section.index("\n## ", 5)]
    commands = [
        line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()
    ]
    writes = [c for c in commands if c.startswith("printf ") and c.endswith(".toml")]  # a config, as written
    commands = [c for c in commands if c.startswith("ratedeck ")]
    assert {c.split("--preset ")[1].split()[0] for c in commands} == {
        "github",
        "stripe",
        "binance",
        "kraken",
        "openai",
        "anthropic",
        "azure-openai",
        "openai-compatible",
    }
    monkeypatch.chdir(tmp_path)
    for name in ("GH_TOKENS", "STRIPE_KEYS", "OPENAI_KEYS", "ANTHROPIC_KEYS", "TOGETHER_KEYS"):
        monkeypatch.setenv(name, "tok_0000000000000001,tok_0000000000000002")
    monkeypatch.setenv("AZURE_KEY", "tok_0000000000000003")  # an Azure resource: one key
    (tmp_path / "binance.keys").write_text("MY_API_KEY MY_SECRET\n")
    (tmp_path / "kraken.keys").write_text("MY_API_KEY c2VjcmV0\n")
    for file in ("queries.jsonl", "charges.jsonl", "calls.jsonl", "prompts.jsonl"):
        (tmp_path / file).write_text('{"_path": "/x"}\n')
    assert writes
    for line in writes:
        subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True)
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])
        cfg = load_config(args.config, args.preset, overrides_from_args(args))
        es = cfg.engine_settings
        assert cfg.runner.preset == args.preset and es.keys
        if es.endpoints:  # a pool from the config file: its endpoints' URLs and keys
            assert args.target is None and all(k.endpoint is not None for k in es.keys)
            assert es.target.url == es.endpoints[0].target.url and es.endpoints[0].preset == args.preset
        else:
            assert es.target.url == args.target
