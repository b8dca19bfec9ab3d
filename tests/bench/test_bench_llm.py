"""`ratedeck bench --scenarios llm`: the cookbook and LiteLLM-style peers against the LLM stubs, read from the ledger."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from ratedeck.bench import LLM_DURATION_S, parse_args
from ratedeck.bench import llm as bench_llm
from ratedeck.bench.llm import (
    COOLDOWN_S,
    PAUSE_AFTER_RATE_LIMIT_S,
    SAFETY_SHARE,
    Cookbook,
    LiteLLMRouter,
    LLMRun,
    StubThread,
    ledger_row,
    prompts,
    run_cookbook,
    run_litellm,
    run_strategy,
)
from ratedeck.bench.output import ScenarioResult, scenario_table
from ratedeck.bench.scenarios import DEFAULT_SCENARIOS, GROUPS, LLM_SCENARIOS, LLMScenario
from ratedeck.config import PRESETS
from ratedeck.server.stubs.common import Ledger
from ratedeck.server.stubs.llm_common import PromptBook

# One key told 20,000 tokens a (1 s) minute while the stub allows 1,500: a 429 comes at once.
TOLD_WRONG = LLMScenario(
    "t", "told wrong", "openai", ("sk-one",), rpm=10_000, tpm=20_000, minute_s=1.0, latency_s=0.0
)


def _run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_the_llm_group_is_its_own_and_the_default_is_unchanged():
    assert GROUPS["llm"] == ("llm-openai", "llm-anthropic")
    assert DEFAULT_SCENARIOS == ("seed", "seed+jitter", "many-keys")
    assert parse_args([]).scenarios == ["seed", "seed+jitter", "many-keys"]
    args = parse_args(["--scenarios", "llm", "--strategies", "cookbook,litellm"])
    assert args.scenarios == ["llm-openai", "llm-anthropic"] and args.strategies == ["cookbook", "litellm"]
    assert LLM_DURATION_S == 40.0 and not parse_args(["--scenarios", "llm"]).duration_given
    openai, anthropic = LLM_SCENARIOS["llm-openai"], LLM_SCENARIOS["llm-anthropic"]
    assert len(openai.keys) == 3 and len(openai.no_quota) == 1 and openai.minute_s == 6.0
    assert len(anthropic.keys) == 3 and anthropic.overload_share == 0.03
    assert openai.strategies == anthropic.strategies == ("cookbook", "litellm", "ratedeck")


def test_prompts_are_seeded_distinct_and_of_many_sizes():
    a, b = prompts(500, seed=3), prompts(500, seed=3)
    assert a == b and a != prompts(500, seed=4)
    assert len({p.text for p in a}) == 500
    sizes = [len(p.text) for p in a]
    assert 20 <= min(sizes) < 60 and 1500 < max(sizes) <= 2000
    assert {p.max_tokens for p in a} <= set(range(50, 401)) and len({p.max_tokens for p in a}) > 100
    line = a[0].line("anthropic")
    assert line["_id"] == "p0" and line["_path"] == "/v1/messages"
    assert (
        line["_body"]["max_tokens"] == a[0].max_tokens
        and line["_body"]["messages"][0]["content"] == a[0].text
    )


def test_the_documented_defaults():
    peer = Cookbook("http://x", "openai", "k", {"requests": 600, "tokens": 6000}, 60.0)
    assert PAUSE_AFTER_RATE_LIMIT_S == 15.0 and peer.pause_s == 15.0 and peer.poll_s == 0.001
    assert peer.max_attempts == 5 and SAFETY_SHARE == 0.75 and peer.capacity["tokens"].limit == 4500
    assert peer.cost(prompts(1)[0])["tokens"] == prompts(1)[0].prompt_tokens + prompts(1)[0].max_tokens
    router = LiteLLMRouter("http://x", "openai", ["a", "b"], {"requests": 10, "tokens": 100}, 60.0)
    assert COOLDOWN_S == 5.0 and router.cooldown_s == 5.0


def test_the_cookbook_pauses_all_sending_after_a_rate_limit_error():
    pause = 1.5
    with StubThread(TOLD_WRONG, tpm=1_500) as stub:
        peers = _run(run_cookbook(TOLD_WRONG, stub.url, prompts(300), 3.5, pause_s=pause))
        records = list(stub.ledger.records)
    limited = [r for r in records if r.outcome == "rate_limited"]
    assert limited, "the stub never refused: the test's limits do not bite"
    first = limited[0].at
    # what was already on the wire lands at once; nothing is sent again until the pause is over
    during = [r for r in records if first + 0.25 <= r.at < first + pause - 0.05]
    assert during == []
    after = [r for r in records if first + pause - 0.05 <= r.at < first + pause + 0.5]
    assert after, "the peer never resumed after its pause"
    assert peers[0].tally.pauses >= 1


def test_the_litellm_router_cools_a_key_after_a_429_and_switches():
    two = dataclasses.replace(TOLD_WRONG, keys=("sk-a", "sk-b"))
    with StubThread(two, tpm=1_500) as stub:
        router = _run(run_litellm(two, stub.url, prompts(300), 3.0, cooldown_s=1.0, concurrency=1))
        records = list(stub.ledger.records)
    i = next(i for i, r in enumerate(records) if r.outcome == "rate_limited")
    hit = records[i]
    assert records[i + 1].key != hit.key  # the retry went to the other deployment
    assert [r for r in records if r.key == hit.key and hit.at < r.at < hit.at + 1.0 - 0.05] == []
    assert any(r.key == hit.key and r.at >= hit.at + 1.0 - 0.05 for r in records)  # back after its cooldown
    assert router.tally.cooldowns >= 1


class _State:
    def __init__(self, book: PromptBook) -> None:
        self.book = book

    def allowed_capacity(self, start, end, *, key=None, bucket=None):
        return 1000.0 + 1000.0 * (end - start) / 6.0


class _Stub:
    def __init__(self, ledger: Ledger, book: PromptBook) -> None:
        self.ledger, self.state = ledger, _State(book)

    def allowed_capacity(self, start, end, *, key=None, bucket=None):
        return self.state.allowed_capacity(start, end, key=key, bucket=bucket)


def test_a_row_counts_what_the_ledger_holds_not_what_the_client_says():
    s = dataclasses.replace(LLM_SCENARIOS["llm-openai"], keys=("a", "q"), no_quota=("q",))
    ledger, book = Ledger(), PromptBook()
    common = {"method": "POST", "path": "/v1/chat/completions", "bucket": "chat"}
    for at, key, status, outcome, cost in (
        (0.0, "a", 200, "ok", 300.0),  # the first arrival: the window starts here
        (2.0, "a", 200, "ok", 300.0),
        (3.0, "a", 429, "rate_limited", 0.0),
        (4.0, "q", 429, "insufficient_quota", 0.0),
        (5.0, "a", 200, "ok", 400.0),
        (9.0, "a", 200, "ok", 999.0),  # after the run's last arrival window: not counted
    ):
        ledger.add(at=at, key=key, status=status, outcome=outcome, cost=cost, **common)
    book.prompts["a"].update({"x": 2, "y": 1})  # one prompt served twice
    ledger.records.pop()  # (the stub never saw the one at 9 s in this run)
    row = ledger_row(s, _Stub(ledger, book), [], LLMRun("cookbook", 0.0, 6.0, 0.3, {"ok": 99}))
    assert row["prompts_ok"] == 2 and row["duplicates"] == 1 and row["tokens"] == 1000
    assert row["rejected_429"] == 1 and row["insufficient_quota"] == 1 and row["requests"] == 5
    assert row["tokens_per_min"] == 1000.0  # 6 s is one stub minute
    assert row["share_tokens"] == pytest.approx(1000 / 2000)  # the key with a quota only: 1,000 + 1,000
    assert row["cpu_us_per_ok"] == pytest.approx(150_000.0)
    text = scenario_table(ScenarioResult("llm-openai", s.summary, 60_000.0, [row]), 6.0)
    assert text.splitlines()[4].split()[:3] == ["cookbook", "2", "1,000"]


def test_a_short_run_of_each_peer_on_the_openai_stub():
    small = dataclasses.replace(LLM_SCENARIOS["llm-openai"], rpm=600, tpm=6_000, minute_s=1.0, latency_s=0.01)
    for strategy in ("cookbook", "litellm"):
        row = run_strategy(small, strategy, 2.0)
        assert row["prompts_ok"] > 10, row
        assert row["insufficient_quota"] >= 1 and row["duplicates"] == 0, row
        assert 0.3 < row["share_tokens"] <= 1.0, row


def test_the_ratedeck_strategy_skips_cleanly_without_its_preset(monkeypatch):
    monkeypatch.setattr(bench_llm, "preset_available", lambda api: False)
    row = run_strategy(LLM_SCENARIOS["llm-anthropic"], "ratedeck", 1.0)
    assert row["skipped"].startswith("preset not available") and row["ok_per_s"] == 0.0
    text = scenario_table(ScenarioResult("llm-anthropic", "x", 24_000.0, [row]), 1.0)
    assert "ratedeck  skipped: preset not available" in text


@pytest.mark.skipif("openai" not in PRESETS, reason="the openai preset is not in this install yet")
def test_the_ratedeck_strategy_runs_the_cli_with_the_openai_preset():
    small = dataclasses.replace(LLM_SCENARIOS["llm-openai"], rpm=600, tpm=6_000, minute_s=1.0, latency_s=0.01)
    row = run_strategy(small, "ratedeck", 4.0)
    assert "skipped" not in row, row
    assert row["prompts_ok"] > 10 and row["duplicates"] == 0
