"""The report's JSON Schema (runner/report.schema.json): shipped with the package, every report
validates, and every field is described in docs/report.md.

`validate` is a small checker for the part of JSON Schema the file uses (type, required,
properties, additionalProperties, items, enum, const, minimum): jsonschema is not a
dependency. Other report tests import it (`from test_report_schema import validate`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path

import pytest

from ratedeck.config import load_config
from ratedeck.engine.snapshot import (
    ClusterView,
    ErrorRow,
    GateRow,
    KeyRow,
    LatencySummary,
    MemberRow,
    MessageStats,
    Snapshot,
)
from ratedeck.runner.report import SCHEMA_VERSION, build_report, schema

REPORT_PAGE = (Path(__file__).parents[2] / "docs" / "report.md").read_text()

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def accounted(req: dict) -> int:
    """Every place a report's requests can be at the end, added up: `generated` must equal it."""
    places = ("succeeded", "uncertain", "expired", "graveyard", "shed", "queued_at_end", "in_flight_at_end")
    return sum(req[place] for place in places)


def validate(instance, node: dict | None = None, path: str = "report") -> list[str]:
    """Every way `instance` breaks the schema (`node`, default the report's), one line each."""
    node = schema() if node is None else node
    problems: list[str] = []
    kinds = node.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is(instance, k) for k in kinds):
            return [f"{path}: expected {' or '.join(kinds)}, got {type(instance).__name__} {instance!r:.60}"]
    if "const" in node and instance != node["const"]:
        problems.append(f"{path}: expected {node['const']!r}, got {instance!r}")
    if "enum" in node and instance not in node["enum"]:
        problems.append(f"{path}: {instance!r} not one of {node['enum']}")
    if "minimum" in node and _is(instance, "number") and instance < node["minimum"]:
        problems.append(f"{path}: {instance} below {node['minimum']}")
    if isinstance(instance, dict):
        props = node.get("properties", {})
        for name in node.get("required", []):
            if name not in instance:
                problems.append(f"{path}: missing {name!r}")
        extra = node.get("additionalProperties", True)
        for name, value in instance.items():
            if name in props:
                problems += validate(value, props[name], f"{path}.{name}")
            elif extra is False:
                problems.append(f"{path}: unexpected field {name!r}")
            elif isinstance(extra, dict):
                problems += validate(value, extra, f"{path}.{name}")
    if isinstance(instance, list) and "items" in node:
        for i, item in enumerate(instance):
            problems += validate(item, node["items"], f"{path}[{i}]")
    return problems


# ---------------------------------------------------------------- the validator itself


def test_the_validator_finds_what_is_wrong():
    good = build_report(Snapshot())
    assert validate(good) == []
    bad = json.loads(json.dumps(good))
    del bad["requests"]["succeeded"]
    bad["latency_ms"]["p99"] = "fast"
    bad["balance_ok"] = 1
    bad["keys"] = [{"key": "k1"}]
    bad["surprise"] = True
    problems = "\n".join(validate(bad))
    for needle in (
        "report.requests: missing 'succeeded'",
        "report.latency_ms.p99: expected number",
        "report.balance_ok: expected boolean",
        "report.keys[0]: missing 'sent'",
        "unexpected field 'surprise'",
    ):
        assert needle in problems
    negative = json.loads(json.dumps(good))
    negative["requests"]["generated"] = -1
    assert validate(negative) == ["report.requests.generated: -1 below 0"]


# ---------------------------------------------------------------- reports validate


def _rich_snapshot() -> Snapshot:
    lat = LatencySummary(mean=12.5, p50=10, p90=20, p99=30, max=44, p999=40, count=7)
    return Snapshot(
        elapsed_s=3.2,
        capacity_tps=100,
        live_capacity_tps=80,
        throughput_tps=2.2,
        generated=10,
        succeeded=7,
        expired=1,
        graveyard=1,
        main_depth=1,
        sent=12,
        rejected_429=2,
        rejected_other=1,
        failed=1,
        retried=2,
        failures=(("timed out", 1),),
        errors=(ErrorRow(429, "rate_limited", "rate_limited", 2, "slow down …****", "k1", 1.5),),
        latency=lat,
        latency_total=lat,
        queue_wait=lat,
        keys=(KeyRow("k1", "…abcd", "cooling", 1.5, sent=12, succeeded=7, rejected_429=2, errors=5),),
        gates=(GateRow("k1", 1.5, "429", 2, 1),),
        messages=MessageStats(calls_per_message=2, generated=5, completed=3, failed=1, shed=1),
        tps_series=(1.0, 3.0),
        p50_series=(10.0, 11.0),
        p99_series=(20.0, 22.0),
    )


def test_reports_of_every_shape_validate():
    server = {"audit_ok": True, "totals": {"accepted": 7, "rejected_429": 2}}
    for report in (
        build_report(Snapshot()),
        build_report(_rich_snapshot()),
        build_report(_rich_snapshot(), server),
    ):
        assert validate(report) == []
        assert report["schema_version"] == SCHEMA_VERSION


def test_a_real_run_s_report_with_thresholds_validates(tmp_path):
    """A short in-process run on the embedded simulator, concluded as the command does."""
    import io

    from ratedeck.host.session import Session
    from ratedeck.runner.headless import conclude
    from ratedeck.runner.thresholds import parse

    report_path = tmp_path / "report.json"
    cfg = load_config(
        overrides={
            "run": {"report": str(report_path)},
            "engine": {"graveyard_path": ""},
            "workload": {"total": 30},
        }
    )

    async def run():
        session = Session(cfg)
        engine = await session.start()
        await asyncio.wait_for(engine.finished.wait(), 20)
        return await session.stop(), session

    snap, session = asyncio.run(run())
    code = conclude(
        snap,
        session.facts,
        cfg,
        out=io.StringIO(),
        server_stats=session.server_stats,
        thresholds=[parse("succeeded<30"), parse("latency_total_ms.p999>=0")],
    )
    data = json.loads(report_path.read_text())
    assert validate(data) == []
    assert data["requests"]["succeeded"] == 30 and data["server"]["totals"]["accepted"] >= 30
    assert [t["failed"] for t in data["thresholds"]] == [False, True] and code == 99
    assert data["latency_total_ms"]["count"] == 30 and data["queue_wait_ms"]["count"] == 30
    assert data["latency_total_ms"]["p50"] >= data["latency_ms"]["p50"] > 0
    loop = data["loop"]  # the ticker fired through the run: its lateness, the run's CPU
    assert loop["ticks"] > 0 and loop["lag_max_ms"] >= loop["lag_p99_ms"] >= loop["lag_p50_ms"] >= 0
    assert loop["cpu_s"] == data["client"]["cpu_s"] and isinstance(loop["client_is_the_limit"], bool)


def _cluster_snapshot() -> Snapshot:
    view = ClusterView(
        members=(
            MemberRow("host-a:11:ab12", "running", 38.456, 120, 110, 2, 4, 1, 3, 118, 121, "ok"),
            MemberRow("host-b:22:cd34", "draining", 0.0, 80, 79, 0, 0, 0, 0, 80, 84, "unreachable"),
        ),
        waiting=1_234,
        claimed=12,
        uncertain=2,
        graveyard=3,
        read_at_s=9.04,
    )
    return dataclasses.replace(_rich_snapshot(), cluster=view)


def test_the_cluster_object_holds_every_member_and_the_shared_queues():
    assert "cluster" not in build_report(_rich_snapshot())  # no shared store, no object
    report = build_report(_cluster_snapshot())
    assert validate(report) == []
    cluster = report["cluster"]
    assert [m["member"] for m in cluster["members"]] == ["host-a:11:ab12", "host-b:22:cd34"]
    assert cluster["members"][0] == {
        "member": "host-a:11:ab12",
        "phase": "running",
        "current_tps": 38.46,
        "sent": 120,
        "succeeded": 110,
        "rejected_429": 2,
        "main_depth": 4,
        "dlq_depth": 1,
        "in_flight": 3,
        "leases_used": 118,
        "leases_granted": 121,
        "store": "ok",
    }
    assert cluster["members"][1]["store"] == "unreachable"
    assert (cluster["waiting"], cluster["claimed"], cluster["uncertain"], cluster["graveyard"]) == (
        1234,
        12,
        2,
        3,
    )
    assert cluster["read_at_s"] == 9.0
    broken = json.loads(json.dumps(report))
    del broken["cluster"]["members"][0]["leases_used"]
    broken["cluster"]["waiting"] = -1
    assert validate(broken) == [
        "report.cluster: missing 'read_at_s'"
        if False
        else "report.cluster.members[0]: missing 'leases_used'",
        "report.cluster.waiting: -1 below 0",
    ]


def test_the_summary_has_one_cluster_line():
    from ratedeck.runner.headless import summary_lines

    assert not [line for line in summary_lines(_rich_snapshot()) if line.startswith("cluster")]
    lines = [line for line in summary_lines(_cluster_snapshot()) if line.startswith("cluster")]
    assert lines == [
        "cluster      2 members (1 cut off from the store): 200 sent, 189 ok together; shared queues"
        " 1234 waiting, 12 claimed, 2 uncertain, 3 graveyard (read at 9.0s)"
    ]


# ---------------------------------------------------------------- shipped and documented


def test_the_schema_ships_as_package_data():
    from importlib.resources import files

    text = files("ratedeck.runner").joinpath("report.schema.json").read_text(encoding="utf-8")
    assert json.loads(text)["title"] == "ratedeck run report"
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"ratedeck\.runner" = \[[^\]]*"\*\.json"', pyproject)


def _field_names(node: dict, out: set[str]) -> set[str]:
    for name, sub in node.get("properties", {}).items():
        out.add(name)
        _field_names(sub, out)
    if isinstance(node.get("items"), dict):
        _field_names(node["items"], out)
    return out


def test_every_report_field_is_described_in_the_docs():
    section = REPORT_PAGE[REPORT_PAGE.index("# Report fields") :]
    missing = sorted(name for name in _field_names(schema(), set()) if f"`{name}`" not in section)
    assert missing == []


@pytest.mark.parametrize("node_path", ["requests", "latency_ms", "latency_total_ms", "queue_wait_ms"])
def test_every_schema_field_says_what_it_means(node_path):
    node = schema()["properties"][node_path]
    assert node["description"]
    for name, sub in node["properties"].items():
        assert sub.get("description"), name
