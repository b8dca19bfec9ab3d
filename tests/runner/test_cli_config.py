"""The user config file ($XDG_CONFIG_HOME/ratedeck/config.toml): read when no --config is
given, under the flags; `ratedeck config path` and `config show` (keys masked)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ratedeck.config import ConfigError
from ratedeck.core import paths
from ratedeck.core.study_server import STUDY_KEYS
from ratedeck.runner.cli import build_parser, main
from ratedeck.runner.commands.run import load_run_config

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


@pytest.fixture
def xdg(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def _user_config(xdg: Path, text: str) -> Path:
    path = xdg / "ratedeck" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _cfg(*argv):
    return load_run_config(build_parser().parse_args(list(argv)))


def test_paths_follow_xdg(xdg, monkeypatch):
    assert paths.user_config_path() == xdg / "ratedeck" / "config.toml"
    assert paths.user_themes_dir() == xdg / "ratedeck" / "themes"
    assert paths.profile_save_path(None) == paths.user_config_path()
    assert paths.profile_save_path("mine.toml") == Path("mine.toml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert paths.user_config_path() == Path.home() / ".config" / "ratedeck" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # not absolute: ignored, as the spec says
    assert paths.config_dir() == Path.home() / ".config" / "ratedeck"


def test_the_user_config_is_read_under_the_flags(xdg, tmp_path):
    cfg, source = _cfg()
    assert source is None and cfg.engine_settings.engine.in_flight_per_key != 3
    path = _user_config(
        xdg, '[engine]\nin_flight_per_key = 3\nttl_s = "2s"\n[console]\ntheme = "ratedeck-light"\n'
    )
    cfg, source = _cfg()
    assert source == str(path)
    assert (
        cfg.engine_settings.engine.in_flight_per_key == 3
        and cfg.engine_settings.engine.ttl_s == 2
        and cfg.console.theme == "ratedeck-light"
    )
    assert [k.secret for k in cfg.engine_settings.keys] == list(
        STUDY_KEYS
    )  # the study preset fills in the rest
    cfg, _ = _cfg("--in-flight", "5")  # flags win
    assert cfg.engine_settings.engine.in_flight_per_key == 5 and cfg.engine_settings.engine.ttl_s == 2
    other = tmp_path / "other.toml"
    other.write_text('preset = "study"\n[engine]\nttl_s = 4.0\n')
    cfg, source = _cfg("--config", str(other))  # --config replaces it
    assert (
        source == str(other)
        and cfg.engine_settings.engine.ttl_s == 4
        and cfg.engine_settings.engine.in_flight_per_key != 3
    )


def test_a_user_config_with_its_own_target_and_keys(xdg):
    _user_config(
        xdg, '[target]\nurl = "https://api.example.com/v1"\n[keys]\nsecrets = ["user-key-000000001"]\n'
    )
    cfg, _ = _cfg()
    assert cfg.engine_settings.target.url == "https://api.example.com/v1" and [
        k.secret for k in cfg.engine_settings.keys
    ] == ["user-key-000000001"]
    cfg, _ = _cfg("--target", "https://other.example.com/x")
    assert [k.secret for k in cfg.engine_settings.keys] == [
        "user-key-000000001"
    ]  # the user's keys, never the demo keys


def test_a_target_flag_without_keys_still_never_gets_the_demo_keys(xdg, capsys):
    _user_config(xdg, "[engine]\nin_flight_per_key = 3\n")
    assert main(["--no-ui", "--target", "https://api.example.com/v1"]) == 2
    assert "no API keys given" in capsys.readouterr().err


def test_a_bad_user_config_is_one_line_naming_it(xdg, capsys):
    path = _user_config(xdg, "[engine]\nin_flight_per_key = 0\n")
    assert main(["--no-ui"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "engine.in_flight_per_key" in err
    _user_config(xdg, "this is = = not toml")
    assert main(["--no-ui"]) == 2
    assert str(path) in capsys.readouterr().err
    # a bad flag is the flag's fault, not the file's
    _user_config(xdg, "[engine]\nin_flight_per_key = 3\n")
    assert main(["--no-ui", "--ttl", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--ttl" in err and str(path) not in err


def test_config_path_and_show(xdg, tmp_path, monkeypatch):
    env = dict(os.environ, XDG_CONFIG_HOME=str(xdg), MY_TEST_KEYS="env-key-aaaa-0001,env-key-bbbb-0002")
    run = lambda *a: subprocess.run(RATEDECK + list(a), capture_output=True, text=True, env=env, timeout=60)  # noqa: E731
    proc = run("config", "path")
    assert proc.returncode == 0 and proc.stdout.strip() == str(xdg / "ratedeck" / "config.toml")
    assert run("config", "path", "--themes").stdout.strip() == str(xdg / "ratedeck" / "themes")

    _user_config(
        xdg,
        '[engine]\nin_flight_per_key = 3\n[target]\nparams = { token = "literal-secret-key-123" }\n'
        '[keys]\nsecrets = ["literal-secret-key-123", "another-secret-key-456"]\n',
    )
    proc = run("config", "show", "--limit", "7/1s")
    assert proc.returncode == 0, proc.stderr
    assert "literal-secret-key-123" not in proc.stdout and "another-secret-key-456" not in proc.stdout
    assert "k1 …-123" in proc.stdout and str(xdg / "ratedeck" / "config.toml") in proc.stdout
    data = tomllib.loads(proc.stdout)
    assert data["engine"]["in_flight_per_key"] == 3 and data["keys"]["limits"] == ["7/1s"]

    proc = run("config", "show", "--keys", "env:MY_TEST_KEYS")
    data = tomllib.loads(proc.stdout)
    assert data["keys"]["secrets"] == ["env:MY_TEST_KEYS"] and "env-key-aaaa-0001" not in proc.stdout
    assert run("config", "show", "--in-flight", "0").returncode == 2
    assert run("config", "nope").returncode == 2


def test_a_small_config_file_without_a_target_runs_on_the_embedded_simulator(tmp_path, xdg):
    """A first config file that only sets a rate works as running with no file does:
    the study preset fills in the rest. One that names a target still needs keys."""
    tiny = tmp_path / "tiny.toml"
    tiny.write_text("[workload]\nrate = 50\n")
    cfg, source = _cfg("--config", str(tiny))
    assert (
        source == str(tiny)
        and cfg.engine_settings.workload.rate == 50
        and cfg.engine_settings.target.url is None
    )
    assert [k.secret for k in cfg.engine_settings.keys] == list(
        STUDY_KEYS
    ) and cfg.engine_settings.target.nonce_param == "nonce"
    named = tmp_path / "named.toml"
    named.write_text('[target]\nurl = "https://api.example.com/v1"\n')
    with pytest.raises(ConfigError, match="no API keys given"):
        _cfg("--config", str(named))


def test_config_show_hides_the_passwords_of_a_proxy_and_a_target_url():
    """`config show` keeps the URLs readable (user, host, path, query) with each password hidden."""
    env = dict(os.environ, XDG_CONFIG_HOME="/nonexistent")
    proc = subprocess.run(
        [*RATEDECK, "config", "show", "--target", "http://bob:t0psecret@127.0.0.1:9/v1/x?a=1",
         "--key-header", "X-Api-Key", "--keys", "abcdefghijk123", "--limit", "5/1s",
         "--proxy", "http://proxyuser:hunter2@127.0.0.1:3128"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hunter2" not in proc.stdout and "t0psecret" not in proc.stdout
    assert 'proxy = "http://proxyuser:***@127.0.0.1:3128"' in proc.stdout
    assert 'url = "http://bob:***@127.0.0.1:9/v1/x?a=1"' in proc.stdout
