"""Every budget through Redis (issue 25): several budgets in one grant, costs, give-backs, members.

The grant script against a real redis-server: several budgets per call (each with its own
cost) never go over any of their limits, a refusal by one budget reserves nothing in the
others, a give-back frees units a later grant sees. Then members (engines on one loop, each
with its own Redis connection) on loopback stubs that keep their own counts: three sharing
Binance's weight per IP, three sharing one OpenAI key's tokens per minute.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

from ratedeck.bench.measure_llm import prompts
from ratedeck.config import load_config
from ratedeck.core.policy import Policy, parse_policy
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.transport import http_transport
from ratedeck.engine.ports import Ask, StoreUnavailable
from ratedeck.server.stubs.binance import start_binance
from ratedeck.server.stubs.openai import start_openai
from ratedeck.store.redis_shared import RedisShared
from tests.support.redis_server import pause_between_grants, shared_state

# a real redis-server and wall-clock runs (DESIGN.md: such tests are marked slow)
pytestmark = pytest.mark.slow

SLACK_S = 0.004


_shared = shared_state


# ---------------------------------------------------------------- the script


def test_several_budgets_with_costs_never_go_over_any_limit(redis_server):
    """Members each ask for their own key budget plus two shared ones, at varying costs."""
    host_w = (parse_policy("60/500ms fixed"),)  # a weight budget every member spends
    host_s = (parse_policy("12/300ms"), parse_policy("9@30/s"))  # sliding + bucket, requests
    key_p = (parse_policy("8/200ms"),)  # each member's own key
    grants: list[tuple[int, int, str, int]] = []  # (t_us, h_us, budget, cost)

    async def member(seed: int, stop_at: float) -> int:
        rng = random.Random(seed)
        shared = _shared(redis_server.url, "multi")
        h = rng.uniform(0.0, 0.02)
        calls = 0
        try:
            while time.monotonic() < stop_at:
                weight = rng.choice((1, 2, 5, 20))
                asks = [Ask(f"key{seed % 3}", key_p), Ask("weight", host_w, weight), Ask("req", host_s, 1)]
                grant = await shared.lease(asks, rng.randint(1, 4), h, SLACK_S, h, 0.9, 0.3, 0.0)
                calls += 1
                h_us = int((h + SLACK_S + shared.offset.width) * 1e6) + 1
                for t in shared.last_grant_us:
                    for a in asks:
                        grants.append((t, h_us, a.budget, a.cost))
                await pause_between_grants(grant, rng)
        finally:
            await shared.close()
        return calls

    async def main():
        stop_at = time.monotonic() + 1.5
        return await asyncio.gather(*(member(i, stop_at) for i in range(6)))

    calls = asyncio.run(main())
    assert all(c > 3 for c in calls), calls

    def of(budget):
        return sorted((t, h, c) for t, h, b, c in grants if b == budget)

    # the fixed weight windows (a send near a boundary counts in both): at most 60 each
    per: dict[int, int] = {}
    for t, h, c in of("weight"):
        for w in range((t - h) // 500_000, (t + h) // 500_000 + 1):
            per[w] = per.get(w, 0) + c
    assert max(per.values()) <= 60 and sum(c for _t, _h, c in of("weight")) >= 60, per

    def occupancy(rows, window_us):  # most units counting at one instant, [t, t + W + h)
        events = sorted(
            [(t, c) for t, _h, c in rows] + [(t + window_us + h, -c) for t, h, c in rows],
            key=lambda e: (e[0], e[1]),
        )
        best = cur = 0
        for _t, d in events:
            cur += d
            best = max(best, cur)
        return best

    assert occupancy(of("req"), 300_000) <= 12
    for k in ("key0", "key1", "key2"):
        assert occupancy(of(k), 200_000) <= 8
    level, at = 0.0, None  # the bucket: 9 deep, draining 30/s
    for t, _h, c in of("req"):
        if at is not None:
            level = max(0.0, level - 30 * (t - at) / 1e6)
        level, at = level + c, t
        assert level <= 9 + 1e-9


def test_a_refusal_by_one_budget_reserves_nothing_in_the_others(redis_server):
    async def main():
        shared = _shared(redis_server.url, "aon")
        full = (Policy(2, 10.0),)
        other = (Policy(100, 10.0), Policy(100, 10.0, parse_policy("1/1s fixed").kind))
        try:
            first = await shared.lease([Ask("full", full)], 2, 0.0, SLACK_S, 0.0, 0.0, 1.0, 0.0)
            assert len(first.times) == 2  # "full" is spent for 10 s
            none = await shared.lease(
                [Ask("other", other, 7), Ask("full", full)], 3, 0.0, SLACK_S, 0.0, 0.0, 1.0, 0.0
            )
            assert none.times == () and none.retry_at is not None
            client = shared.client
            for p in other:
                key = shared.policy_key("other", p)
                assert await client.exists(key) == 0, key  # nothing was recorded in "other"
            # a cost above one budget's limit: refused loudly, nothing reserved elsewhere
            with pytest.raises(StoreUnavailable):
                await shared.lease(
                    [Ask("other", other, 5), Ask("full", full, 3)], 1, 0.0, SLACK_S, 0.0, 0.0, 1.0, 0.0
                )
            assert await client.exists(*(shared.policy_key("other", p) for p in other)) == 0
            # and "other" alone still has all 100: 14 grants of 7 at once (burst pacing)
            alone = await shared.lease([Ask("other", other, 7)], 16, 0.0, SLACK_S, 0.0, 0.0, 1.0, 0.0)
            assert len(alone.times) == 14
        finally:
            await shared.close()

    asyncio.run(main())


# The fixed window is an hour long: one that turned mid-test (on the clock) would empty the
# count and fit the last ask (seen once in CI with 10 s windows).
@pytest.mark.parametrize("policy", ["1000/10s", "1000/1h fixed", "1000@100/s"])
def test_a_give_back_frees_units_a_later_grant_sees(redis_server, policy):
    async def main():
        shared = _shared(redis_server.url, "settle")
        p = (parse_policy(policy),)
        budget = f"tokens-{policy}"
        lease = shared.lease
        try:
            # a burst would fit nothing after 800 of 1000 for seconds: the horizon is 0.3 s
            first = await lease([Ask(budget, p, 800)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)
            assert len(first.times) == 1
            blocked = await lease([Ask(budget, p, 800)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)
            assert blocked.times == ()  # no room: the 800 are held
            await shared.give_back(first.tickets[0], budget, 700)  # the answer used 100
            again = await lease([Ask(budget, p, 800)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)
            assert len(again.times) == 1  # 100 + 800 fit
            # nothing more fits (the 900 held); a sliding window's grant is given back once only
            # (the engine gives each send back once: the fixed and bucket counts keep no record)
            if p[0].kind.value == "sliding":
                await shared.give_back(first.tickets[0], budget, 700)
            assert (await lease([Ask(budget, p, 150)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)).times == ()
        finally:
            await shared.close()

    asyncio.run(main())


def test_a_synced_count_raises_the_shared_count_never_lowers_it(redis_server):
    async def main():
        shared = _shared(redis_server.url, "sync")
        p = parse_policy("100/10s")
        try:
            got = await shared.lease([Ask("k", (p,), 30)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)
            assert len(got.times) == 1
            await shared.sync("k", p, 10, time.monotonic(), None)  # below what members hold: no change
            assert len((await shared.lease([Ask("k", (p,), 70)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)).times)
            await shared.give_back(got.tickets[0], "k", 30)
            await shared.sync("k", p, 95, time.monotonic(), None)  # the server counted someone else's
            assert (await shared.lease([Ask("k", (p,), 10)], 1, 0.0, SLACK_S, 0.0, 0.0, 0.3, 0.0)).times == ()
        finally:
            await shared.close()

    asyncio.run(main())


# ---------------------------------------------------------------- members on stubs


def _write(tmp_path: Path, name: str, lines: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_three_members_share_binances_weight_per_ip_and_never_exceed_it(redis_server, tmp_path):
    key, secret = "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zv", "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP"
    mix = [
        {"_path": "/api/v3/depth", "symbol": "BTCUSDT"},  # 5
        {"_path": "/api/v3/ping"},  # 1
        {"_path": "/api/v3/exchangeInfo"},  # 20
        {"_path": "/api/v3/ticker/price", "symbol": "ETHUSDT"},  # 2
    ]

    async def main():
        async with await start_binance(keys={key: secret}, weight_limits=((90, 3.0),)) as stub:
            engines, transports = [], []
            for i in range(3):
                cfg = load_config(
                    preset="binance",
                    overrides={
                        "target": {"url": stub.url},
                        "keys": {"secrets": [f"{key} {secret}"]},
                        "budgets": [
                            {"name": "weight", "scope": "host", "unit": "weight", "limits": ["90/3s fixed"]},
                            {"name": "orders", "limits": ["100/10s fixed"], "paths": ["/api/v3/order"]},
                        ],
                        # each member alone would send 3x the budget
                        "workload": {"file": _write(tmp_path, f"w{i}.jsonl", mix * 100), "rate": 30.0},
                        "engine": {"graveyard_path": str(tmp_path / f"g{i}.jsonl")},
                    },
                )
                transports.append(http_transport(cfg.engine_settings, stub.url))
                shared = RedisShared(redis_server.url, namespace="binance")
                engines.append(Engine(cfg, transports[-1], shared_state=shared))
            start = stub.now()
            try:
                snaps = await asyncio.gather(*(e.run(10.0) for e in engines))
            finally:
                for t in transports:
                    await t.close()
            return snaps, stub, start, stub.now(), [p for e in engines for p in e.parts.ends.problems]

    snaps, stub, start, end, problems = asyncio.run(main())
    state = stub.state
    windows = {w: used for (_ip, i, w), used in state.weight.items() if i == 0}
    # the server's own count is the truth: never over 90 in a window, no 429, no ban
    assert windows and max(windows.values()) <= 90, windows
    assert stub.ledger.refused() == [], stub.ledger.counts()
    # every member took part (how the grants split among them follows whose loop asks first: on
    # a loaded box one member may get only a couple; the budget is what must hold)
    assert all(s.sent > 0 for s in snaps), [s.sent for s in snaps]
    assert problems == []  # no "not shared" notice, nothing failed
    # and the budget was used: the whole windows inside the run at half or more together
    whole = [w for w in windows if w * 3 >= start + 3 and (w + 1) * 3 <= end - 1]
    print(
        f"binance, 3 members, 90/3s per IP: windows {sorted(windows.items())}; sent {[s.sent for s in snaps]}"
    )
    # (the condition is never over it; this asks that the shared budget is used at all:
    # 52-76 of 90 per whole window seen, the members' leases of weights 1-20 leave gaps)
    assert whole and sum(windows[w] for w in whole) >= 0.5 * 90 * len(whole), (windows, whole)


def test_three_members_share_one_openai_keys_tokens(redis_server, tmp_path):
    key = "sk-proj-alpha000000000000000001"
    minute_s = 3.0
    seconds = 15.0

    async def main():
        async with await start_openai(
            keys=[key], rpm=500, tpm=30_000, minute_s=minute_s, latency=0.3
        ) as stub:
            engines, transports = [], []
            for i in range(3):
                lines = prompts(2000, "/v1/chat/completions", seed=11 + i)
                cfg = load_config(
                    preset="openai",
                    overrides={
                        "target": {"url": stub.url},
                        "keys": {"secrets": [key]},
                        "workload": {"file": _write(tmp_path, f"p{i}.jsonl", lines)},
                        "engine": {"graveyard_path": str(tmp_path / f"g{i}.jsonl")},
                    },
                )
                transports.append(http_transport(cfg.engine_settings, stub.url))
                shared = RedisShared(redis_server.url, namespace="openai")
                engines.append(Engine(cfg, transports[-1], shared_state=shared))
            started = stub.now()
            try:
                snaps = await asyncio.gather(*(e.run(seconds) for e in engines))
            finally:
                for t in transports:
                    await t.close()
            arrivals = stub.ledger.arrivals()
            lo, hi = (min(arrivals), max(arrivals)) if arrivals else (started, started)
            return snaps, stub, lo, hi

    snaps, stub, lo, hi = asyncio.run(main())
    used = stub.ledger.units(key=key)
    cap = stub.allowed_capacity(lo, hi, key=key)
    refused = sum(c["rate_limit_exceeded"] for c in stub.state.book.refusals.values())
    share = used / cap
    print(f"openai, 3 members, one key: {used:,.0f} of {cap:,.0f} ({share:.3f}); 429s {refused}")
    assert all(s.succeeded > 3 for s in snaps), [s.succeeded for s in snaps]
    assert refused <= 3, refused
    assert share >= 0.85, (used, cap)


def test_learned_state_is_shared_per_key_and_the_newest_estimate_wins(redis_server):
    async def main():
        a, b = _shared(redis_server.url, "learned"), _shared(redis_server.url, "learned")
        now = time.time()

        def summary(member, learned):
            return {"member": member, "keys": [{"label": "k1", "budget": "fp1", "learned": learned}]}

        try:
            await a.publish(
                "a",
                summary(
                    "a",
                    {"estimate": 40, "window_s": 1.0, "reason": "lowered by a 429 at 40", "moved_at": now},
                ),
                3.0,
            )
            await b.publish(
                "b",
                summary(
                    "b",
                    {
                        "estimate": 50,
                        "window_s": 1.0,
                        "reason": "told",
                        "moved_at": now - 5,
                        "remaining": 7,
                        "limit": 50,
                    },
                ),
                3.0,
            )
            return await a.read_cluster()
        finally:
            await a.close()
            await b.close()

    view = asyncio.run(main())
    (row,) = view.keys
    # the estimate that moved last (a's), the counts last published (b's)
    assert (row.budget, row.estimate, row.estimate_limit, row.member) == ("fp1", "40/1s", 40, "a")
    assert (row.remaining, row.limit) == (7, 50) and row.age_s < 5
