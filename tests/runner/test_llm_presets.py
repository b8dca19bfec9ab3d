"""The openai and anthropic presets against their loopback stubs, for real (wall time, issue 24).

Tiers are not told: each key's limits come from its answers' headers. The minute is scaled to
6 s; capacity is the full bucket at the start plus its refill over the time the run sent. The 40 s runs are
`bench/measure_llm.py` (docs/measurements.md); these are shorter, with the same limits.
"""

from __future__ import annotations

import asyncio

import pytest

from ratedeck.bench.measure_llm import ANTHROPIC_KEYS, anthropic, openai, prompts, run
from ratedeck.core.vocab import KeyState
from ratedeck.server.stubs.anthropic import start_anthropic

pytestmark = pytest.mark.slow


def test_openai_uses_the_live_keys_token_capacity_and_leaves_the_key_with_no_quota():
    result = asyncio.run(openai(10.0))
    snap = result.snap
    assert result.share >= 0.90, result.line("openai")
    assert result.rate_429 <= 3, result.line("openai")
    assert result.quota_429 == 1, result.line("openai")  # its first answer, and never again
    assert result.duplicates == 0
    assert snap.succeeded == result.stub_ok  # the report's successes are the stub's
    states = {k.label: k.state for k in snap.keys}
    assert states == {"k1": KeyState.ACTIVE, "k2": KeyState.ACTIVE, "k3": KeyState.BLOCKED}
    # one row per key and model ("k1 gpt-4o-mini"): these prompts name one model
    tokens = {b.owner.split()[0]: b for b in snap.budgets if b.name == "tokens"}
    assert tokens["k1"].per_min == pytest.approx(30_000 * 60 / 6.0, rel=0.02)  # the tier, learned
    assert tokens["k1"].settled == tokens["k1"].reserved  # OpenAI keeps the admission charge
    k1 = next(k for k in snap.keys if k.label == "k1")
    assert k1.followed.startswith("requests 500, tokens 30,000 per 6.") and k1.followed.endswith(" s")


def test_anthropic_settles_output_tokens_and_retries_529s():
    result = asyncio.run(anthropic(10.0))
    snap = result.snap
    assert result.share >= 0.85, result.line("anthropic")
    assert result.rate_429 <= 3, result.line("anthropic")
    assert result.overloaded > 0 and result.duplicates == 0
    assert snap.succeeded == result.stub_ok
    out = [b for b in snap.budgets if b.name == "output-tokens"]
    assert out and all(b.settled < b.reserved for b in out)  # max_tokens given back to the real output
    assert all(k.binding == "output-tokens" for k in snap.keys), [k.binding for k in snap.keys]


def test_a_job_of_prompts_ends_with_every_prompt_answered_once_through_529s():
    """30 prompts, every 4th attempt answered 529: each is retried to success, none sent twice."""

    async def main():
        pattern = [i % 4 == 3 for i in range(200)]
        async with await start_anthropic(
            keys=ANTHROPIC_KEYS[:1], minute_s=6.0, overload_pattern=pattern, latency=0.05
        ) as stub:
            snap = await run("anthropic", stub.url, prompts(30, "/v1/messages"), None, ANTHROPIC_KEYS[:1])
            return snap, stub

    snap, stub = asyncio.run(main())
    assert snap.succeeded == 30 and snap.graveyard == 0
    assert stub.state.book.duplicates() == 0
    assert sum(stub.state.book.prompts[ANTHROPIC_KEYS[0]].values()) == 30
    assert stub.ledger.counts()["overloaded"] > 0
