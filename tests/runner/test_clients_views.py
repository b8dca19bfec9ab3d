"""A gateway's named clients (`[[gateway.clients]]`) as the report, Prometheus and the headless
lines show them: each client's waits, share of the binding unit, quota left and refusals; with
one token (no rows) every view stays as it was."""

from __future__ import annotations

import dataclasses

from ratedeck.engine.snapshot import ClientRow, ClientView, QuotaRow, Snapshot
from ratedeck.runner.headless import client_row_lines, metrics_block
from ratedeck.runner.report import build_report
from tests.runner.test_report_schema import validate
from tests.support.metrics import by_labels, scrape

CHAT = ClientRow(
    "chat", "interactive", 1.0, waiting=0, answered=412, wait_p50_ms=12.0, wait_p99_ms=840.0,
    share=0.18, served=61_200.0, sent=412,
)  # fmt: skip
NIGHTLY = ClientRow(
    "nightly", "batch", 1.0, waiting=37, answered=1_580, wait_p50_ms=2_400.0, wait_p99_ms=31_000.0,
    share=0.34, served=1_904_000.0, sent=1_590, refused=4,
    quotas=(QuotaRow("tokens_per_minute", 100_000.0, 8_000.0),),
)  # fmt: skip
TOOLS = ClientRow(
    "tools", "standard", 3.0, waiting=5, answered=906, wait_p50_ms=45.123, wait_p99_ms=1_200.0,
    share=0.48, served=310_000.0, sent=910,
    quotas=(QuotaRow("requests_per_minute", 600.0, 420.0), QuotaRow("usd_per_day", 50.0, 31.5)),
)  # fmt: skip
ONE_TOKEN = ClientView(
    waiting=42, answered=2_898, wait_p50_ms=38.0, wait_p99_ms=24_000.0, statuses=((200, 2_898),)
)
NAMED = dataclasses.replace(ONE_TOKEN, rows=(CHAT, NIGHTLY, TOOLS), unit="tokens")


def gateway(clients: ClientView) -> Snapshot:
    return Snapshot(elapsed_s=60.0, clients=clients)


# ---------------------------------------------------------------- the report


def test_the_report_has_one_entry_per_client_with_its_waits_share_and_quotas():
    report = build_report(gateway(NAMED))
    assert validate(report) == []
    chat, nightly, tools = report["clients"]
    assert [c["name"] for c in report["clients"]] == ["chat", "nightly", "tools"]
    assert nightly == {
        "name": "nightly",
        "priority": "batch",
        "weight": 1.0,
        "waiting": 37,
        "answered": 1580,
        "sent": 1590,
        "refused": 4,
        "queue_wait_ms": {"p50": 2400.0, "p99": 31000.0},
        "share": 0.34,
        "served": 1904000.0,
        "unit": "tokens",
        "quotas": [{"name": "tokens_per_minute", "limit": 100000.0, "left": 8000.0}],
    }
    assert tools["weight"] == 3.0 and tools["queue_wait_ms"]["p50"] == 45.12
    assert [q["name"] for q in tools["quotas"]] == ["requests_per_minute", "usd_per_day"]
    assert tools["quotas"][1]["left"] == 31.5
    assert chat["quotas"] == [] and chat["refused"] == 0


def test_no_clients_entry_with_one_token_or_outside_the_gateway():
    assert "clients" not in build_report(gateway(ONE_TOKEN))
    assert "clients" not in build_report(Snapshot())


def test_the_schema_rejects_a_client_entry_that_breaks_it():
    report = build_report(gateway(NAMED))
    del report["clients"][0]["share"]
    report["clients"][1]["priority"] = "urgent"
    report["clients"][2]["quotas"][0]["left"] = -1
    assert validate(report) == [
        "report.clients[0]: missing 'share'",
        "report.clients[1].priority: 'urgent' not one of ['interactive', 'standard', 'batch']",
        "report.clients[2].quotas[0].left: -1 below 0",
    ]


# ---------------------------------------------------------------- Prometheus


def test_each_client_has_its_own_series_labelled_client():
    m = scrape(gateway(NAMED))
    assert by_labels(m["ratedeck_gateway_client_waiting"], "client") == {
        ("chat",): 0.0,
        ("nightly",): 37.0,
        ("tools",): 5.0,
    }
    waits = by_labels(m["ratedeck_gateway_client_queue_wait_quantile_seconds"], "client", "quantile")
    assert waits[("chat", "0.5")] == 0.012 and waits[("chat", "0.99")] == 0.84
    assert waits[("nightly", "0.99")] == 31.0 and len(waits) == 6
    assert by_labels(m["ratedeck_gateway_client_share"], "client", "unit") == {
        ("chat", "tokens"): 0.18,
        ("nightly", "tokens"): 0.34,
        ("tools", "tokens"): 0.48,
    }
    served = m["ratedeck_gateway_client_served"]
    assert served.type == "counter"
    assert by_labels(served, "client", "unit")[("nightly", "tokens")] == 1_904_000.0
    refused = m["ratedeck_gateway_client_refused"]
    assert refused.type == "counter"
    assert by_labels(refused, "client") == {("chat",): 0.0, ("nightly",): 4.0, ("tools",): 0.0}
    assert by_labels(m["ratedeck_gateway_client_quota_left"], "client", "quota") == {
        ("nightly", "tokens_per_minute"): 8_000.0,
        ("tools", "requests_per_minute"): 420.0,
        ("tools", "usd_per_day"): 31.5,
    }
    limits = by_labels(m["ratedeck_gateway_client_quota_limit"], "client", "quota")
    assert (
        limits[("nightly", "tokens_per_minute")] == 100_000.0 and ("chat", "tokens_per_minute") not in limits
    )


def test_the_unlabelled_gateway_families_stay_as_they_were():
    for clients in (ONE_TOKEN, NAMED):
        m = scrape(gateway(clients))
        assert [s.value for s in m["ratedeck_gateway_clients_waiting"].samples] == [42.0]
        assert by_labels(m["ratedeck_gateway_requests"], "status") == {("200",): 2898.0}
    assert not any(name.startswith("ratedeck_gateway_client_") for name in scrape(gateway(ONE_TOKEN)))


# ---------------------------------------------------------------- headless lines


def test_one_headless_line_per_client_under_the_clients_line():
    block = metrics_block(gateway(NAMED))
    at = next(i for i, line in enumerate(block) if line.startswith("clients      "))
    assert block[at].startswith("clients      waiting 42  queue wait p50 38 ms p99 24000 ms")
    assert block[at + 1 : at + 4] == [
        "             chat     interactive  waiting 0  wait p50 12 ms p99 840 ms  share 18% of tokens",
        "             nightly  batch        waiting 37  wait p50 2400 ms p99 31.0 s  share 34% of tokens"
        "  tokens_per_minute 8% left (8,000 of 100,000)  refused 4",
        "             tools    standard x3  waiting 5  wait p50 45 ms p99 1200 ms  share 48% of tokens"
        "  requests_per_minute 70% left (420 of 600)  usd_per_day 63% left ($31.50 of $50.00)",
    ]


def test_no_client_lines_with_one_token_and_a_client_not_yet_sent_says_so():
    block = metrics_block(gateway(ONE_TOKEN))
    assert [line for line in block if line.startswith("clients")] == [block[-1]]
    assert client_row_lines(ONE_TOKEN) == []
    idle = ClientRow("idle", "batch", 0.5)
    (line,) = client_row_lines(ClientView(rows=(idle,), unit="requests"))
    assert line == "             idle  batch x0.5  waiting 0  wait none yet  share 0% of requests"
