"""`ratedeck bench`: options, the JSON report's stable names, rows, charts."""

import json
import re

import pytest

from ratedeck.bench import DEFAULT_DURATION_S, QUICK_DURATION_S, UsageError, main, parse_args
from ratedeck.bench.output import ROW_FIELDS, ScenarioResult, bar_charts, make_row
from ratedeck.bench.scenarios import DEFAULT_SCENARIOS, SCENARIOS, STRATEGIES
from ratedeck.bench.spec import RunSpec


def test_defaults_run_everything_for_twenty_seconds():
    args = parse_args([])
    assert args.duration == DEFAULT_DURATION_S
    assert args.scenarios == ["seed", "seed+jitter", "many-keys"]
    assert args.strategies == ["original", "improved-async", "improved-threads", "aiolimiter", "ratedeck"]
    assert args.micro == "full"


def test_quick_is_short_and_skips_the_slow_micro_runs():
    args = parse_args(["--quick"])
    assert args.duration == QUICK_DURATION_S
    assert args.micro == "limiter"
    assert parse_args(["--quick", "--micro", "none", "--duration", "3"]).duration == 3.0


def test_filters_keep_the_order_given_and_drop_repeats():
    args = parse_args(["--scenarios", "many-keys,seed,seed", "--strategies", "ratedeck, original"])
    assert args.scenarios == ["many-keys", "seed"]
    assert args.strategies == ["ratedeck", "original"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--duration", "-1"], "--duration"),
        (["--duration", "0"], "--duration"),
        (["--duration", "soon"], "--duration"),
        (["--scenarios", "nope"], "unknown name 'nope'"),
        (["--strategies", "seed,original"], "unknown name 'seed'"),
        (["--scenarios", ","], "--scenarios"),
        (["--seed", "x"], "--seed"),
        (["--no-such-option"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ratedeck bench: error: ")
    assert needle in lines[0]


def test_parse_args_raises_usage_error():
    with pytest.raises(UsageError, match="must be a number of seconds above 0"):
        parse_args(["--duration", "-1"])


def test_scenarios_and_strategies_are_the_issue_s():
    assert SCENARIOS["seed"].capacity_tps == 100
    assert SCENARIOS["seed"].nonce and not SCENARIOS["many-keys"].nonce
    assert len(SCENARIOS["many-keys"].keys) > len(SCENARIOS["seed"].keys)
    assert "--latency" in SCENARIOS["seed+jitter"].serve_args
    assert set(STRATEGIES) == {
        "original",
        "improved-async",
        "improved-threads",
        "aiolimiter",
        "ratedeck",
        "ratedeck+probe",
        "ratedeck+budget",
        "ratedeck+procs2",
    }
    # Issue 15: the client's own CPU at 5,000/s, the peers beside one and two engine processes.
    heavy = SCENARIOS["many-keys-heavy"]
    assert heavy.capacity_tps == 5000 and "--processing" in heavy.serve_args
    assert {"aiolimiter", "improved-async", "ratedeck", "ratedeck+procs2"} <= set(heavy.strategies)
    assert "many-keys-heavy" not in DEFAULT_SCENARIOS  # too heavy for the default run


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_scenario_row_starts_the_simulator_the_clients_are_told_of(name):
    """The table's one builder: the server's keys, limit, nonce and /health are the scenario's."""
    import argparse

    from ratedeck.core.policy import Policy
    from ratedeck.server.serve import add_serve_arguments, settings_from_args

    scenario = SCENARIOS[name]
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    server = settings_from_args(parser.parse_args(list(scenario.serve_args)))
    assert tuple(server.keys) == scenario.keys
    assert server.policies == (Policy(scenario.limit, scenario.window_s),)
    assert server.nonce == scenario.nonce and server.health == scenario.health
    assert set(scenario.strategies) <= set(STRATEGIES)


def test_run_spec_round_trips_through_json():
    spec = RunSpec(
        "ratedeck",
        "http://127.0.0.1:1/api/request",
        ("a", "b"),
        20,
        1.0,
        True,
        40.0,
        2.0,
        extra={"depth": 10},
    )
    assert RunSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.policy_text == "20/1s"


def test_a_row_takes_429s_and_nonce_rejections_from_the_server():
    client = {
        "succeeded": 190,
        "expired": 3,
        "p50_ms": 51.04,
        "p99_ms": 95.0,
        "cpu_s": 1.234,
        "peak_rss_mb": 36.71,
        "rejected_429": 0,
        "rejected_nonce": 0,
    }
    server = {
        "totals": {"ok": 191, "rejected_429": 10, "blocked_answers": 40, "rejected_nonce": 7},
        "host": {"rejected_429": 0},
        "audit_ok": True,
    }
    row = make_row("original", client, server, duration_s=2.0, capacity_tps=100.0)
    assert tuple(row)[: len(ROW_FIELDS)] == ROW_FIELDS
    assert row["ok_per_s"] == 95.0
    assert row["pct_capacity"] == 95.0
    assert row["rejected_429"] == 50  # every HTTP 429, "blocked" answers included
    assert row["rejected_nonce"] == 7
    assert row["expired"] == 3


def test_bar_charts_without_colour_have_no_escape_codes():
    result = ScenarioResult(
        "seed",
        "s",
        100.0,
        rows=[{"strategy": "original", "ok_per_s": 82.0}, {"strategy": "ratedeck", "ok_per_s": 93.5}],
    )
    text = bar_charts([result], color=False, width=80)
    assert "original" in text and "ratedeck" in text
    assert "\x1b[" not in text


@pytest.mark.slow
def test_quick_run_writes_the_report_with_stable_names(tmp_path, capsys):
    """One scenario, two strategies, each in its own process against a fresh simulator."""
    report = tmp_path / "bench.json"
    code = main(
        [
            "--quick",
            "--scenarios",
            "seed",
            "--strategies",
            "original,ratedeck",
            "--no-chart",
            "--report",
            str(report),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "seed:" in out and "original" in out and "ratedeck" in out
    data = json.loads(report.read_text())
    assert {"scenarios", "micro"} <= set(data)
    [scenario] = data["scenarios"]
    assert scenario["name"] == "seed"
    assert scenario["capacity_tps"] == 100
    assert [r["strategy"] for r in scenario["rows"]] == ["original", "ratedeck"]
    for row in scenario["rows"]:
        assert set(ROW_FIELDS) <= set(row)
        for name in ROW_FIELDS[1:]:
            assert isinstance(row[name], (int, float)) and row[name] >= 0
        assert row["ok_per_s"] > 0  # both clients got work through
    names = [m["name"] for m in data["micro"]]
    assert "limiter_acquire_ratedeck" in names and "limiter_acquire_aiolimiter" in names
    for m in data["micro"]:
        assert set(m) == {"name", "value", "unit"}
        assert re.fullmatch(r"[a-z0-9_]+", m["name"])


@pytest.mark.parametrize("job", ["bare-aiohttp", "engine-max"])
def test_every_micro_run_s_engine_config_loads(job):
    """`--micro full` once died on its own offered rate (above the config's ceiling):
    the configs its engine runs build are loaded here, as the child loads them."""
    from ratedeck.bench import SCALE_QUEUE, queue_spec, throughput_spec
    from ratedeck.bench.micro import engine_config
    from ratedeck.server.settings import generated_keys

    args = parse_args(["--micro", "full"])
    keys = generated_keys(5)
    cfg = engine_config(throughput_spec(job, "http://127.0.0.1:9/api/request", keys, 3.0, args))
    assert cfg.engine_settings.workload.rate == 1_000_000.0 and len(cfg.engine_settings.keys) == 5
    for depth in SCALE_QUEUE:
        spec = queue_spec("http://127.0.0.1:9/api/request", keys, depth, 3.0, args)
        cfg = engine_config(spec, backpressure=False, ttl_s=3600.0, queue_max=1)
        assert cfg.engine_settings.workload.total == depth
