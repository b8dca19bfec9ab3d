"""`ratedeck serve` options, errors, and a real start and stop."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from ratedeck.core.policy import Policy
from ratedeck.server.serve import add_serve_arguments, run_serve, settings_from_args
from ratedeck.server.settings import STUDY_KEYS, ServerSettings, study_settings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_the_study_server():
    args = parse()
    assert (args.port, args.host) == ("9999", "127.0.0.1")
    assert settings_from_args(args) == study_settings()


def test_seed_is_an_old_name_for_study_mode_and_says_so(tmp_path, capsys):
    said = 'mode "seed" is an old name for "study"\n'
    assert settings_from_args(parse("--mode", "seed")) == study_settings()
    assert capsys.readouterr().err == said
    config = tmp_path / "server.toml"
    config.write_text('mode = "seed"\n')
    assert settings_from_args(parse("--config", str(config))) == study_settings()
    assert capsys.readouterr().err == said
    assert ServerSettings.from_dict({"mode": "seed"}) == study_settings()
    assert capsys.readouterr().err == said
    from ratedeck.config import load_config  # a run's [server] table names the mode too

    run = tmp_path / "run.toml"
    run.write_text('[server]\nmode = "seed"\n')
    assert load_config(str(run)).server["mode"] == "study"
    assert capsys.readouterr().err == said
    settings_from_args(parse("--mode", "study"))
    assert capsys.readouterr().err == ""


def test_standard_mode_options():
    settings = settings_from_args(
        parse(
            "--mode",
            "standard",
            "--keys",
            "12",
            "--limit",
            "20/1s",
            "--limit",
            "600/1m",
            "--latency",
            "5:10",
            "--no-retry-after",
            "--escalation",
            "--host-limit",
            "500/1s",
            "--block-after",
            "3",
            "--error-rate",
            "0.1",
            "--seed",
            "9",
        )
    )
    assert settings.keys[0] == "key-000" and len(settings.keys) == 12
    assert settings.policies == (Policy(20, 1.0), Policy(600, 60.0))
    assert settings.latency_in_ms == settings.latency_out_ms == (5, 10)
    assert settings.retry_after is False
    assert settings.escalation is True
    assert settings.host_policies == (Policy(500, 1.0),)
    assert (settings.block_after, settings.error_rate, settings.seed) == (3, 0.1, 9)


def test_keys_as_a_list_and_as_a_seed_subset():
    assert settings_from_args(parse("--keys", "a, b,c")).keys == ("a", "b", "c")
    assert settings_from_args(parse("--keys", "2")).keys == STUDY_KEYS[:2]
    assert settings_from_args(parse("--latency", "0")).latency_in_ms == (0, 0)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--limit", "abc"], "--limit"),
        (["--latency", "5:1"], "--latency"),
        (["--latency", "x"], "--latency"),
        (["--keys", "7"], "--keys"),
        (["--error-rate", "2"], "--error-rate"),
        (["--block-after", "-1"], "--block-after"),
        (["--mode", "fast"], "--mode"),
        (["--port", "70000"], "--port"),
        (["--seed", "x"], "--seed"),
        (["--host", "999.1.1.1"], "--host"),
        (["--host", "not a host"], "--host"),
        (["--host", "bad_host!"], "--host"),
    ],
)
def test_bad_values_give_one_message_and_exit_2(argv, flag, capsys):
    assert run_serve(parse(*argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ratedeck serve: error: {flag}")
    assert captured.out == ""


def test_a_host_name_that_does_not_resolve_is_refused_quickly(monkeypatch, capsys):
    """A name the resolver cannot answer for ends in LOOKUP_TIMEOUT_S with one line and exit 2
    (the resolver is made to hang: no name lookup leaves this machine in a test)."""
    import ratedeck.server.serve as serve

    async def hang(*_args, **_kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(serve, "LOOKUP_TIMEOUT_S", 0.05)
    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", hang, raising=False)
    monkeypatch.setattr(serve, "loop_factory", lambda _name: asyncio.new_event_loop)
    assert run_serve(parse("--host", "nowhere.invalid", "--port", "0")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ratedeck serve: error: --host: 'nowhere.invalid' did not resolve within 0.05 s"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serves_until_a_signal_and_exits_quietly(signum):
    command = [
        sys.executable,
        "-m",
        "ratedeck.server.serve",
        "--port",
        "0",
        "--latency",
        "0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "study mode, 5 keys" in line
        url = line.split()[2]
        with urllib.request.urlopen(
            f"{url}/api/request?api_key={STUDY_KEYS[0]}&nonce=1&req_id=x", timeout=5
        ) as response:
            assert json.load(response) == {"status": "OK", "req_id": "x"}
        process.send_signal(signum)
        _, err = process.communicate(timeout=5)
        assert process.returncode == 0
        assert err == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
