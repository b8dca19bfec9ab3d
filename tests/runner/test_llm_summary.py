"""Token budgets and keys out of quota as the headless summary and metrics say them (issue 24, item 4)."""

from __future__ import annotations

import dataclasses

from ratedeck.engine.snapshot import BudgetRow, KeyRow, Snapshot
from ratedeck.host.protocol import RunFacts
from ratedeck.runner.headless import metrics_block, nothing_worked, summary_lines

QUOTA = "You exceeded your current quota, please check your plan and billing details."


def _keys() -> tuple[KeyRow, ...]:
    return (
        KeyRow("k1", "sk-…AAAA", sent=900, succeeded=880, binding="tokens"),
        KeyRow("k2", "sk-…BBBB", sent=700, succeeded=700, binding="requests"),
        KeyRow("k3", "sk-…CCCC", state="blocked", sent=1, refused_status=429, refused_message=QUOTA),
    )


def _llm() -> Snapshot:
    """An OpenAI-like run of 10 minutes: a tokens budget per key, k3 out of quota."""
    return Snapshot(
        elapsed_s=600.0,
        keys=_keys(),
        budgets=(
            BudgetRow("tokens", "k1", 28_000, 30_000, "tokens", 30_000.0, reserved=412_300, settled=270_000),
            BudgetRow("tokens", "k2", 9_000, 30_000, "tokens", 30_000.0, reserved=120_000, settled=90_000),
            BudgetRow("tokens", "k3", 0, 30_000, "tokens", None, reserved=1_024, settled=0),
        ),
    )


def _plain(snap: Snapshot) -> Snapshot:
    """The same run without budgets (and no binding unit, as the engine reports it then)."""
    keys = tuple(dataclasses.replace(k, binding="") for k in snap.keys)
    return dataclasses.replace(snap, budgets=(), keys=keys)


def test_one_summary_line_per_key_and_token_budget_with_rate_limit_and_binding_unit():
    lines = summary_lines(_llm())
    ours = [line.strip() for line in lines if " tokens: " in line]
    assert ours == [
        "k1 tokens: 412,300 reserved, 270,000 settled = 27,000/min over the run, limit 30,000/min"
        " (binds now: tokens)",
        "k2 tokens: 120,000 reserved, 90,000 settled = 9,000/min over the run, limit 30,000/min"
        " (binds now: requests)",
        "k3 tokens: 1,024 reserved, 0 settled = 0/min over the run, limit not learned yet (out of quota)",
    ]
    # after the per-key lines, so the key's own line comes first
    assert lines.index(next(line for line in lines if line.strip().startswith("k1 sk-"))) < lines.index(
        next(line for line in lines if line.strip().startswith("k1 tokens:"))
    )


def test_the_metrics_block_adds_the_keys_together_and_counts_the_binding_units():
    block = metrics_block(_llm())
    assert block[-2] == (
        "tokens       tokens (3 keys): 533,324 reserved, 360,000 settled = 36,000/min, limit 60,000/min"
    )
    assert block[-1] == "             binds now: tokens x1  requests x1  out x1"
    # the final summary has the same lines
    assert block[-2] in summary_lines(_llm())


def test_host_and_input_output_budgets_have_lines_and_request_budgets_none():
    snap = dataclasses.replace(
        _llm(),
        budgets=(
            BudgetRow("weight", "host", 10, 1200, "weight", 1200.0, reserved=50, settled=50),
            BudgetRow("input-tokens", "host", 5, 100, "input_tokens", 100.0, reserved=600, settled=300),
            BudgetRow("output-tokens", "k1", 5, 100, "output_tokens", None, reserved=60, settled=30),
        ),
    )
    ours = [line.strip() for line in summary_lines(snap) if "settled" in line]
    assert ours[0].startswith(
        "tokens       input-tokens (host): 600 reserved, 300 settled = 30/min, limit 100/min"
    )
    assert "output-tokens (1 key)" in ours[0] and "weight" not in " ".join(ours)
    assert ours[1] == "host input-tokens: 600 reserved, 300 settled = 30/min over the run, limit 100/min"
    assert ours[2].startswith(
        "k1 output-tokens: 60 reserved, 30 settled = 3/min over the run, limit not learned"
    )


def test_nothing_new_without_token_budgets():
    plain = _plain(_llm())
    for snap in (
        plain,
        dataclasses.replace(plain, budgets=(BudgetRow("weight", "host", 1, 1200, "weight"),)),
    ):
        lines = summary_lines(snap)
        assert not [line for line in lines if "tokens" in line or "binds" in line or "settled" in line]
        assert metrics_block(snap)[-1].strip() == "from round trip"


def test_a_key_out_of_quota_reads_as_out_of_quota_with_the_servers_words():
    lines = summary_lines(_plain(_llm()))
    refused = next(line for line in lines if line.startswith("refused"))
    assert refused == (
        f"refused      1 of 3 keys, not used again: k3 sk-…CCCC out of quota (HTTP 429: {QUOTA})"
    )
    k3 = next(line for line in lines if line.strip().startswith("k3 sk-"))
    assert k3.split()[2] == "out" and k3.endswith(f"  out of quota (HTTP 429: {QUOTA})")
    assert "refused:" not in k3


def test_other_refusals_still_read_as_refused():
    keys = (KeyRow("k1", "…AAAA", state="blocked", refused_status=401, refused_message="bad key"),)
    lines = summary_lines(Snapshot(keys=keys))
    k1 = next(line for line in lines if line.strip().startswith("k1"))
    assert k1.split()[2] == "blocked" and k1.endswith("refused: HTTP 401: bad key") and "quota" not in k1
    said = nothing_worked(Snapshot(keys=keys), RunFacts())
    assert said is not None and "HTTP 401: bad key (k1)" in said and "quota" not in said


def test_every_key_out_of_quota_says_so_in_the_one_line():
    keys = (KeyRow("k1", "…AAAA", state="blocked", refused_status=429, refused_message=QUOTA),)
    said = nothing_worked(Snapshot(keys=keys), RunFacts())
    assert said is not None and f"out of quota (HTTP 429: {QUOTA}) (k1)" in said


def test_a_run_under_a_minute_says_what_it_settled_and_in_how_long_not_a_rate():
    """A job that ended at once (its only key refused, say) spent a burst a full bucket allows:
    a rate per minute from 17 ms would read as twice the limit."""
    short = dataclasses.replace(
        _llm(),
        elapsed_s=0.017,
        budgets=(BudgetRow("tokens", "k1", 136, 200_000, "tokens", 200_000.0, reserved=136, settled=136),),
    )
    ours = [line.strip() for line in summary_lines(short) if "settled" in line]
    assert ours == [
        "tokens       tokens (1 key): 136 reserved, 136 settled in 17 ms, limit 200,000/min",
        "k1 tokens: 136 reserved, 136 settled in 17 ms, limit 200,000/min (binds now: tokens)",
    ]
    half = dataclasses.replace(short, elapsed_s=42.25)
    assert "136 settled in 42.2 s, limit" in metrics_block(half)[-2]
    # from a minute on, the rate per minute
    minute = dataclasses.replace(short, elapsed_s=60.0)
    assert "136 settled = 136/min, limit 200,000/min" in metrics_block(minute)[-2]
