"""What the headroom is made of, and limits learned, as the report, the summary and the console say them."""

from __future__ import annotations

from ratedeck.engine.snapshot import KeyRow, Snapshot
from ratedeck.runner.headless import metrics_block, summary_lines
from ratedeck.runner.report import build_report


def _snap(**kw) -> Snapshot:
    keys = (
        KeyRow("k1", "…AAAA", told_limit="25/1s", learned_limit="20/1s"),
        KeyRow("k2", "…BBBB", told_limit="25/1s"),
    )
    return Snapshot(keys=keys, **kw)


def test_the_basis_names_the_source_its_cost_and_the_parts_it_knows():
    assert (_snap().headroom_from(), _snap().headroom_spread()) == ("round trip", "")
    assert _snap(rtt_spread_ms=71.4).headroom_spread() == "71 ms"
    assert _snap(headroom_source="budget probing", rtt_spread_ms=71.4).headroom_spread() == "round trip 71 ms"
    hinted = _snap(headroom_source="hints", rtt_spread_ms=90.0, network_spread_ms=38.2, server_time_ms=49.6)
    assert (hinted.headroom_from(), hinted.headroom_spread()) == ("hints", "network 38 ms, server 50 ms")
    budget = _snap(headroom_source="budget probing", rejection_budget=10, rejections_spent=3, probe_sent=120)
    assert budget.headroom_from() == "budget probing, spent 3 of 10 rejections, 120 probes sent"


def test_the_summary_and_report_show_the_basis_and_learned_limits():
    snap = _snap(headroom_source="probe", network_spread_ms=40.0, probe_sent=55, rejection_budget=2)
    assert (
        metrics_block(snap)[-1].strip()
        == "from probe, spent 0 of 2 rejections, 55 probes sent; spread network 40 ms"
    )
    lines = summary_lines(snap)
    k1 = next(line for line in lines if line.strip().startswith("k1"))
    k2 = next(line for line in lines if line.strip().startswith("k2"))
    assert k1.endswith("told 25/1s, learned 20/1s") and "learned" not in k2
    report = build_report(snap)
    assert report["headroom"] == {
        "source": "probe",
        "rtt_spread_ms": None,
        "network_spread_ms": 40.0,
        "server_time_ms": None,
        "rejection_budget": 2,
        "rejections_spent": 0,
        "probe_sent": 55,
    }
    assert [(k["told_limit"], k["learned_limit"]) for k in report["keys"]] == [
        ("25/1s", "20/1s"),
        ("25/1s", None),
    ]


def test_a_throughput_above_capacity_says_it_is_the_start_s_burst():
    """A short run against buckets gets their full burst at once: 33/s where the limits sustain
    4/s is 835% of capacity, and the line says where the excess came from."""
    over = metrics_block(_snap(throughput_tps=33.3, capacity_tps=3.99))[1]
    assert "834.6% of 3.99/s capacity: the burst the limits allow at the start" in over, over
    under = metrics_block(_snap(throughput_tps=3.8, capacity_tps=3.99))[1]
    assert under.endswith("(95.2% of 3.99/s capacity)"), under


def test_the_summary_says_where_an_estimate_that_moved_and_came_back_stands():
    keys = (
        KeyRow("k1", "…AAAA", told_limit="20/1s", limit_estimate="20/1s", estimate_reason="climbed back"),
        KeyRow("k2", "…BBBB", told_limit="20/1s", limit_estimate="20/1s", estimate_reason="told"),
        KeyRow(
            "k3",
            "…CCCC",
            told_limit="25/1s",
            learned_limit="20/1s",
            limit_estimate="20/1s",
            estimate_reason="lowered by a 429 at 25",
        ),
    )
    lines = {line.split()[0]: line for line in summary_lines(Snapshot(keys=keys)) if line.startswith("  ")}
    assert lines["k1"].endswith("limit estimate 20/1s (climbed back)")
    assert "estimate" not in lines["k2"]  # as told: nothing to say
    assert lines["k3"].endswith("told 25/1s, learned 20/1s")  # said once, as learned
