"""No invented limit: a named target with no limit given starts cautiously, adopts what the
server advertises, and stops with one line when it advertises nothing (virtual time, and the CLI)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from ratedeck.config import load_config
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import standard_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual

KEYS = ("key-000", "key-001")


def engine_for(url: str, **server_kw):
    server = replace(
        standard_settings(), keys=KEYS, latency_in_ms=(5, 45), latency_out_ms=(5, 45), **server_kw
    )
    cfg = load_config(
        overrides={
            "target": {"url": url},
            "keys": {"secrets": list(KEYS)},
            "engine": {"graveyard_path": "", "ttl_s": 60.0},
        }
    )
    return Engine(cfg, SimulatedTransport(server, seed=2)), cfg


def test_a_named_target_gets_no_limit_of_seeds():
    _eng, cfg = engine_for("http://api.example/v1")
    assert all(k.policies == () for k in cfg.engine_settings.keys)
    assert cfg.engine_settings.capacity_tps == 0
    seed = load_config()  # the embedded simulator keeps the study preset's 20/1s
    assert [str(p) for p in seed.engine_settings.keys[0].policies] == ["20/1s"]


def test_it_adopts_what_the_server_advertises_and_runs_at_it():
    eng, _ = engine_for("http://api.example/v1")
    snap = run_virtual(eng.run(20))
    assert snap.no_limit == ""
    assert any("no limit given; the server advertises 20/1s: adopted it" in e.text for e in snap.events)
    assert all(k.limit_estimate == "20/1s" and k.estimate_reason == "advertised" for k in snap.keys)
    assert snap.rejected_429 == 0
    # The generated load follows what the keys allow once they know: most of 2 x 20/s.
    assert snap.succeeded >= 0.8 * 2 * 20 * 20, snap.succeeded


def test_it_stops_when_the_first_answers_advertise_nothing():
    eng, _ = engine_for("http://api.example/v1", ratelimit_headers=False)
    snap = run_virtual(eng.run(60))
    assert snap.no_limit == "the server advertises no rate limit on its answers; give one with --limit N/W"
    assert snap.elapsed_s < 2 and snap.sent <= 4  # one in flight per key: a request or two each


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path):
    port_file = tmp_path / "port"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ratedeck.runner.cli",
            "serve",
            "--mode",
            "standard",
            "--keys",
            "2",
            "--no-ratelimit-headers",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = line.split()[2]
        port_file.write_text(url)
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "ratedeck.runner.cli",
                "--target",
                f"{url}/api/request",
                "--keys",
                "key-000,key-001",
                "--key-param",
                "api_key",
                "--no-ui",
                "--duration",
                "20",
                "--rate",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.terminate()
        server.wait(10)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stderr.strip().splitlines() == [
        f"ratedeck: {url}/api/request: the server advertises no rate limit on its answers; give one with --limit N/W"
    ]


def test_config_show_shows_no_limit_the_user_never_gave():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratedeck.runner.cli",
            "config",
            "show",
            "--target",
            "http://api.example/v1",
            "--keys",
            "k",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "limits" not in out.stdout and "20/1s" not in out.stdout
    given = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratedeck.runner.cli",
            "config",
            "show",
            "--target",
            "http://api.example/v1",
            "--keys",
            "k",
            "--limit",
            "7/1s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert 'limits = ["7/1s"]' in given.stdout.replace("[\n    ", "[").replace(",\n]", "]")


def test_a_told_limit_is_checked_first_on_a_named_target_not_on_the_seed():
    named = load_config(overrides={"target": {"url": "http://api.example/v1"}, "keys": {"secrets": ["k"]}})
    assert named.engine_settings.engine.slow_start is True
    assert load_config().engine_settings.engine.slow_start is False  # the embedded simulator's own 20/1s


def test_a_capacity_nobody_stated_is_shown_as_not_known_never_as_a_placeholder():
    """A key still waiting for its server's limit adds nothing to the capacity, and the headless
    block says the capacity is not known rather than a placeholder's huge number."""
    from ratedeck.engine.snapshot import Snapshot
    from ratedeck.runner.headless import metrics_block

    unknown = metrics_block(Snapshot(capacity_tps=0.0))[1]
    assert "capacity not known yet" in unknown and "1,000,000" not in unknown
    known = metrics_block(Snapshot(capacity_tps=100.0, throughput_tps=50.0))[1]
    assert "(50.0% of 100/s capacity)" in known
