"""A limit the user got wrong: the key's estimate, lowered by the server's rejections (virtual time)."""

from __future__ import annotations

from ratedeck.core.policy import Policy
from ratedeck.server.settings import ServerSettings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

KEYS = ("key-000", "key-001", "key-002", "key-003", "key-004")


def told_25_allows_20(learn: bool = True):
    # The server allows 20/1s, says Retry-After on a 429 and doubles the cooldown
    # of a key that keeps sending during it; it advertises nothing else.
    server = ServerSettings(
        mode="standard",
        keys=KEYS,
        policies=(Policy(20, 1.0),),
        latency_in_ms=(0, 50),
        latency_out_ms=(0, 50),
        ratelimit_headers=False,
        escalation=True,
        escalation_base_s=1.0,
        escalation_cap_s=16.0,
        seed=5,
    )
    eng, transport = seed_engine(
        server=server,
        keys={"secrets": list(KEYS), "limits": ["25/1s"]},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "max_attempts": 20, "learn_policy": learn},
        workload={"rate": 125.0},
    )
    snap = run_virtual(eng.run(60))
    return snap, transport.rules.stats()["totals"], transport


def test_told_25_while_the_server_allows_20_the_estimate_falls_to_20_and_stays():
    snap, totals, _ = told_25_allows_20()
    assert snap.balance() == 0
    # The estimate, beside the limit the user gave (which stays as given).
    assert all(k.limit_estimate in ("20/1s", "19/1s") for k in snap.keys), [
        k.limit_estimate for k in snap.keys
    ]
    assert all(k.learned_limit == k.limit_estimate and k.told_limit == "25/1s" for k in snap.keys)
    assert all(k.estimate_reason == "lowered by a 429 at 25" for k in snap.keys), [
        k.estimate_reason for k in snap.keys
    ]
    assert all(k.estimate_moved_ago_s is not None and k.estimate_moved_ago_s > 50 for k in snap.keys)
    assert any("limit estimate 20/1s (lowered by a 429 at 25)" in e.text for e in snap.events)
    # One burst of rejections per key at most (what was in flight at the first), then none:
    # the told 25/1s never held, so it is not probed again in the run.
    assert snap.rejected_429 <= len(KEYS) * 4, snap.rejected_429
    assert totals["requests_during_cooldown"] <= len(KEYS), totals
    # Accepted share of the true capacity (5 keys x 20/s) over the run: 0.923 here.
    assert snap.succeeded / (60 * 100) >= 0.91, snap.succeeded


def test_without_learning_the_same_run_keeps_getting_rejected():
    snap, totals, _ = told_25_allows_20(learn=False)
    learned, _, _ = told_25_allows_20()
    assert snap.rejected_429 > 3 * learned.rejected_429
    assert snap.succeeded < learned.succeeded
