"""`ratedeck bench` for noisy servers: the scenario group, the ratedeck variants,
the told-wrong limit, and the sustained share and headroom parts in each row."""

from __future__ import annotations

from dataclasses import replace

from ratedeck.bench import parse_args
from ratedeck.bench.engine_run import BUDGET, snapshot_summary, variant_overrides
from ratedeck.bench.output import ScenarioResult, make_row, scenario_table
from ratedeck.bench.scenarios import (
    DEFAULT_SCENARIOS,
    GROUPS,
    LIVE_TABLE,
    NEEDS_HEALTH,
    SCENARIOS,
    STRATEGIES,
    engine_extra,
)
from ratedeck.bench.spec import RunSpec
from ratedeck.config import load_config
from ratedeck.engine.snapshot import Snapshot
from ratedeck.server.serve import add_serve_arguments, settings_from_args


def serve_settings(name: str):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args(list(SCENARIOS[name].serve_args)))


def test_the_noisy_group_expands_in_place_and_the_default_is_unchanged():
    assert parse_args([]).scenarios == list(DEFAULT_SCENARIOS)
    args = parse_args(["--scenarios", "seed,noisy-servers,noisy"])
    assert args.scenarios == ["seed", *GROUPS["noisy-servers"]]
    assert not args.strategies_given and parse_args(["--strategies", "ratedeck"]).strategies_given


def test_the_noisy_scenarios_are_the_issue_s():
    noisy = serve_settings("noisy")
    assert noisy.latency_in_ms == noisy.latency_out_ms == (5, 45)
    assert noisy.processing_ms == (20, 80)
    assert not (noisy.server_timing or noisy.ratelimit_headers or noisy.retry_after or noisy.nonce)
    assert noisy.health and noisy.block_after == 0
    assert serve_settings("noisy+timing").server_timing
    assert serve_settings("noisy-wide").latency_in_ms == (5, 95)
    steady = serve_settings("steady+timing")
    assert steady.latency_in_ms == (100, 104) and steady.processing_ms == (20, 80) and steady.server_timing


def test_told_wrong_is_offered_what_the_clients_were_told():
    told = SCENARIOS["told-wrong"]
    settings = serve_settings("told-wrong")
    assert settings.policies[0].limit == told.limit == 20
    assert settings.retry_after and settings.escalation and not settings.ratelimit_headers
    assert told.client_limit == 25
    assert told.capacity_tps == 100 and told.offered_tps == 125
    remaining = serve_settings("told-wrong+remaining")
    assert remaining.ratelimit_headers and remaining.retry_after and remaining.escalation
    assert SCENARIOS["told-wrong+remaining"].client_limit == 30


def test_a_row_with_429s_says_how_the_server_s_cooldowns_went():
    server = {
        "totals": {"ok": 90, "rejected_429": 3, "requests_during_cooldown": 1, "escalations": 2},
        "keys": [{"rejected_429": 2}, {"rejected_429": 1}, {"rejected_429": 0}],
    }
    row = make_row("ratedeck", {"succeeded": 90}, server, duration_s=1.0, capacity_tps=100.0)
    assert row["rejected_429_by_key"] == [2, 1, 0]
    table = scenario_table(ScenarioResult("told-wrong", "s", 100.0, rows=[row]), 1.0)
    assert "ratedeck 429s by key 2,1,0; sent during a cooldown 1; escalations 2" in table
    clean = make_row(
        "ratedeck", {"succeeded": 90}, {"totals": {"ok": 90}}, duration_s=1.0, capacity_tps=100.0
    )
    assert "by key" not in scenario_table(ScenarioResult("t", "s", 100.0, rows=[clean]), 1.0)


def test_each_scenario_runs_its_own_strategies_and_probes_only_where_there_is_health():
    for scenario in SCENARIOS.values():
        assert scenario.strategies and set(scenario.strategies) <= set(STRATEGIES)
        if not scenario.health:
            assert not NEEDS_HEALTH & set(scenario.strategies)
    assert {"ratedeck", "ratedeck+probe", "ratedeck+budget"} <= set(SCENARIOS["noisy"].strategies)


def spec(strategy: str) -> RunSpec:
    return RunSpec(strategy, "http://127.0.0.1:1234/api/request", ("k",), 20, 1.0, False, 20.0, 5.0)


def test_ratedeck_variants_add_a_probe_or_a_budget_and_load():
    probe = variant_overrides(spec("ratedeck+probe"))
    assert probe["target"]["probe_url"] == "http://127.0.0.1:1234/health"
    budget = variant_overrides(spec("ratedeck+budget"))
    assert budget["engine"]["rejection_budget"] == BUDGET == 10 and "learn_policy" not in budget["engine"]
    plain = variant_overrides(spec("ratedeck"))
    assert "probe_url" not in plain["target"] and "rejection_budget" not in plain["engine"]
    for overrides in (probe, budget, plain):
        load_config(preset="study", overrides=overrides)  # valid configs


def test_a_live_row_or_a_limit_told_wrong_runs_with_the_engines_slow_start():
    live = {row.name for row in LIVE_TABLE}
    for name, scenario in SCENARIOS.items():
        named = name in live or scenario.told_limit is not None
        assert engine_extra(scenario) == ({"slow_start": True} if named else {}), name
    told = variant_overrides(replace(spec("ratedeck"), extra=engine_extra(SCENARIOS["live-told-wrong"])))
    assert told["engine"]["slow_start"] is True
    assert load_config(preset="study", overrides=told).engine_settings.engine.slow_start
    plain = variant_overrides(spec("ratedeck"))
    assert "slow_start" not in plain["engine"]
    assert not load_config(preset="study", overrides=plain).engine_settings.engine.slow_start  # the study's


def test_a_row_carries_the_share_and_what_the_headroom_was_made_of():
    snap = Snapshot(
        succeeded=190,
        headroom_ms=41.0,
        headroom_source="hints",
        rtt_spread_ms=131.0,
        network_spread_ms=79.0,
        server_time_ms=50.2,
        rejection_budget=10,
        rejections_spent=3,
        probe_sent=0,
    )
    client = snapshot_summary(snap) | {"cpu_s": 1.0, "peak_rss_mb": 40.0}
    server = {"totals": {"ok": 190}, "share": {"sustained": 0.9612, "all": 0.955, "pairs": 3000}}
    row = make_row("ratedeck", client, server, duration_s=2.0, capacity_tps=100.0)
    assert row["share"] == 0.9612 and row["share_all"] == 0.955
    assert row["headroom_source"] == "hints" and row["rejections_spent"] == 3
    table = scenario_table(ScenarioResult("noisy", "s", 100.0, rows=[row]), 2.0)
    assert "share" in table.splitlines()[2] and "0.961" in table
    assert "41 ms from hints" in table and "spent 3 of 10 rejections" in table
    assert "server time 50.2 ms" in table and "network spread 79 ms" in table


def test_a_row_without_a_share_shows_a_dash():
    row = make_row("original", {"succeeded": 0}, {"totals": {}}, duration_s=1.0, capacity_tps=100.0)
    assert row["share"] is None
    table = scenario_table(ScenarioResult("noisy", "s", 100.0, rows=[row]), 1.0)
    assert table.splitlines()[-1].split()[3] == "-"


def test_a_shared_key_row_gives_the_share_of_what_the_other_user_left():
    # 60 s at 100/s is 6,000; they took 800 of it, so 4,550 succeeded is 0.875 of the 5,200 left
    server = {"totals": {"ok": 4550}, "keys": [{"other_accepted": 160} for _ in range(5)]}
    row = make_row("ratedeck", {"succeeded": 4550}, server, duration_s=60.0, capacity_tps=100.0)
    assert row["other_accepted"] == 800 and row["share_of_left"] == 0.875
    text = scenario_table(ScenarioResult("shared-keys", "s", 100.0, [row]), 60.0)
    assert "ratedeck got 0.875 of what the other user left (they were accepted 800 times)" in text
    alone = make_row("ratedeck", {"succeeded": 4550}, {"keys": [{}]}, duration_s=60.0, capacity_tps=100.0)
    assert "share_of_left" not in alone


def test_a_shared_key_rows_sustained_is_scaled_by_the_share_the_other_user_left():
    # One key at 20/1s for 10 s: ours 16/s (pairs i, i+20 1.25 s apart: 0.8 sustained), theirs
    # 20 of the 200, so they left 0.9 of it: 0.8 / 0.9 of what they left.
    stamps = [i * 1.25 / 20 * 1000.0 for i in range(160)]
    server = {"totals": {"ok": 160}, "keys": [{"other_accepted": 20}], "arrivals_ms": [stamps]}
    row = make_row(
        "ratedeck", {"succeeded": 160}, server, duration_s=10.0, capacity_tps=20.0, policy=(20, 1.0)
    )
    assert row["sustained"] == 0.8 and row["sustained_of_left"] == 0.8889
    text = scenario_table(ScenarioResult("shared-keys", "s", 20.0, [row]), 10.0)
    assert "sustained over its own stamps 0.800, 0.889 of the share they left" in text
