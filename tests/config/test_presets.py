"""Each real-API preset against a stub built from that API's documentation (real loopback, real time).

The stubs keep their own ledger: what they refused and what they served of
what their limits allowed. Limits are scaled down so each run lasts seconds.
The presets are used as shipped; only the limits a user would state for a
scaled-down server are given, as a user would with --limit.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from ratedeck.config import load_config
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.transport import http_transport
from ratedeck.server.stubs.binance import start_binance
from ratedeck.server.stubs.github import start_github
from ratedeck.server.stubs.kraken import start_kraken
from ratedeck.server.stubs.stripe import start_stripe

pytestmark = pytest.mark.slow


def write_lines(tmp_path, lines):
    path = tmp_path / "work.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


async def run_preset(preset, url, tmp_path, seconds, **overrides):
    overrides.setdefault("engine", {})["graveyard_path"] = str(tmp_path / "graveyard.jsonl")
    cfg = load_config(preset=preset, overrides={"target": {"url": url}, **overrides})
    transport = http_transport(cfg.engine_settings, url)
    engine = Engine(cfg, transport)
    try:
        return await engine.run(seconds)
    finally:
        await transport.close()


def test_github_uses_a_token_s_remaining_quota_then_the_full_quota_after_reset(tmp_path):
    tokens = ["ghp_alpha0000000000000000", "ghp_bravo0000000000000000"]

    async def main():
        # 20 per 4 s per token; the first token starts 60% used, its window ending in 2 s.
        async with await start_github(
            tokens=tokens, core_limit=20, core_window=4.0, initial_used={tokens[0]: 12}, initial_reset_in=2.0
        ) as stub:
            lines = [{"_path": "/repos/o/r/issues", "page": i} for i in range(400)]
            lines[::40] = [{"_path": "/search/issues", "q": f"bug {i}"} for i in range(10)]
            start = stub.now()
            snap = await run_preset(
                "github",
                stub.url + "/repos/o/r/issues",
                tmp_path,
                9.0,
                keys={"secrets": tokens, "limits": ["20/4s fixed"]},
                workload={"file": write_lines(tmp_path, lines), "rate": 40.0},
            )
            end = stub.now()
            return snap, stub, start, end

    snap, stub, start, end = asyncio.run(main())
    assert snap.balance() == 0
    assert stub.ledger.refused() == [], stub.ledger.counts()
    assert stub.ledger.backoff_ignored() == 0
    # Each token's requests, counted in the server's own windows (from the first
    # request after a reset to the reset it announced): the first token spends the
    # 8 left of its window, then a full 20; the fresh one a full 20 in each window.
    # (The run ends inside a later window.) Counting the server's windows, not gaps
    # between sends: on a loaded machine even pacing can leave no visible gap.
    for token, first in ((tokens[0], 8), (tokens[1], 20)):
        windows = stub.state.windows[(token, "core")]
        served = [w.used - w.initial for w in windows]
        assert served[:2] == [first, 20], (token, served)
        assert sum(served) == len(stub.ledger.accepted(key=token, bucket="core"))
    assert any(k.server_remaining is not None for k in snap.keys)  # the server's own count, shown


def test_stripe_never_charges_twice_when_a_write_answers_500(tmp_path):
    key = "sk_test_0000000000000000000000"

    async def main():
        async with await start_stripe(
            keys=[key], rate_limit=25, endpoint_limit=25, fail_after_write=0.05, seed=3
        ) as stub:
            lines = [
                {"amount": 100 + i, "currency": "usd", "metadata[order_id]": f"o{i}"} for i in range(100)
            ]
            start = stub.now()
            snap = await run_preset(
                "stripe",
                stub.url + "/v1/charges",
                tmp_path,
                6.0,
                keys={"secrets": [key], "limits": ["25/1s"]},
                workload={"file": write_lines(tmp_path, lines), "rate": 50.0},
            )
            return snap, stub, start, stub.now()

    snap, stub, start, end = asyncio.run(main())
    assert snap.balance() == 0
    # A 500 after the write is replayed for the same Idempotency-Key (Stripe saves the
    # first answer), so those requests end uncertain, charged once, never twice.
    assert snap.succeeded + snap.uncertain == 100 and snap.uncertain <= 12 and snap.graveyard == 0
    assert stub.state.duplicate_writes() == {}
    assert len(stub.state.writes_by_logical()) == 100  # every order written, each exactly once
    assert not stub.ledger.refused("rate_limited")
    assert snap.rejected_other == 0  # no unknown parameter (no req_id, no nonce) was ever sent


def test_binance_spends_weights_from_the_ip_budget_and_is_never_refused_or_banned(tmp_path):
    key, secret = "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zv", "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP"

    async def main():
        async with await start_binance(keys={key: secret}, weight_limits=((60, 5.0),)) as stub:
            mix = [
                {"_path": "/api/v3/depth", "symbol": "BTCUSDT"},
                {"_path": "/api/v3/ping"},
                {"_path": "/api/v3/exchangeInfo"},
                {"_path": "/api/v3/account"},
                {"_path": "/api/v3/ticker/price", "symbol": "ETHUSDT"},
            ]
            lines = [mix[i % len(mix)] for i in range(300)]
            start = stub.now()
            snap = await run_preset(
                "binance",
                stub.url,
                tmp_path,
                15.0,
                keys={"secrets": [f"{key} {secret}"]},
                budgets=[
                    {"name": "weight", "scope": "host", "unit": "weight", "limits": ["60/5s fixed"]},
                    {"name": "orders", "limits": ["100/10s fixed"], "paths": ["/api/v3/order"]},
                ],
                workload={"file": write_lines(tmp_path, lines), "rate": 30.0},
            )
            return snap, stub, start, stub.now()

    snap, stub, start, end = asyncio.run(main())
    assert snap.balance() == 0
    counts = stub.ledger.counts()
    assert stub.ledger.refused() == [], counts  # no 429, no 418, no bad signature
    # Weight windows turn at the clock's multiples of 5 s: the windows wholly inside the
    # run, after the first, were used to 85% on average (90-100% on a quiet box; the edges
    # are partial windows, and the first whole one is still the start: a wide initial
    # headroom, and sends near its start charged to the window before as well, left it at
    # 67% twice in CI when the run began just before a boundary).
    first = (int(start // 5) + 2) * 5
    whole = [(w, w + 5) for w in range(first, int(end // 5) * 5, 5)]
    assert whole, "the run must cover a whole window after the first"
    weight = next(b for b in snap.budgets if b.name == "weight")
    assert (weight.owner, weight.limit, weight.weighted) == ("host", 60, True)
    used = [stub.ledger.units(bucket="weight", start=lo, end=hi) for lo, hi in whole]
    assert sum(used) >= 0.85 * 60 * len(whole), (used, counts)


def test_kraken_signs_every_call_keeps_nonces_in_order_and_never_hits_the_counter(tmp_path):
    key = "KRAKENKEY000000000000000000000"
    secret = base64.b64encode(b"kraken-secret-bytes-for-the-stub-0123456789").decode()

    async def main():
        async with await start_kraken(keys={key: secret}, max_counter=15, decay=3.0) as stub:
            lines = [
                {"_path": "/0/private/Ledgers" if i % 3 == 0 else "/0/private/Balance"} for i in range(200)
            ]
            start = stub.now()
            snap = await run_preset(
                "kraken",
                stub.url + "/0/private/Balance",
                tmp_path,
                6.0,
                keys={"secrets": [f"{key} {secret}"], "limits": ["15@3/s"], "unit": "weight"},
                workload={"file": write_lines(tmp_path, lines), "rate": 20.0},
            )
            return snap, stub, start, stub.now()

    snap, stub, start, end = asyncio.run(main())
    assert snap.balance() == 0
    counts = stub.ledger.counts()
    assert stub.ledger.refused() == [], counts
    assert stub.share(start, end, key=key) >= 0.85, counts
