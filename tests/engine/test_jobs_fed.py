"""Jobs fed as fast as the limits allow, and their makespan, on virtual time.

A workload file with no `--rate` is fed by backpressure: the main queue stays
full and the limiter is the only brake, so a bucket's burst and a fixed
window's spare quota get used. `tests/policy_server.py` plays a server of any
policy kind with costs on the loop's clock; its ledger is the truth.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tracemalloc

import pytest

from ratedeck.config import load_config
from ratedeck.core.policy import parse_policy
from ratedeck.engine.commands import SetArrivalRate, SetBackpressure
from ratedeck.engine.engine import Engine
from ratedeck.engine.snapshot import Makespan, Snapshot
from ratedeck.engine.sources.workload import read_jsonl
from ratedeck.runner.headless import makespan_line, summary_lines
from ratedeck.runner.report import build_report
from ratedeck.server.policy_transport import PolicyTransport
from ratedeck.server.simulated import run_virtual
from tests.runner.test_report_schema import validate


def write_jobs(tmp_path, n: int, weights=(1,)) -> str:
    path = tmp_path / "jobs.jsonl"
    with path.open("w") as f:
        for i in range(n):
            w = weights[i % len(weights)]
            f.write(json.dumps({"i": i, "_weight": w} if w != 1 else {"i": i}) + "\n")
    return str(path)


def job_config(tmp_path, policy: str, keys: int, n: int, *, weights=(1,), **workload):
    secrets = [f"key-{i:02d}-0000000000000000" for i in range(keys)]
    key_section: dict = {"secrets": secrets, "limits": [policy]}
    if weights != (1,):
        key_section["unit"] = "weight"
    return load_config(
        overrides={
            "target": {"url": "http://policy-server/api"},
            "keys": key_section,
            "engine": {"graveyard_path": "", "ttl_s": 36000.0, "queue_max": 100},
            "workload": {"file": write_jobs(tmp_path, n, weights), **workload},
            "run": {"seed": 1},
        }
    )


def job_engine(tmp_path, policy: str, keys: int, n: int, *, weights=(1,), latency=(1, 5), **workload):
    cfg = job_config(tmp_path, policy, keys, n, weights=weights, **workload)
    transport = PolicyTransport((parse_policy(policy),), latency_ms=latency)
    return Engine(cfg, transport), transport


def kraken_share(tmp_path, **workload) -> tuple[Snapshot, float]:
    """2 keys x 15@0.33/s, costs 1 and 2, 40 s: the units served over the most the counters allow."""
    engine, server = job_engine(tmp_path, "15@0.33/s", 2, 2000, weights=(1, 2), **workload)
    snap = run_virtual(engine.run(40.0))
    served = sum(cost for _, _, cost in server.accepted)
    return snap, served / (2 * (15 + 0.33 * 40))


def test_a_kraken_style_job_uses_the_counters_burst(tmp_path):
    snap, share = kraken_share(tmp_path)
    assert share >= 0.90, share
    assert snap.rejected_429 == 0 and snap.succeeded >= 40
    # The same job at an arrival rate of the drain rate (what a job got before): the burst is lost.
    paced, paced_share = kraken_share(tmp_path, rate=0.66)
    assert paced_share < 0.75 and paced.succeeded < snap.succeeded


@pytest.mark.parametrize(
    ("policy", "keys", "n"),
    [("20/1s", 5, 6000), ("20/2s fixed", 5, 3000), ("15@0.33/s", 2, 70)],
    ids=["sliding", "fixed", "bucket"],
)
def test_a_job_of_a_minute_of_limit_ends_within_5_percent_of_the_least_time(tmp_path, policy, keys, n):
    engine, server = job_engine(tmp_path, policy, keys, n)
    snap = run_virtual(engine.run(600.0))
    assert snap.succeeded == n and snap.rejected_429 == 0 and server.refused == 0
    m = snap.makespan
    assert m is not None and m.jobs == n and m.least_s >= 55.0
    assert m.ratio is not None and 1.0 <= m.ratio <= 1.05, m
    assert snap.main_peak <= 100  # fed as fast as allowed, never more than the queue holds


def test_a_fed_job_keeps_the_queue_bounded_with_backpressure_off(tmp_path):
    engine, _ = job_engine(tmp_path, "20/1s", 2, 400)

    async def main():
        engine.start()
        engine.apply(SetBackpressure(False))
        await asyncio.sleep(5.0)
        return await engine.stop()

    snap = run_virtual(main())
    assert snap.main_peak <= 100 and snap.generated <= 100 + snap.succeeded + snap.in_flight
    assert snap.balance() == 0


def test_a_rate_makes_a_job_a_load_test_and_a_rate_command_paces_a_fed_one(tmp_path):
    engine, _ = job_engine(tmp_path, "20/1s", 5, 200, rate=10.0)  # capacity 100/s, arrivals 10/s
    snap = run_virtual(engine.run(600.0))
    assert snap.succeeded == 200 and 19.0 <= snap.makespan.elapsed_s <= 21.0
    assert snap.makespan.ratio > 5  # paced arrivals, not the limits, set the time

    engine, _ = job_engine(tmp_path, "20/1s", 5, 400)

    async def main():
        engine.start()
        await asyncio.sleep(0.5)  # fed: 100 at once, 50 in each later half second of slots
        engine.apply(SetArrivalRate(10.0))
        await asyncio.sleep(5.0)
        return await engine.stop()

    snap = run_virtual(main())
    # The queue was full when the rate came: its 100 drain at once, then 10/s arrive.
    assert snap.generated < 100 + 100 + 60, snap.generated
    assert not engine.parts.source.fed


def test_the_generated_stream_has_no_makespan(tmp_path):
    cfg = load_config(
        overrides={
            "target": {"url": "http://policy-server/api"},
            "keys": {"secrets": ["key-00-0000000000000000"], "limits": ["20/1s"]},
            "engine": {"graveyard_path": ""},
            "workload": {"total": 40},
        }
    )
    engine = Engine(cfg, PolicyTransport((parse_policy("20/1s"),)))
    snap = run_virtual(engine.run(60.0))
    assert snap.succeeded == 40 and snap.makespan is None and engine.parts.makespan is None
    assert not engine.parts.source.fed
    assert "makespan" not in build_report(snap)
    assert not [line for line in summary_lines(snap) if line.startswith("makespan")]
    assert "arrival 20/s" in "\n".join(summary_lines(snap)) and not snap.fed


def test_a_job_s_report_and_summary_carry_the_makespan(tmp_path):
    engine, _ = job_engine(tmp_path, "20/1s", 2, 200)
    snap = run_virtual(engine.run(600.0))
    report = build_report(snap)
    assert validate(report) == []
    assert list(report)[-1] == "makespan"
    m = report["makespan"]
    assert m["jobs"] == 200 and m["least_s"] > 4.0
    assert m["ratio"] == pytest.approx(m["elapsed_s"] / m["least_s"], abs=1e-3)
    assert snap.fed and "backpressure on  fed as fast as the limits allow" in "\n".join(summary_lines(snap))
    lines = [line for line in summary_lines(snap) if line.startswith("makespan")]
    s = snap.makespan
    assert lines == [
        f"makespan     200 jobs in {s.elapsed_s:.1f} s, least {s.least_s:.1f} s the limits allow:"
        f" ratio {s.ratio:.3f}"
    ]
    empty = build_report(Snapshot(makespan=Makespan()))
    assert empty["makespan"]["ratio"] is None and validate(empty) == []


def test_a_workload_file_is_read_a_line_at_a_time(tmp_path):
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(50_000):
            f.write(json.dumps({"order": f"o-{i:08d}", "amount": i}) + "\n")
    tracemalloc.start()
    try:
        items = read_jsonl(str(path))
        first = next(items)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first == {"order": "o-00000000", "amount": 0}
    assert peak < 2_000_000, peak  # held, the 50,000 objects would take well over 10 MB
    assert sum(1 for _ in items) == 49_999


def test_a_saved_config_keeps_a_fed_job_fed(tmp_path):
    from ratedeck.config import to_toml_dict
    from ratedeck.host.session import current_config

    cfg = job_config(tmp_path, "20/1s", 2, 10)
    engine = Engine(cfg, PolicyTransport((parse_policy("20/1s"),)))
    assert engine.parts.source.fed
    assert "rate" not in to_toml_dict(current_config(cfg, engine)).get("workload", {})
    engine.apply(SetArrivalRate(7.0))
    assert to_toml_dict(current_config(cfg, engine))["workload"]["rate"] == 7.0


def test_a_fed_job_with_a_ttl_queues_no_more_than_the_keys_send_before_it_passes(tmp_path):
    # 2 keys x 5/1s with a 1 s TTL: 5 may wait (what the keys send in half the TTL), not the
    # queue's 100, most of which would expire waiting; and sends stay evenly paced (behind a
    # burst, what waits would wait a whole window, longer than the TTL).
    cfg = job_config(tmp_path, "5/1s", 2, 60)
    cfg = cfg.replace(engine=dataclasses.replace(cfg.engine_settings.engine, ttl_s=1.0))
    engine = Engine(cfg, PolicyTransport((parse_policy("5/1s"),)))
    assert engine.parts.source.depth == 5
    snap = run_virtual(engine.run(60.0))
    assert snap.main_peak <= 5 and snap.expired == 0 and snap.succeeded == 60
    assert snap.makespan.ratio <= 1.25  # even pacing: the first window's burst goes unused


def test_a_fed_job_bursts_unless_a_request_would_expire_waiting_a_window():
    from ratedeck.engine.sources.workload import bursts_in_time, fed_depth

    def cfg(limit: str, ttl: float):
        return load_config(
            overrides={
                "target": {"url": "http://policy-server/api"},
                "keys": {
                    "secrets": ["key-00-0000000000000000", "key-01-0000000000000000"],
                    "limits": [limit],
                },
                "engine": {"ttl_s": ttl},
            }
        ).engine_settings

    assert bursts_in_time(cfg("20/1s", 36000.0)) and fed_depth(cfg("20/1s", 36000.0)) is None
    assert bursts_in_time(cfg("6000/1m fixed", 120.0))  # Binance's preset: 120 s behind a 1 min window
    assert bursts_in_time(cfg("15@0.33/s", 300.0))  # a bucket drains as it goes
    assert not bursts_in_time(cfg("20/1s", 1.0)) and fed_depth(cfg("20/1s", 1.0)) == 20  # 40/s x 0.5 s


def test_a_job_the_first_buckets_held_shows_no_ratio_to_nearly_nothing():
    line = makespan_line(Makespan(jobs=151, elapsed_s=9.2, least_s=0.007))
    assert line == (
        "makespan     151 jobs in 9.2 s; the limits allowed them at once (the keys' first buckets held them all)"
    )
    assert "ratio 1.500" in makespan_line(Makespan(jobs=10, elapsed_s=3.0, least_s=2.0))
