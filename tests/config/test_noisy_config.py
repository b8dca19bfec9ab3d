"""Bad input for the noisy-server settings: one clear line and exit 2."""

from __future__ import annotations

import pytest

from ratedeck.config import ConfigError, load_config
from ratedeck.runner.cli import main


@pytest.mark.parametrize(
    "toml, needle",
    [
        ('[target]\nprobe_url = "not a url"\n', "target.probe_url"),
        ('[target]\nprobe_url = "ftp://host/health"\n', "target.probe_url"),
        ("[target]\nprobe_rate = 0\n", "target.probe_rate"),
        ('[target]\nprobe_rate = "fast"\n', "target.probe_rate"),
        ("[engine]\nrejection_budget = 2.5\n", "engine.rejection_budget"),
        ('[engine]\nrejection_budget = "ten"\n', "engine.rejection_budget"),
        ("[engine]\nrejection_budget = -1\n", "engine.rejection_budget"),
    ],
)
def test_bad_noisy_settings_are_one_line_and_exit_2(tmp_path, capsys, toml, needle):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    assert main(["--no-ui", "--config", str(path), "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_a_probe_never_goes_to_the_rate_limited_path():
    with pytest.raises(ConfigError, match="rate-limited target itself"):
        load_config(
            preset="study",
            overrides={
                "target": {"url": "http://h:9/api/request", "probe_url": "http://h:9/api/request/"},
                "keys": {"secrets": ["k"]},
            },
        )
    cfg = load_config(
        preset="study",
        overrides={
            "target": {
                "url": "http://h:9/api/request",
                "probe_url": "http://h:9/health",
                "probe_rate": "5/1s",
            },
            "keys": {"secrets": ["k"]},
        },
    )
    assert (
        cfg.engine_settings.target.probe_url == "http://h:9/health"
        and cfg.engine_settings.target.probe_rate == 5.0
    )
    assert load_config(preset="study").engine_settings.target.probe_url is None  # off unless asked for


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--probe-url", "not a url"], "--probe-url"),
        (["--probe-rate", "0"], "--probe-rate"),
        (["--rejection-budget", "2.5"], "--rejection-budget"),
        (["--rejection-budget", "-1"], "--rejection-budget"),
    ],
)
def test_bad_noisy_flags_name_the_flag_and_exit_2(capsys, flags, needle):
    assert main(["--no-ui", "--duration", "1", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_noisy_flags_reach_the_saved_config(tmp_path):
    import tomllib

    saved = tmp_path / "out.toml"
    flags = [
        "--target",
        "http://127.0.0.1:9/api/request",
        "--keys",
        "a1,b2",
        "--probe-url",
        "http://127.0.0.1:9/health",
    ]
    flags += ["--probe-rate", "4", "--rejection-budget", "7", "--save-config", str(saved)]
    assert main(flags) == 0
    cfg = tomllib.loads(saved.read_text())
    assert cfg["target"]["probe_url"] == "http://127.0.0.1:9/health"
    assert cfg["target"]["probe_rate"] == 4.0
    assert cfg["engine"]["rejection_budget"] == 7
