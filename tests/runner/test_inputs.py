"""Bad input never crashes ratedeck: exit 2 and one line naming the problem, or a safe value.

Each case here once crashed, hung, ran on a silently accepted nonsense value,
or answered with argparse's several lines. Command-line matters go through the
real command in a subprocess; parsers and config objects are called directly.
"""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
import tomllib
from email.utils import formatdate
from pathlib import Path

import pytest
import tomli_w

from ratedeck.config import load_config, to_toml_dict
from ratedeck.console.themes import load_themes
from ratedeck.core.policy import Policy, parse_policy
from ratedeck.core.secrets import redact, safe_url
from ratedeck.core.study_server import STUDY_KEYS
from ratedeck.engine.http.delays import (
    MAX_DELAY_S,
    advertised_policies,
    json_field_hook,
    parse_retry_after,
    ratelimit_delay,
    x_ratelimit_delay,
)
from ratedeck.runner.cli import main

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEY = "TEST-KEY-0000000001"
TARGET = "http://127.0.0.1:9/api/request"  # nothing listens: a run that starts at all is a failure


def run(tmp_path: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 20):
    return subprocess.run(
        RATEDECK + list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, exactly one line on stderr containing every needle, no traceback anywhere."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---------------------------------------------------------------- keys


def test_a_binary_key_file_is_one_line(tmp_path):
    (tmp_path / "keys.bin").write_bytes(b"\x00\xff\xfe\x80 not text")
    proc = run(tmp_path, "--no-ui", "--target", TARGET, "--keys", "@keys.bin", "--duration", "1")
    assert_one_line(proc, "keys.bin", "UTF-8")


def test_empty_keys_flag_never_falls_back_to_the_demo_keys(tmp_path):
    proc = run(tmp_path, "--no-ui", "--target", TARGET, "--keys", "", "--duration", "1")
    line = assert_one_line(proc, "no API keys")
    assert not any(k in proc.stdout + proc.stderr for k in STUDY_KEYS) and KEY not in line


def test_a_target_without_keys_is_refused_not_sent_the_demo_keys(tmp_path):
    proc = run(tmp_path, "--no-ui", "--target", TARGET, "--duration", "1")
    assert_one_line(proc, "--keys", "no API keys", "127.0.0.1:9")


def test_an_env_var_with_no_keys_is_refused(tmp_path):
    # Already refused before the bad-input work; kept beside its siblings as the guard.
    proc = run(
        tmp_path, "--no-ui", "--target", TARGET, "--keys", "env:RATEDECK_TEST_EMPTY", "--duration", "1",
        env={"RATEDECK_TEST_EMPTY": " , "},
    )  # fmt: skip
    assert_one_line(proc, "RATEDECK_TEST_EMPTY")


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--duration", "5 parsecs"], ["--duration", "5 parsecs", "unit"]),
        (["--duration", "nan"], ["--duration", "nan"]),
        (["--duration", "-5"], ["--duration", "above 0"]),
        (["--ttl", "inf"], ["--ttl", "inf"]),
        (["--interval", "nan", "--duration", "1"], ["--interval", "nan"]),
        (["--interval", "0", "--duration", "1"], ["--interval", "at least"]),
        (["--rate", "1e300", "--duration", "1"], ["--rate", "1e300", "at most"]),
        (["--rate", "20/0s", "--duration", "1"], ["--rate", "20/0s", "window"]),
        (["--rate", "fast", "--duration", "1"], ["--rate", "fast"]),
        (["--headroom", "nan", "--duration", "1"], ["--headroom", "nan"]),
        (["--in-flight", "2.5", "--duration", "1"], ["--in-flight", "whole number", "2.5"]),
        (["--total", "many", "--duration", "1"], ["--total", "many"]),
        (["--seed", "x", "--duration", "1"], ["--seed", "'x'"]),
        (["--limit", "20/0.0000001ms", "--duration", "1"], ["keys.limits", "20/0.0000001ms", "1ms"]),
    ],
)
def test_a_bad_flag_is_one_line_naming_flag_and_value(tmp_path, argv, needles):
    proc = run(tmp_path, "--no-ui", *argv)
    assert_one_line(proc, *needles)


def test_durations_and_rates_take_units(tmp_path):
    out = tmp_path / "saved.toml"
    proc = run(tmp_path, "--duration", "5m", "--ttl", "500ms", "--rate", "600/1m", "--save-config", str(out))
    assert proc.returncode == 0, proc.stderr
    data = tomllib.loads(out.read_text())
    assert data["run"]["duration_s"] == 300.0
    assert data["engine"]["ttl_s"] == 0.5
    assert data["workload"]["rate"] == 10.0


# ---------------------------------------------------------------- config files


@pytest.mark.parametrize(
    "body, needles",
    [
        ("[run]\nreport = 5\n", ["run.report", "string", "5"]),
        ("[run]\nseed = [1]\n", ["run.seed", "[1]"]),
        ('[run]\nplot = "no"\n', ["run.plot", "'no'"]),
        ("[run]\nduration_s = nan\n", ["run.duration_s", "nan"]),
        ("[engine]\nttl_s = nan\n", ["engine.ttl_s", "nan"]),
        ("[engine]\ndrain_timeout_s = inf\n", ["engine.drain_timeout_s", "inf"]),
        ("[engine]\nheadroom = nan\n", ["engine.headroom", "nan"]),
        ("[engine]\nheadroom_initial_ms = 0.5\n", ["engine.headroom_initial_ms", "0.5"]),
        ("[engine]\nbackoff_cap_ms = nan\n", ["engine.backoff_cap_ms", "nan"]),
        ("[engine]\nin_flight_per_key = 1000000000\n", ["engine.in_flight_per_key", "at most"]),
        ("[target]\ntimeout_s = inf\n", ["target.timeout_s", "inf"]),
        ('[target]\nurl = "http://127.0.0.1:99999/"\n', ["target.url", "Port out of range"]),
        ('[target]\nkey_header = "X Api Key"\n', ["target.key_header", "X Api Key"]),
        ("[target]\nparams = { a = { b = 1 } }\n", ["target.params", "a"]),
        ("[workload]\nrate = inf\n", ["workload.rate", "inf"]),
        ("[workload]\nrate = 1e300\n", ["workload.rate", "at most"]),
        ('[keys]\nlimits = ["20/0.0000001ms"]\n', ["keys.limits", "20/0.0000001ms"]),
        ("[keys]\nhost_limits = 0\n", ["keys.host_limits"]),
        ("[server]\nescalation_base_s = nan\n", ["server.escalation_base_s", "nan"]),
        ("[server]\nkeys = 100000000\n", ["server.keys", "at most"]),
        ("[messages]\ncalls = 1000000000\n", ["messages.calls", "at most"]),
    ],
)
def test_a_bad_config_value_is_one_line_naming_file_key_and_value(tmp_path, capsys, body, needles):
    # The loader's matter, so in-process through the CLI's own main(); an exception fails the test.
    path = tmp_path / "bad.toml"
    head, _, rest = body.partition("\n")
    keys = f'[keys]\nsecrets = ["{KEY}"]\n'
    path.write_text(keys + rest if head == "[keys]" else keys + body)
    # --save-config exits right after loading: refused at load, or (before the fix) saved and exit 0
    argv = ["--config", str(path), "--save-config", str(tmp_path / "saved.toml")]
    code = main(argv)
    out, err = capsys.readouterr()
    assert_one_line(subprocess.CompletedProcess(argv, code, out, err), str(path), *needles)
    assert KEY not in err


# ---------------------------------------------------------------- serve


@pytest.mark.parametrize(
    "argv, config, needles",
    [
        (["--latency", "0:100000000"], None, ["--latency", "60,000"]),
        (["--mode", "standard", "--keys", "100000000"], None, ["--keys", "100,000"]),
        ([], "escalation = true\nescalation_base_s = nan\n", ["escalation_base_s", "nan"]),
        ([], "latency_in_ms = [0, 100000000]\n", ["latency_in_ms", "60,000"]),
    ],
)
def test_serve_refuses_bad_numbers_in_one_line(tmp_path, argv, config, needles):
    if config is not None:
        (tmp_path / "server.toml").write_text(config)
        argv = [*argv, "--config", "server.toml"]
    proc = run(tmp_path, "serve", "--port", "0", *argv, timeout=10)
    assert "Traceback" not in proc.stderr and proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines


# ---------------------------------------------------------------- headers


@pytest.mark.parametrize(
    "header, expected",
    [
        ('"a";q=20;w=1;x=1.1.1', (Policy(20, 1.0),)),
        ('"x";q=..', ()),
        ('"a";q=..;w=1', ()),
        ('"a";q=20;w=1.2.3', ()),
        ('"a";q=5;w=1e999', ()),  # not a window of 1 s
    ],
)
def test_ratelimit_policy_never_raises(header, expected):
    assert advertised_policies(header) == expected


def test_ratelimit_policy_reads_every_draft_form():
    assert advertised_policies('"a";q=20;w=1, "b";q=600;w=60') == (Policy(20, 1.0), Policy(600, 60.0))
    assert advertised_policies("burst;q=100;w=60") == (Policy(100, 60.0),)  # draft 08
    assert advertised_policies("10;w=1, 50;w=60;burst=1000") == (Policy(10, 1.0), Policy(50, 60.0))
    assert advertised_policies('"a";q=20;w=0.0000000001') == ()  # nonsense window skipped
    assert advertised_policies('"a,b";q=20;w=1') == (Policy(20, 1.0),)


@pytest.mark.parametrize("header", ['"p";r=0;t=1.2.3', '"p";r=..;t=5', '"p";r=0;t=.', '"p";r=0;t=1e999'])
def test_ratelimit_never_raises(header):
    assert ratelimit_delay(header) is None


def test_ratelimit_draft_07_dictionary():
    assert ratelimit_delay("limit=100, remaining=0, reset=5") == 5.0
    assert ratelimit_delay("limit=100, remaining=3, reset=5") is None


def test_absurd_delays_are_capped_and_bad_ones_refused():
    assert parse_retry_after("1e308") == MAX_DELAY_S
    assert parse_retry_after(formatdate(4e9, usegmt=True), now_wall=1000.0) == MAX_DELAY_S
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == MAX_DELAY_S
    assert parse_retry_after("nan") is None and parse_retry_after("-1") is None
    assert x_ratelimit_delay("0", "1e30") == MAX_DELAY_S
    assert x_ratelimit_delay("nan", "5") is None and x_ratelimit_delay("0", "nan") is None
    hook = json_field_hook("retry")
    assert hook(429, {}, '{"retry": 1e400}') == MAX_DELAY_S
    assert hook(429, {}, '{"retry": NaN}') is None
    assert hook(429, {}, '{"retry": "1.1.1s"}') is None
    assert hook(429, {}, '{"retry": -3}') is None
    assert hook(429, {}, "[" * 100_000) is None
    assert hook(429, {}, '{"retry": "250ms"}') == 0.25


# ---------------------------------------------------------------- secrets


def test_repr_never_shows_a_key():
    secret = "LITERAL-SECRET-abcdef123"
    cfg = load_config(overrides={"keys": {"secrets": [secret]}, "target": {"params": {"token": secret}}})
    assert secret not in repr(cfg) and secret not in repr(cfg.engine_settings.keys[0])
    assert secret[:8] not in repr(cfg)


def test_redact_masks_a_key_inside_basic_auth_at_any_offset():
    secret = "S3cret/Key+with=chars-1234"
    for user in ("u", "us", "use"):
        token = base64.b64encode(f"{user}:{secret}".encode()).decode()
        assert token[4:16] not in redact(f"Authorization: Basic {token}", [secret])


def test_redact_masks_lower_case_escapes_of_a_mixed_case_key():
    secret = "AbC/dEf+GhI-1234"
    assert "AbC" not in redact("key=AbC%2fdEf%2bGhI-1234", [secret])


def test_safe_url_survives_a_bad_port():
    assert safe_url("http://user:pw@host:99999/x?k=1") == "<unparseable URL>"
    assert safe_url("https://user:pw@example.com/p?api_key=1") == "https://example.com/p"


# ---------------------------------------------------------------- saving


def test_a_saved_config_loads_back_to_the_same_settings(tmp_path, monkeypatch):
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text(f"{KEY}\n")
    cfg = load_config(
        overrides={
            "target": {"url": TARGET, "nonce_param": "", "id_param": ""},
            "keys": {"secrets": [f"@{keyfile}"], "limits": ["1/1.0005s", "7/333.3ms"]},
            "messages": {"shed_path": ""},
        }
    )
    saved = tomli_w.dumps(to_toml_dict(cfg))
    assert KEY not in saved and f"@{keyfile}" in saved
    (tmp_path / "saved.toml").write_text(saved)
    again = load_config(str(tmp_path / "saved.toml"))
    assert (
        again.engine_settings.target == cfg.engine_settings.target
        and again.engine_settings.target.nonce_param is None
        and again.engine_settings.target.id_param is None
    )
    assert again.engine_settings.keys == cfg.engine_settings.keys and again.engine_settings.keys[
        0
    ].policies == (Policy(1, 1.0005), parse_policy("7/333.3ms"))
    assert (
        again.engine_settings.messages == cfg.engine_settings.messages
        and again.engine_settings.messages.shed_path is None
    )
    assert (
        again.engine_settings.engine == cfg.engine_settings.engine
        and again.engine_settings.workload == cfg.engine_settings.workload
    )


def test_an_absurd_capacity_never_becomes_an_absurd_arrival_rate():
    cfg = load_config(overrides={"keys": {"limits": ["1000000000/1ms"]}})
    assert math.isfinite(cfg.engine_settings.arrival_rate) and cfg.engine_settings.arrival_rate <= 1_000_000


# ---------------------------------------------------------------- themes


def test_a_nan_theme_is_skipped_with_a_notice(tmp_path):
    (tmp_path / "nan.toml").write_text('name = "nan"\nprimary = "#ff0000"\nluminosity_spread = nan\n')
    (tmp_path / "ok.toml").write_text('name = "ok"\nprimary = "#00ff00"\ntext_alpha = 0.9\n')
    themes, problems = load_themes(tmp_path)
    assert [t.name for t in themes] == ["ok"]
    assert len(problems) == 1 and "nan.toml" in problems[0] and "luminosity_spread" in problems[0]


# ---------------------------------------------------------------- real-API settings (issue 11)


def test_url_credentials_and_a_bearer_key_cannot_share_the_authorization_header(tmp_path):
    proc = run(tmp_path, "--no-ui", "--target", "http://u:p@127.0.0.1:9/x", "--keys", KEY, "--duration", "1")
    assert_one_line(proc, "target.url", "Authorization")


def test_a_bad_header_line_names_the_flag(tmp_path):
    proc = run(tmp_path, "--no-ui", "--target", TARGET, "--keys", KEY, "--header", "NoColonHere")
    assert_one_line(proc, "--header", "Name: value")


def test_a_signing_recipe_without_a_secret_names_the_keys(tmp_path):
    (tmp_path / "run.toml").write_text('[target]\nurl = "http://127.0.0.1:9/x"\nsigning = "kraken"\n')
    proc = run(tmp_path, "--no-ui", "--config", "run.toml", "--keys", KEY, "--duration", "1")
    line = assert_one_line(proc, "signing", "KEY SECRET", "k1")
    assert KEY not in line


def test_a_weight_that_is_not_a_number_names_the_line(tmp_path):
    (tmp_path / "work.jsonl").write_text(
        '{"_path": "/a", "_weight": 2}\n{"_path": "/b", "_weight": "heavy"}\n'
    )
    proc = run(tmp_path, "--no-ui", "--target", TARGET, "--keys", KEY, "--workload", "work.jsonl")
    assert_one_line(proc, "work.jsonl", "line 2", "_weight")


def test_an_unknown_budget_and_a_bad_budget_limit_are_named(tmp_path):
    (tmp_path / "a.toml").write_text(
        '[target]\nurl = "http://127.0.0.1:9/x"\n[paths."/s"]\nbudgets = ["search"]\n'
    )
    assert_one_line(run(tmp_path, "--no-ui", "--config", "a.toml", "--keys", KEY), "paths", "search")
    (tmp_path / "b.toml").write_text('[[budgets]]\nname = "w"\nlimits = ["lots/1m"]\n')
    assert_one_line(run(tmp_path, "--no-ui", "--config", "b.toml", "--keys", KEY), "budgets", "lots/1m")


def test_an_outcome_rule_with_no_condition_is_refused(tmp_path):
    (tmp_path / "r.toml").write_text(
        '[target]\nurl = "http://127.0.0.1:9/x"\n[[target.rules]]\nkind = "banned"\n'
    )
    assert_one_line(
        run(tmp_path, "--no-ui", "--config", "r.toml", "--keys", KEY), "target.rules", "condition"
    )
