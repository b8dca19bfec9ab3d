"""`--metrics-port`: /metrics for Prometheus, scraped for real.

A scrape during a run parses with prometheus_client's own parser; after the
run (`--metrics-linger`) the counters equal the report's; a port in use is
exit 2 before the run; labels never carry a key; a scrape costs little.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ratedeck.core.study_server import STUDY_KEYS
from ratedeck.engine.observe.metrics import BUCKET_EDGES_MS
from ratedeck.engine.snapshot import ErrorRow, GateRow, KeyRow, LatencySummary, Snapshot
from ratedeck.runner.prometheus import Scrape, families, serve_metrics
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
DASHBOARD = Path(__file__).parents[2] / "runner" / "grafana-dashboard.json"


def _env(tmp_path):
    return dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label pairs: value} for every sample, parsed by prometheus_client."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _value(samples, name, **labels):
    return samples[name][tuple(sorted(labels.items()))]


def _read_until(stream, needle: str, seen: list[str]) -> str:
    """Read lines until one contains `needle` (the event the test waits for); returns it."""
    for line in stream:
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"never saw {needle!r}; output:\n{''.join(seen)}")


# ---------------------------------------------------------------- a real run, scraped


@pytest.mark.slow
def test_a_scrape_during_a_run_parses_and_the_end_equals_the_report(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        RATEDECK
        + [
            "--no-ui",
            "--duration",
            "3s",
            "--interval",
            "500ms",
            "--metrics-port",
            "0",
            "--metrics-linger",
            "2m",
            "--report",
            str(report),
            "--graveyard",
            "",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    seen: list[str] = []
    try:
        url = re.search(r"http://\S+/metrics", _read_until(proc.stdout, "metrics at", seen)).group()
        _read_until(proc.stdout, "--- ratedeck metrics at", seen)  # traffic is flowing
        during = scrape(url)
        assert _value(during, "ratedeck_requests_total", outcome="succeeded") > 0
        assert _value(during, "ratedeck_phase", phase="running") == 1
        assert during["ratedeck_latency_seconds_count"][()] > 0
        _read_until(proc.stdout, "serving the final metrics", seen)  # the run is over, the report written
        end = scrape(url)
        end_text = urllib.request.urlopen(url, timeout=10).read().decode()
        proc.send_signal(signal.SIGINT)  # ends the linger
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    data = json.loads(report.read_text())
    assert validate(data) == []
    req = data["requests"]
    assert _value(end, "ratedeck_requests_generated_total") == req["generated"]
    for outcome in ("succeeded", "expired", "graveyard", "shed", "uncertain"):
        assert _value(end, "ratedeck_requests_total", outcome=outcome) == req[outcome], outcome
    for outcome in ("succeeded", "rejected_429", "rejected_other", "failed"):
        assert _value(end, "ratedeck_attempts_total", outcome=outcome) == req[outcome], outcome
    assert _value(end, "ratedeck_attempts_sent_total") == req["sent"]
    assert _value(end, "ratedeck_retries_total") == req["retried"]
    assert _value(end, "ratedeck_requests_pending", where="in_flight") == req["in_flight_at_end"]
    queued = _value(end, "ratedeck_requests_pending", where="main") + _value(
        end, "ratedeck_requests_pending", where="dlq"
    )
    assert queued == req["queued_at_end"]
    for key in data["keys"]:
        assert _value(end, "ratedeck_key_attempts_sent_total", key=key["label"]) == key["sent"]
        assert (
            _value(end, "ratedeck_key_attempts_total", key=key["label"], outcome="succeeded")
            == key["succeeded"]
        )
    assert end["ratedeck_latency_seconds_count"][()] == data["latency_ms"]["count"] == req["succeeded"]
    assert end["ratedeck_latency_total_seconds_count"][()] == data["latency_total_ms"]["count"]
    assert _value(
        end, "ratedeck_latency_quantile_seconds", stage="send_answer", quantile="0.99"
    ) == pytest.approx(data["latency_ms"]["p99"] / 1000, abs=1e-4)
    assert _value(
        end, "ratedeck_latency_quantile_seconds", stage="arrival_done", quantile="1"
    ) == pytest.approx(data["latency_total_ms"]["max"] / 1000, abs=1e-4)
    assert _value(end, "ratedeck_phase", phase="stopped") == 1
    assert _value(end, "ratedeck_client_cpu_seconds_total") == pytest.approx(
        data["client"]["cpu_s"], abs=1e-3
    )
    assert _value(end, "ratedeck_client_processes") == data["client"]["procs"] == 1
    for q in ("p50", "p99"):  # a stopped run's lag is the whole run's, as the report's
        assert _value(end, f"ratedeck_loop_lag_{q}_seconds") == pytest.approx(
            data["loop"][f"lag_{q}_ms"] / 1000, abs=1e-4
        )
    assert _value(end, "ratedeck_client_is_the_limit") == float(data["loop"]["client_is_the_limit"])
    everything = "".join(seen) + out + err + end_text
    assert not any(k in everything for k in STUDY_KEYS)


@pytest.mark.slow
def test_a_metrics_port_in_use_is_exit_2_before_the_run(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            RATEDECK + ["--no-ui", "--duration", "30s", "--metrics-port", str(port), "--report", "r.json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=_env(tmp_path),
        )
    assert proc.returncode == 2
    assert (
        proc.stderr.count("\n") == 1 and f"--metrics-port {port}" in proc.stderr and "in use" in proc.stderr
    )
    assert "ratedeck metrics at" not in proc.stdout and not (tmp_path / "r.json").exists()  # no run


def test_bad_metrics_flags_are_one_line_exit_2(capsys, tmp_path, monkeypatch):
    from ratedeck.runner.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for argv, needle in (
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--metrics-port", "http"], "--metrics-port"),
        (["--metrics-port", "0", "--metrics-linger", "5 parsecs"], "--metrics-linger"),
        (["--metrics-linger", "5s"], "needs --metrics-port"),
    ):
        assert main(["--no-ui", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err


# ---------------------------------------------------------------- rendering


def _big_snapshot(keys: int = 50) -> Snapshot:
    lat = LatencySummary(mean=40, p50=35, p90=60, p99=90, max=120, p999=110, count=10_000)
    return Snapshot(
        elapsed_s=60,
        generated=10_000,
        succeeded=9_000,
        sent=9_500,
        rejected_429=3,
        failed=5,
        failures=(("timeout", 5),),
        errors=(ErrorRow(429, "rate_limited", "rate_limited", 3, "slow down", "k1", 3.0),),
        latency=lat,
        latency_total=lat,
        queue_wait=lat,
        keys=tuple(
            KeyRow(
                f"k{i}",
                "…abcd",
                sent=190,
                succeeded=180,
                rejected_429=1,
                errors=4,
                window_used=5,
                window_limit=20,
            )
            for i in range(1, keys + 1)
        ),
        gates=tuple(GateRow(f"k{i}", 0.0, "", 0, 0) for i in range(1, keys + 1)),
    )


def test_key_labels_never_carry_secrets():
    secret = "sk_live_SECRETSECRET1234"
    snap = Snapshot(keys=(KeyRow("k1", "…1234", sent=1),))
    server = serve_metrics(lambda: Scrape(snap), 0)
    try:
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    finally:
        server.close()
    assert 'key="k1"' in text and secret not in text and "1234" not in text


def test_a_scrape_costs_under_2_percent_of_a_second():
    """Scraping every second, 50 keys: the engine's snapshot with the histograms' buckets (on
    the engine's loop) and the render (on the scraping thread, holding the GIL) take under
    20 ms of CPU together, 2% of each second. CPU time, so a busy machine does not count."""
    from ratedeck.config import load_config
    from ratedeck.engine.engine import Engine
    from ratedeck.runner.prometheus import engine_scrape

    cfg = load_config(
        overrides={"keys": {"secrets": [f"key-{i:04d}-secret" for i in range(50)], "limits": ["100/1s"]}}
    )
    engine = Engine(cfg, transport=None)  # never started: only read
    for h in (
        engine.parts.metrics.latency,
        engine.parts.metrics.latency_total,
        engine.parts.metrics.queue_wait,
    ):
        for i in range(20_000):
            h.add(i % 700 / 7.0)
    loop_side: list[float] = []

    def source():
        start = time.thread_time()
        scrape = engine_scrape(engine)
        loop_side.append(time.thread_time() - start)
        return scrape

    server = serve_metrics(source, 0)
    costs = []
    try:
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()  # warm up
        assert 'key="k50"' in text and len(text.splitlines()) > 700
        for _ in range(15):
            urllib.request.urlopen(server.url, timeout=10).read()
            costs.append(server.collector.last_cpu_s)
    finally:
        server.close()
    per_scrape = statistics.median(costs)  # render + loop side (source() runs inside collect)
    assert 0 < statistics.median(loop_side) < per_scrape
    assert per_scrape < 0.020, f"{per_scrape * 1000:.1f} ms of CPU per scrape"


def test_histogram_buckets_count_the_engine_s_bins():
    from ratedeck.engine.observe.metrics import LatencyHistogram

    h = LatencyHistogram()
    for ms in (0.5, 0.99, 3, 9.99, 10, 49, 800, 1500, 59_000, 61_000):
        h.add(ms)
    got = dict(h.cumulative())
    assert h.summary().buckets == h.cumulative()  # snapshots carry them, so a console run's scrape has them
    assert got[1] == 2 and got[5] == 3 and got[10] == 4 and got[50] == 6 and got[1000] == 7
    assert got[2500] == 8 and got[60000] == 9 and h.count == 10  # 61 s only in +Inf
    assert [edge for edge, _ in h.cumulative()] == [float(e) for e in BUCKET_EDGES_MS]


def test_the_dashboard_uses_only_metrics_that_exist():
    names = set()
    for family in families(_big_snapshot(2), {"latency": ((1.0, 1),)}):
        names |= {s.name for s in family.samples} | {family.name}
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\bratedeck_[a-z0-9_]+", target["expr"]))
    assert used and used <= names, used - names


# ---------------------------------------------------------------- the console's run


@pytest.mark.slow
def test_a_console_run_serves_metrics_from_the_parent(tmp_path, monkeypatch):
    """`run_console` with the engine in its child process: the parent serves /metrics from the
    snapshots it receives. The Textual app is replaced by a stand-in that scrapes and quits."""
    import ratedeck.console.app as console_app
    from ratedeck.config import load_config
    from ratedeck.runner.commands.run import run_console
    from ratedeck.runner.headless import MetricsEndpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    scrapes: list[dict] = []

    class StandIn:
        def __init__(self, host, **_):
            self.host = host

        def run(self):
            deadline = time.monotonic() + 30
            while self.host.snapshot().succeeded < 20 and time.monotonic() < deadline:
                time.sleep(0.05)  # the child publishes every 0.1 s
            scrapes.append(scrape(url))
            return None

    monkeypatch.setattr(console_app, "RatedeckApp", StandIn)
    report = tmp_path / "report.json"
    cfg = load_config(overrides={"run": {"report": str(report)}, "engine": {"graveyard_path": ""}})
    code = run_console(cfg, metrics=MetricsEndpoint(port))
    assert code == 0
    (during,) = scrapes
    assert _value(during, "ratedeck_requests_total", outcome="succeeded") >= 20
    assert _value(during, "ratedeck_key_attempts_sent_total", key="k1") > 0
    assert during["ratedeck_latency_seconds_count"][()] > 0  # +Inf only until the snapshot carries buckets
    data = json.loads(report.read_text())
    assert validate(data) == [] and data["requests"]["succeeded"] >= _value(
        during, "ratedeck_requests_total", outcome="succeeded"
    )
    with pytest.raises(OSError):  # served no longer
        urllib.request.urlopen(url, timeout=2)
