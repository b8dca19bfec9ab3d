"""A pool's endpoints where an operator looks: the report's `endpoints` (and each key's
`endpoint`), the headless summary's lines, Prometheus' `endpoint` label and per-endpoint gauges,
and the endpoint events printed as they happen. A run with one target shows none of it."""

from __future__ import annotations

import asyncio
import io

from ratedeck.core.vocab import EventKind, OutcomeKind
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.observe.events import EventLog
from ratedeck.engine.path.health import DOWN_AFTER, EndpointHealth
from ratedeck.engine.snapshot import EndpointRow, Event, KeyRow, ModelLimits, Snapshot
from ratedeck.runner.headless import EndpointEvents, endpoint_lines, metrics_block, summary_lines
from ratedeck.runner.report import build_report
from tests.runner.test_report_schema import validate
from tests.support.metrics import scrape

MINI = "gpt-4o-mini"


def pool_snapshot(east_state: str = "down") -> Snapshot:
    keys = (
        KeyRow("east", "…aaaa", sent=40, succeeded=30, rejected_429=2, endpoint="east"),
        KeyRow("openai-1", "…bbbb", sent=50, succeeded=50, endpoint="openai"),
        KeyRow("openai-2", "…cccc", sent=10, succeeded=9, rejected_429=1, endpoint="openai"),
    )
    east = EndpointRow(
        "east",
        "azure-openai",
        "https://east-res.openai.azure.com",
        (MINI,),
        (ModelLimits(MINI, (("requests", 120.0), ("tokens", 20000.0))),),
        east_state,
        "out of the pool: 3 attempts in a row failed (the last: connection)" if east_state != "up" else "",
        1,
        1,
        40,
        30,
        2,
    )
    openai = EndpointRow(
        "openai",
        "openai",
        "https://api.openai.com",
        ("any",),
        (
            ModelLimits(MINI, (("requests", 1000.0), ("tokens", 400000.0)), followed=True),
            ModelLimits("gpt-4o"),
        ),
        "up",
        "",
        0,
        2,
        60,
        59,
        1,
    )
    return Snapshot(elapsed_s=10.0, sent=100, succeeded=89, keys=keys, endpoints=(east, openai))


def one_target_snapshot() -> Snapshot:
    return Snapshot(elapsed_s=10.0, sent=5, succeeded=5, keys=(KeyRow("k1", "…aaaa", sent=5, succeeded=5),))


# ---------------------------------------------------------------- report


def test_the_report_has_each_endpoint_and_validates():
    report = build_report(pool_snapshot())
    assert validate(report) == []
    east, openai = report["endpoints"]
    assert east == {
        "name": "east",
        "preset": "azure-openai",
        "url": "https://east-res.openai.azure.com",
        "serves": [MINI],
        "models": [
            {
                "model": MINI,
                "limits": [{"unit": "requests", "per_min": 120.0}, {"unit": "tokens", "per_min": 20000.0}],
                "followed": False,
            }
        ],
        "state": "down",
        "reason": "out of the pool: 3 attempts in a row failed (the last: connection)",
        "downs": 1,
        "keys": 1,
        "sent": 40,
        "succeeded": 30,
        "rejected_429": 2,
    }
    assert openai["serves"] == ["any"] and openai["models"][1] == {
        "model": "gpt-4o",
        "limits": [],
        "followed": False,
    }
    assert [k["endpoint"] for k in report["keys"]] == ["east", "openai", "openai"]


def test_a_report_with_one_target_is_as_before():
    report = build_report(one_target_snapshot())
    assert validate(report) == []
    assert "endpoints" not in report
    assert "endpoint" not in report["keys"][0]


def test_the_schema_refuses_an_endpoint_state_it_does_not_know():
    report = build_report(pool_snapshot())
    report["endpoints"][0]["state"] = "sideways"
    assert any("sideways" in p for p in validate(report))


# ---------------------------------------------------------------- headless


def test_the_summary_has_a_line_per_endpoint():
    lines = summary_lines(pool_snapshot())
    shown = [line for line in lines if "(azure-openai)" in line or "(openai)" in line]
    assert shown == [
        "endpoints    east (azure-openai) down (out of the pool: 3 attempts in a row failed (the last: connection))"
        ", out 1x  keys 1  sent 40  ok 30  429 2  gpt-4o-mini: requests 120/min, tokens 20,000/min",
        "             openai (openai) up  keys 2  sent 60  ok 59  429 1"
        "  gpt-4o-mini: requests 1,000/min, tokens 400,000/min; gpt-4o: not sent yet",
    ]
    assert endpoint_lines(pool_snapshot().endpoints)[0] in metrics_block(pool_snapshot())


def test_one_target_prints_no_endpoint_line():
    assert not any(line.startswith("endpoints") for line in summary_lines(one_target_snapshot()))
    assert endpoint_lines(()) == []


def test_endpoint_events_are_printed_once_as_they_come():
    log = EventLog()
    health = EndpointHealth("east", log)
    log.event(EventKind.INFO, "started: 3 keys")
    tail = EndpointEvents()
    assert tail.new(log.rows) == []  # nothing of an endpoint yet
    failed = Outcome(OutcomeKind.CONNECTION, error="connection refused")
    for _ in range(DOWN_AFTER):
        health.answered(failed, 1.0)
    log.event(EventKind.SETTING, "east: told 120/1m, limit estimate 100/1m")  # not an endpoint's
    out = tail.new(log.rows)
    assert [e.kind for e in out] == [EventKind.COOLDOWN]
    assert out[0].text.startswith("endpoint east: out of the pool: 3 attempts in a row failed")
    assert tail.new(log.rows) == []  # printed once
    health.answered(Outcome(OutcomeKind.OK, status=200), 7.0)
    (back,) = tail.new(log.rows)
    assert back.text == "endpoint east: answers again, back in the pool"


def test_endpoint_events_survive_the_log_dropping_its_oldest():
    tail = EndpointEvents()
    rows = [Event(0.0, EventKind.INFO, "started")]
    assert tail.new(rows) == []
    rows = [
        Event(1.0, EventKind.COOLDOWN, "endpoint east: out of the pool: x"),
        Event(2.0, EventKind.INFO, "y"),
    ]
    assert [e.at_s for e in tail.new(rows)] == [1.0]  # the last one seen is gone: all are new


def test_the_watch_loop_prints_endpoint_events(monkeypatch):
    """`_watch` (the headless run loop) reads the log each tick and prints what is new."""
    from ratedeck.runner import headless

    monkeypatch.setattr(headless, "_TICK_S", 0.01)
    log = EventLog()
    log.event(EventKind.COOLDOWN, "endpoint west: out of the pool: the probe failed (HTTP 503)")

    class Cfg:
        class runner:
            duration_s = 0.1

    class Signals:
        drain = asyncio.Event()

    async def main() -> str:
        out = io.StringIO()
        facts = lambda: headless.RunFacts()  # noqa: E731
        await headless._watch(
            Cfg(), 60.0, out, Signals(), [], facts, Snapshot, lambda: False, events=lambda: log.rows
        )  # type: ignore[arg-type]
        return out.getvalue()

    text = asyncio.run(main())
    assert text.count("endpoint west: out of the pool") == 1, text


# ---------------------------------------------------------------- Prometheus


def test_key_series_carry_their_endpoint_in_a_pool():
    by_name = scrape(pool_snapshot())
    sent = {s.labels["key"]: s.labels for s in by_name["ratedeck_key_attempts_sent"].samples}
    assert sent["east"]["endpoint"] == "east" and sent["openai-2"]["endpoint"] == "openai"
    states = by_name["ratedeck_key_state"].samples
    assert {s.labels["endpoint"] for s in states} == {"east", "openai"}


def test_each_endpoint_has_an_up_gauge_and_its_models_limits():
    by_name = scrape(pool_snapshot())
    up = {s.labels["endpoint"]: s.value for s in by_name["ratedeck_endpoint_up"].samples}
    assert up == {"east": 0.0, "openai": 1.0}
    assert scrape(pool_snapshot("probing"))["ratedeck_endpoint_up"].samples[0].value == 0.0
    assert scrape(pool_snapshot("up"))["ratedeck_endpoint_up"].samples[0].value == 1.0
    downs = {s.labels["endpoint"]: s.value for s in by_name["ratedeck_endpoint_downs"].samples}
    assert downs == {"east": 1.0, "openai": 0.0}
    limits = {
        (s.labels["endpoint"], s.labels["model"], s.labels["unit"]): s.value
        for s in by_name["ratedeck_endpoint_model_limit_per_minute"].samples
    }
    assert limits == {
        ("east", MINI, "requests"): 120.0,
        ("east", MINI, "tokens"): 20000.0,
        ("openai", MINI, "requests"): 1000.0,
        ("openai", MINI, "tokens"): 400000.0,
    }


def test_one_target_scrapes_as_before():
    by_name = scrape(one_target_snapshot())
    assert not any(name.startswith("ratedeck_endpoint") for name in by_name)
    (sample,) = by_name["ratedeck_key_attempts_sent"].samples
    assert sample.labels == {"key": "k1"}


# ---------------------------------------------------------------- a real --no-ui run


def test_a_headless_pool_run_prints_an_endpoint_leaving_the_pool(tmp_path):
    """Two OpenAI stubs, one gone before the start (connection refused): the run prints that
    endpoint leaving the pool as it happens, its summary has both endpoints, its report too."""
    import json
    import subprocess
    import sys

    from ratedeck.server.stubs.openai import start_openai

    async def main() -> tuple[int, str]:
        live = await start_openai(keys=["sk-live-000000000000"], rpm=600, tpm=60000)
        dead = await start_openai(keys=["sk-dead-000000000000"], rpm=600, tpm=60000)
        dead_url = dead.url
        await dead.close()
        try:
            (tmp_path / "pool.toml").write_text(
                "\n".join(
                    f'[[endpoints]]\nname = "{name}"\npreset = "openai"\nurl = "{url}"\nkeys = ["{key}"]'
                    for name, url, key in (
                        ("live", live.url, "sk-live-000000000000"),
                        ("dead", dead_url, "sk-dead-000000000000"),
                    )
                )
            )
            with (tmp_path / "batch.jsonl").open("w") as f:
                for i in range(20):
                    body = {"model": MINI, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
                    line = {
                        "custom_id": f"r{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    }
                    f.write(json.dumps(line) + "\n")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--config", "pool.toml",
                "--workload", "batch.jsonl", "--results", "out.jsonl", "--report", "report.json",
                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            return proc.returncode or 0, out.decode()
        finally:
            await live.close()

    code, out = asyncio.run(main())
    assert code == 0, out
    printed = [line for line in out.splitlines() if "endpoint dead: out of the pool" in line]
    assert len(printed) == 1 and printed[0].startswith("ratedeck: "), out
    # printed as it happened: before the final summary
    assert out.index("endpoint dead: out of the pool") < out.index("=== ratedeck final summary ===")
    assert any(line.startswith("endpoints    live (openai) up") for line in out.splitlines()), out
    report = json.loads((tmp_path / "report.json").read_text())
    dead_row = {e["name"]: e for e in report["endpoints"]}["dead"]
    assert dead_row["state"] in ("down", "probing") and dead_row["downs"] >= 1
