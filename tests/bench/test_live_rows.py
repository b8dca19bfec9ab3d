"""Issue 44's live rows: the told-wrong and shared-key cases through the jitter proxy exist,
are opt-in, and start the simulator with the settings their summaries claim; the cluster bench
scores a run with `sustained` from the accept stamps. Pure checks: nothing runs in real time."""

from __future__ import annotations

import argparse
import subprocess
import tomllib

import pytest

from ratedeck.bench.cluster import member_args, member_settings, sustained
from ratedeck.bench.scenarios import DEFAULT_SCENARIOS, GROUPS, SCENARIOS
from ratedeck.core.policy import Policy
from ratedeck.server.serve import add_serve_arguments, settings_from_args
from ratedeck.server.settings import parse_other_load

NEW = ("live-told-wrong", "live-told-wrong+remaining", "live-shared-keys")


def _settings(name: str):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args(list(SCENARIOS[name].serve_args)))


@pytest.mark.parametrize("name", NEW)
def test_each_row_is_live_opt_in_and_shaped_as_the_issue_says(name):
    s = SCENARIOS[name]
    assert name in GROUPS["live"]
    assert name not in DEFAULT_SCENARIOS
    assert all(name not in group for key, group in GROUPS.items() if key != "live")
    # 5 keys x 20/1s as the server enforces it, behind the 5..45 ms proxy, 20..80 ms of server time
    assert (len(s.keys), s.limit, s.window_s, s.jitter_ms, s.nonce) == (5, 20, 1.0, "5:45", False)
    assert s.capacity_tps == 100.0
    assert "ratedeck" in s.strategies
    got = _settings(name)
    assert got.policies == (Policy(20, 1.0),)
    assert got.latency_in_ms == got.latency_out_ms == (0, 0)  # the proxy delays, not the simulator
    assert got.processing_ms == (20, 80)
    assert got.block_after == 0 and not got.server_timing


def test_told_25_where_the_server_allows_20_and_escalates():
    s, got = SCENARIOS["live-told-wrong"], _settings("live-told-wrong")
    assert (s.told_limit, s.client_limit, s.offered_tps) == (25, 25, 125.0)
    assert got.escalation and got.retry_after and not got.ratelimit_headers
    assert not got.other_load


def test_told_30_where_the_server_allows_20_and_says_so():
    s, got = SCENARIOS["live-told-wrong+remaining"], _settings("live-told-wrong+remaining")
    assert (s.told_limit, s.client_limit, s.offered_tps) == (30, 30, 150.0)
    assert got.ratelimit_headers and got.retry_after and got.escalation
    assert not got.other_load


def test_another_user_takes_8_a_second_of_each_key_from_10_s_to_30_s():
    s, got = SCENARIOS["live-shared-keys"], _settings("live-shared-keys")
    assert s.told_limit is None and s.client_limit == 20
    assert parse_other_load(got.other_load) == parse_other_load("8/1s@10s-30s")
    # no hints of any kind, and no cooldowns: the keys have to find the room themselves
    assert not (got.ratelimit_headers or got.retry_after or got.escalation)
    # the row says how its figures treat the other user's share
    assert "share_of_left" in s.summary and "other user" in s.summary


def test_the_cluster_bench_scores_a_run_from_the_accept_stamps():
    even = [i * 50.0 for i in range(200)]  # 20/s exactly: 1.0
    half = [i * 100.0 for i in range(200)]  # 10/s: 0.5
    got = sustained({"arrivals_ms": [even, half, [0.0, 1.0]]})
    assert got["sustained_by_key"] == [1.0, 0.5, None]  # under 21 stamps: no figure
    assert got["sustained"] == 0.75
    assert sustained({})["sustained"] is None
    assert sustained({"arrivals_ms": [even], "arrivals_dropped": 3})["sustained_stamps_dropped"] == 3


@pytest.mark.parametrize("slow_start", [True, False])
def test_cluster_members_run_with_a_slow_start_when_asked(tmp_path, slow_start):
    # The members' own command line, with --save-config: the real CLI says what it would run.
    member_settings(tmp_path, slow_start=slow_start)
    args = member_args("http://127.0.0.1:9/api/request", "memory", 10.0, 33.0, tmp_path / "r.json", tmp_path)
    saved = tmp_path / "effective.toml"
    done = subprocess.run([*args, "--save-config", str(saved)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    engine = tomllib.loads(saved.read_text())["engine"]
    assert engine["slow_start"] is slow_start  # the study preset's own is off
