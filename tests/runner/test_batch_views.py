"""A gateway's batches (the Batch APIs, `ClientView.batches`) as the report, Prometheus and the
headless lines show them: by status, lines left, ETA; with no batch every view stays as it was."""

from __future__ import annotations

import dataclasses

from ratedeck.engine.snapshot import BatchRow, ClientRow, ClientView, Snapshot
from ratedeck.runner.headless import batch_lines, metrics_block
from ratedeck.runner.prometheus import BATCH_STATUSES
from ratedeck.runner.report import build_report
from tests.runner.test_report_schema import validate
from tests.support.metrics import by_labels, scrape

RUNNING = BatchRow("batch_6a1f0c2e9d4b7a35", "openai", "nightly", "in_progress", 600, 260, 2, eta_s=80.04)
STARTING = BatchRow("batch_77aa01", "openai", "nightly", "in_progress", 100, 20, 0, eta_s=None)
CANCELLING = BatchRow(
    "msgbatch_01HQ7Z3KX2c4e8f1", "anthropic", "tools", "cancelling", 200, 120, 0, eta_s=12.0
)
COMPLETED = BatchRow("batch_0b9e77d1c5a2f480", "openai", "chat", "completed", 120, 120, 3)
CANCELLED = BatchRow("msgbatch_01AB", "anthropic", "chat", "cancelled", 50, 50, 30)
# a bad input file: failed before any line ran, its 40 lines never to end (not "left")
REFUSED = BatchRow("batch_bad0input", "openai", "tools", "failed", 40, 0, 0)
BATCHES = (RUNNING, STARTING, CANCELLING, COMPLETED, CANCELLED, REFUSED)
CLIENTS = ClientView(
    waiting=3, answered=500, wait_p50_ms=20.0, wait_p99_ms=900.0, statuses=((200, 500),),
    rows=(ClientRow("nightly", "batch", 1.0), ClientRow("tools", "standard", 1.0), ClientRow("chat", "interactive", 1.0)),
)  # fmt: skip


def gateway(batches: tuple[BatchRow, ...] = BATCHES, clients: ClientView = CLIENTS) -> Snapshot:
    return Snapshot(elapsed_s=60.0, clients=dataclasses.replace(clients, batches=batches))


# ---------------------------------------------------------------- the report


def test_the_report_has_one_entry_per_batch_in_the_snapshots_order():
    report = build_report(gateway())
    assert validate(report) == []
    assert [b["id"] for b in report["batches"]] == [b.id for b in BATCHES]
    running, starting, cancelling, completed, cancelled, refused = report["batches"]
    assert running == {
        "id": "batch_6a1f0c2e9d4b7a35",
        "api": "openai",
        "client": "nightly",
        "status": "in_progress",
        "total": 600,
        "done": 260,
        "failed": 2,
        "left": 340,
        "eta_s": 80.0,
    }
    assert starting["eta_s"] is None and starting["left"] == 80
    assert cancelling["api"] == "anthropic" and cancelling["status"] == "cancelling"
    assert completed["left"] == 0 and completed["failed"] == 3 and completed["eta_s"] is None
    assert cancelled["failed"] == 30
    assert refused["status"] == "failed" and refused["left"] == 40


def test_no_batches_entry_without_batches_and_the_rest_of_the_report_unchanged():
    without = build_report(gateway(()))
    assert "batches" not in without
    assert "batches" not in build_report(Snapshot())
    with_them = build_report(gateway())
    del with_them["batches"]
    assert with_them == without


def test_the_schema_rejects_a_batch_entry_that_breaks_it():
    report = build_report(gateway())
    del report["batches"][0]["left"]
    report["batches"][1]["status"] = "ended"
    report["batches"][2]["api"] = "gemini"
    report["batches"][3]["failed"] = -1
    report["batches"][4]["surprise"] = 1
    assert validate(report) == [
        "report.batches[0]: missing 'left'",
        "report.batches[1].status: 'ended' not one of "
        "['validating', 'in_progress', 'finalizing', 'cancelling', 'completed', 'failed', 'cancelled']",
        "report.batches[2].api: 'gemini' not one of ['openai', 'anthropic']",
        "report.batches[3].failed: -1 below 0",
        "report.batches[4]: unexpected field 'surprise'",
    ]


# ---------------------------------------------------------------- Prometheus


def test_batches_by_status_every_status_present():
    m = scrape(gateway())
    family = m["ratedeck_gateway_batches"]
    assert family.type == "gauge"
    assert by_labels(family, "status") == {
        ("validating",): 0.0,
        ("in_progress",): 2.0,
        ("finalizing",): 0.0,
        ("cancelling",): 1.0,
        ("completed",): 1.0,
        ("failed",): 1.0,
        ("cancelled",): 1.0,
    }
    assert len(BATCH_STATUSES) == 7
    # one batch: still every status, the others at 0
    only = by_labels(scrape(gateway((COMPLETED,)))["ratedeck_gateway_batches"], "status")
    assert only == {(s,): (1.0 if s == "completed" else 0.0) for s in BATCH_STATUSES}


def test_lines_left_sum_the_batches_not_final_and_each_known_eta_has_a_series():
    m = scrape(gateway())
    # 340 + 80 + 80: the final batches are not counted (the failed one's 40 lines will never run)
    assert [s.value for s in m["ratedeck_gateway_batch_lines_left"].samples] == [500.0]
    assert by_labels(m["ratedeck_gateway_batch_eta_seconds"], "batch") == {
        ("batch_6a1f0c2e9d4b7a35",): 80.04,
        ("msgbatch_01HQ7Z3KX2c4e8f1",): 12.0,
    }  # STARTING has no rate yet: no sample (unknown, not 0); the final ones none either
    done = scrape(gateway((COMPLETED, CANCELLED, REFUSED)))
    assert [s.value for s in done["ratedeck_gateway_batch_lines_left"].samples] == [0.0]
    assert done["ratedeck_gateway_batch_eta_seconds"].samples == []


def test_no_batch_families_without_batches_and_the_others_unchanged():
    without = scrape(gateway(()))
    assert not any(name.startswith("ratedeck_gateway_batch") for name in without)
    with_them = scrape(gateway())
    for name in (
        "ratedeck_gateway_batches",
        "ratedeck_gateway_batch_lines_left",
        "ratedeck_gateway_batch_eta_seconds",
    ):
        del with_them[name]
    assert with_them == without


# ---------------------------------------------------------------- headless lines


def test_the_batches_line_and_one_line_per_batch_not_final_under_the_clients_lines():
    block = metrics_block(gateway())
    at = next(i for i, line in enumerate(block) if line.startswith("clients      "))
    assert block[at + 1].startswith("             nightly")  # the clients' own lines stay first
    assert block[at + 4 : at + 8] == [
        "batches      2 in progress, 1 cancelling, 1 completed, 1 failed, 1 cancelled; 500 lines left, eta 1m21s",
        "             batch_6a1f0c2e9d4b7a35     openai     nightly  in_progress  260 of 600  failed 2  eta 1m21s",
        "             batch_77aa01               openai     nightly  in_progress  20 of 100  eta unknown",
        "             msgbatch_01HQ7Z3KX2c4e8f1  anthropic  tools    cancelling   120 of 200  eta 12s",
    ]
    assert len(block) == at + 8 or not block[at + 8].startswith("             ")


def test_the_batches_line_with_every_batch_final_or_none():
    assert batch_lines((CANCELLED, REFUSED, COMPLETED)) == ["batches      1 completed, 1 failed, 1 cancelled"]
    assert batch_lines((STARTING,)) == [
        "batches      1 in progress; 80 lines left, eta unknown",
        "             batch_77aa01  openai  nightly  in_progress  20 of 100  eta unknown",
    ]
    assert batch_lines(()) == []
    with_them, without = metrics_block(gateway()), metrics_block(gateway(()))
    at = with_them.index(batch_lines(BATCHES)[0])
    assert without == with_them[:at] + with_them[at + 4 :]
