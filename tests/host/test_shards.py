"""`--procs N` (issue 15): splitting a run among engine processes, merging what they report,
and the client's own cost (CPU per request, a loop that runs late)."""

import dataclasses
import json
import random
import subprocess
import sys

import pytest

from ratedeck.config import load_config
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import EventKind, Phase, PolicyKind
from ratedeck.engine.observe.merge import merge_latency, merge_snapshots
from ratedeck.engine.observe.metrics import LatencyHistogram
from ratedeck.engine.snapshot import (
    ClusterView,
    Event,
    GateRow,
    KeyRow,
    LatencySummary,
    LoopLag,
    MemberRow,
    Snapshot,
)
from ratedeck.host.shards import ShardError, parse_procs, shard_configs, split_policy
from ratedeck.runner.cli import main
from tests.runner.test_report_schema import accounted

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEYS = [f"key-{i:02d}-abcdefgh" for i in range(5)]


def _cfg(**sections):
    overrides = {"keys": {"secrets": KEYS, "limits": ["20/1s"]}, "engine": {"graveyard_path": ""}}
    for name, table in sections.items():
        overrides.setdefault(name, {}).update(table)
    return load_config(preset="study", overrides=overrides)


# ---------------------------------------------------------------- splitting


def test_keys_are_dealt_round_robin_and_the_rate_and_total_shared_by_capacity():
    cfg = _cfg(workload={"rate": 90.0, "total": 1001})
    parts = shard_configs(cfg, 2, "http://127.0.0.1:1/api/request")
    assert [[k.label for k in p.engine_settings.keys] for p in parts] == [["k1", "k3", "k5"], ["k2", "k4"]]
    assert [p.engine_settings.workload.rate for p in parts] == pytest.approx(
        [54.0, 36.0]
    )  # 3 : 2 keys of 20/s
    assert sum(p.engine_settings.workload.total for p in parts) == 1001
    assert {p.engine_settings.target.url for p in parts} == {"http://127.0.0.1:1/api/request"}
    assert all(p.runner.report is None and not p.runner.fail_on for p in parts)  # the parent reports


def test_a_host_wide_limit_is_divided_so_the_processes_together_never_exceed_it():
    cfg = _cfg(keys={"host_limits": ["75/1s"]})
    parts = shard_configs(cfg, 2)
    assert [p.engine_settings.host_policies for p in parts] == [(Policy(37, 1.0),)] * 2
    assert sum(p.engine_settings.host_policies[0].limit for p in parts) <= 75


def test_split_policy_rounds_down_divides_a_bucket_s_drain_and_refuses_zero():
    assert split_policy(Policy(10, 1.0), 3, "x") == Policy(3, 1.0)
    bucket = Policy(15, 1.0, PolicyKind.BUCKET, drain=0.5)
    assert split_policy(bucket, 2, "x") == Policy(7, 1.0, PolicyKind.BUCKET, drain=0.25)
    with pytest.raises(ShardError, match="cannot be shared by 2 processes"):
        split_policy(Policy(1, 1.0), 2, "the host-wide limit")


def test_a_host_budget_is_divided_and_a_key_budget_kept_whole():
    text = f"""
[keys]
secrets = {json.dumps(KEYS)}
limits = ["20/1s"]
[[budgets]]
name = "ip"
scope = "host"
limits = ["60/1m"]
[[budgets]]
name = "search"
scope = "key"
limits = ["30/1m"]
"""
    import tomllib

    data = tomllib.loads(text)
    data["engine"] = {"graveyard_path": ""}
    cfg = load_config(preset="study", overrides=data)
    parts = shard_configs(cfg, 4)
    for p in parts:
        budgets = {b.name: b.policies[0].limit for b in p.engine_settings.budgets}
        assert budgets == {"ip": 15, "search": 30}


def test_no_more_processes_than_keys_and_runs_that_cannot_be_split_are_refused():
    assert len(shard_configs(_cfg(), 16)) == 5
    assert len(shard_configs(_cfg(workload={"total": 2}), 4)) == 2
    with pytest.raises(ShardError, match="--results"):
        shard_configs(_cfg(run={"results": "r.jsonl"}), 2)
    with pytest.raises(ShardError, match="--store"):
        shard_configs(_cfg(run={"store": "sqlite:/tmp/jobs.db"}), 2)


def test_procs_with_a_store_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--no-ui", "--duration", "1", "--procs", "2", "--store", f"sqlite:{tmp_path}/j.db"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "--procs: above 1 does not split a --store run" in err


def test_procs_with_a_pool_of_endpoints_is_one_line_and_exit_2(tmp_path, capsys):
    pool = tmp_path / "pool.toml"
    pool.write_text(
        '[[endpoints]]\nname = "a"\npreset = "openai"\nurl = "http://127.0.0.1:9"\nkeys = ["sk-1", "sk-2"]\n'
    )
    assert main(["--no-ui", "--duration", "1", "--procs", "2", "--config", str(pool)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "does not split a pool of endpoints" in err


def test_each_process_writes_its_own_graveyard():
    parts = shard_configs(_cfg(engine={"graveyard_path": "out/dead.jsonl"}), 2)
    assert [p.engine_settings.engine.graveyard_path for p in parts] == [
        "out/dead.p1.jsonl",
        "out/dead.p2.jsonl",
    ]


@pytest.mark.parametrize("text,expected", [(None, 1), ("1", 1), (" 3 ", 3), ("auto", 4), ("AUTO", 4), (2, 2)])
def test_parse_procs(text, expected):
    assert parse_procs(text, cores=4) == expected


@pytest.mark.parametrize("text,needle", [("0", "at least 1"), ("two", "whole number"), ("-1", "at least 1")])
def test_a_bad_procs_value_is_one_line_and_exit_2(capsys, text, needle):
    assert main(["--no-ui", "--duration", "1", "--procs", text]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [err.strip()]
    assert "--procs" in err and needle in err


def test_a_host_limit_too_small_to_share_is_refused_before_the_run(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'preset = "study"\n[keys]\nsecrets = {json.dumps(KEYS)}\nhost_limits = ["1/1s"]\n')
    assert main(["--no-ui", "--duration", "1", "--procs", "2", "--config", str(config)]) == 2
    _, err = capsys.readouterr()
    assert "--procs" in err and "cannot be shared by 2 processes" in err


# ---------------------------------------------------------------- merging


def _hist(values):
    h = LatencyHistogram()
    for v in values:
        h.add(v)
    return h


def test_percentiles_of_several_processes_are_exact_when_each_sends_its_histogram():
    rng = random.Random(7)
    a = [rng.uniform(10, 50) for _ in range(3000)]
    b = [rng.uniform(200, 400) for _ in range(1000)]
    merged = merge_latency([_hist(a).summary(whole=True), _hist(b).summary(whole=True)])
    one = _hist(a + b).summary()
    assert (merged.p50, merged.p90, merged.p99, merged.p999, merged.max, merged.count) == (
        one.p50,
        one.p90,
        one.p99,
        one.p999,
        one.max,
        one.count,
    )
    assert merged.mean == pytest.approx(one.mean)
    assert merged.buckets == one.buckets
    assert merged.hist == ()  # a merged summary travels light


def test_without_histograms_each_percentile_is_the_largest_of_the_parts():
    low, high = _hist([10.0] * 100).summary(), _hist([300.0] * 10).summary()
    merged = merge_latency([low, high])
    assert merged.p50 == high.p50  # an upper bound, never an underestimate
    assert merged.count == 110
    assert merged.mean == pytest.approx((10.0 * 100 + 300.0 * 10) / 110)


def _part(label, **kw):
    base = dict(
        elapsed_s=10.0,
        phase=Phase.RUNNING,
        capacity_tps=100.0,
        throughput_tps=90.0,
        generated=1000,
        succeeded=900,
        expired=50,
        shed=10,
        main_depth=30,
        in_flight=10,
        sent=960,
        rejected_429=1,
        cpu_s=2.0,
        headroom_ms=20.0,
        arrival_rate=100.0,
        failures=(("timed out", 2),),
        keys=(KeyRow(label, "…abcd"),),
        tps_series=(80.0, 90.0),
        gates=(GateRow(label, 0.0, "", 0, 0), GateRow("host", 1.5, "429", 1, 0)),
        events=(Event(1.0, EventKind.INFO, f"{label} started"),),
    )
    base.update(kw)
    return Snapshot(**base)


def test_merged_snapshots_add_up_concatenate_keys_and_still_balance():
    a = _part("k1")
    b = _part("k2", tps_series=(70.0,), headroom_ms=35.0, phase=Phase.DRAINING, cpu_s=3.0)
    assert a.balance() == 0 and b.balance() == 0
    m = merge_snapshots([a, b])
    assert m.balance() == 0
    assert (m.generated, m.succeeded, m.sent, m.in_flight) == (2000, 1800, 1920, 20)
    assert [k.label for k in m.keys] == ["k1", "k2"]
    assert m.capacity_tps == 200.0 and m.arrival_rate == 200.0
    assert m.failures == (("timed out", 4),)
    assert m.tps_series == (80.0, 160.0)  # aligned on the newest second
    assert m.headroom_ms == 35.0  # the widest
    assert m.phase == Phase.RUNNING  # the least advanced
    assert m.procs == 2 and m.cpu_s == 5.0
    assert m.cpu_us_per_request == pytest.approx(5.0e6 / (1920 - 20))
    assert [g.name for g in m.gates] == ["host", "k1", "k2"]  # one host gate: the longest closure
    assert [e.text for e in m.events] == ["[p1] k1 started", "[p2] k2 started"]


# ---------------------------------------------------------------- the client's own cost


def test_a_merged_snapshot_carries_any_part_s_cluster_view():
    view = ClusterView(members=(MemberRow("h:1:ab"), MemberRow("h:2:cd")), waiting=5)
    assert merge_snapshots([Snapshot(), Snapshot()]).cluster is None
    assert merge_snapshots([Snapshot(), Snapshot(cluster=view)]).cluster == view
    assert merge_snapshots([Snapshot(cluster=view), Snapshot()]).cluster == view


def test_a_late_loop_is_warned_once_per_interval_and_shown_for_a_few_seconds(tmp_path):
    from ratedeck.engine.engine import LOOP_LAG_WARN_EVERY_S
    from tests.support.engine_helpers import seed_engine

    engine, _ = seed_engine(tmp_path)
    warnings = lambda: [e for e in engine.parts.log.rows if "loop runs late" in e.text]  # noqa: E731
    engine.parts.loop.note_lag(0.002, 1.0)  # 2 ms: timers and a busy turn, nothing to say
    assert engine.parts.loop.lag_ms == pytest.approx(2.0) and not warnings()
    engine.parts.loop.note_lag(0.040, 1.1)  # one late tick alone: a long turn, shown but not warned
    assert engine.parts.loop.lag_ms == pytest.approx(40.0) and not warnings()
    engine.parts.loop.note_lag(0.001, 1.2)
    engine.parts.loop.note_lag(0.030, 1.3)
    assert not warnings()
    engine.parts.loop.note_lag(0.040, 1.4)  # the second late tick in a row: the loop cannot keep up
    assert len(warnings()) == 1 and "40 ms late" in warnings()[0].text
    assert warnings()[0].kind == EventKind.ERROR
    engine.parts.loop.note_lag(0.050, 2.0)  # still late: no second warning yet
    assert len(warnings()) == 1
    engine.parts.loop.note_lag(0.001, 20.0)  # the window turned: the last one's worst still shows
    assert engine.parts.loop.lag_ms == pytest.approx(50.0)
    engine.parts.loop.note_lag(0.001, 30.0)  # two windows later it is gone
    assert engine.parts.loop.lag_ms == pytest.approx(1.0)
    engine.parts.loop.note_lag(0.030, 1.4 + LOOP_LAG_WARN_EVERY_S)
    assert len(warnings()) == 1
    engine.parts.loop.note_lag(0.030, 1.5 + LOOP_LAG_WARN_EVERY_S)
    assert len(warnings()) == 2


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_procs_2_headless_prints_one_merged_report_that_balances_and_covers_every_key(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            *RATEDECK,
            "--no-ui",
            "--procs",
            "2",
            "--duration",
            "3",
            "--interval",
            "1",
            "--graveyard",
            str(tmp_path / "dead.jsonl"),
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("=== ratedeck final summary ===") == 1
    assert "in 2 processes" in proc.stdout
    data = json.loads(report.read_text())
    assert data["balance_ok"] is True
    req = data["requests"]
    assert req["generated"] == accounted(req)
    assert req["succeeded"] > 0
    assert sorted(k["label"] for k in data["keys"]) == sorted(f"k{i}" for i in range(1, 6))
    assert all(k["sent"] > 0 for k in data["keys"])  # both processes sent
    assert data["client"]["procs"] == 2 and data["client"]["cpu_us_per_request"] > 0
    # One simulator served both processes: its count is the whole run's, and its audit held.
    assert data["server"]["audit_ok"] is True
    assert data["server"]["totals"]["accepted"] >= req["succeeded"]


def test_the_console_limiter_panel_names_the_client_s_cpu_per_request_and_a_late_loop():
    from ratedeck.console.widgets.limiter import client_text, lag_text, verdict_text

    assert client_text(Snapshot()) == ""  # nothing answered yet: nothing to say
    snap = Snapshot(sent=1000, in_flight=0, cpu_s=0.25, procs=2, loop_lag_ms=3.0, elapsed_s=2.0)
    assert "250 µs" in client_text(snap)
    assert "2×6% core" in client_text(snap)  # 0.25 s of CPU in 2 s, over 2 processes
    quiet = dataclasses.replace(snap, lag=LoopLag(p50_ms=0.2, p99_ms=3.14))
    assert lag_text(quiet) == "p50 [b]0.2[/] · p99 [b]3.1[/] · max 3.0 ms"
    late = dataclasses.replace(snap, loop_lag_ms=40.0, lag=LoopLag(p50_ms=1.0, p99_ms=25.0))
    assert "p99 [b $text-warning]25[/] · max 40 ms" in lag_text(late)  # over 10 ms: a warning
    assert verdict_text(late) == ""  # the verdict is the engine's, not the figures'
    bound = dataclasses.replace(late, lag=LoopLag(p99_ms=25.0, limit="loop late p99 25 ms"))
    assert "the client, not the server, is the limit" in verdict_text(bound)
    # once stopped, the whole run's figures and verdict
    run = LatencySummary(p50=0.5, p99=2.0, max=7.5, count=300)
    stopped = dataclasses.replace(bound, phase=Phase.STOPPED, lag=LoopLag(p99_ms=25.0, run=run, limit="x"))
    assert lag_text(stopped) == "p50 [b]0.5[/] · p99 [b]2.0[/] · max 7.5 ms" and verdict_text(stopped) == ""


@pytest.mark.slow
def test_ctrl_c_drains_every_process_and_prints_one_summary(tmp_path):
    import signal

    proc = subprocess.Popen(
        [
            *RATEDECK,
            "--no-ui",
            "--procs",
            "2",
            "--graveyard",
            str(tmp_path / "dead.jsonl"),
            "--interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # printed once every process runs
        assert "in 2 processes" in first, first
        for line in proc.stdout:  # a periodic block: requests are flowing
            if line.startswith("requests") and " succeeded 0 " not in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "stopping: no new requests" in out
    assert out.count("=== ratedeck final summary ===") == 1
    accounting = next(line for line in out.splitlines() if line.startswith("accounting"))
    assert "MISMATCH" not in accounting
    assert "audit ok" in out
