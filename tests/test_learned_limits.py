"""A limit the user got wrong: learned from the server's rejections (virtual time)."""

from __future__ import annotations

from engine_helpers import seed_engine

from ratedeck.core.policy import Policy
from ratedeck.server.settings import ServerSettings
from ratedeck.server.simulated import run_virtual

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


def test_told_25_while_the_server_allows_20_it_learns_20_after_one_burst():
    snap, totals, _ = told_25_allows_20()
    assert snap.balance() == 0
    assert all(k.learned_limit in ("20/1s", "19/1s") for k in snap.keys), [k.learned_limit for k in snap.keys]
    assert any("learned" in e.text for e in snap.events)
    # At most one burst of rejections per key (what was in flight at the first), then none.
    assert snap.rejected_429 <= len(KEYS) * 8, snap.rejected_429
    # Accepted share of the true capacity (5 keys x 20/s) over the run: 0.924 here,
    # against 0.945 when told the right limit (the first cooldown and the burst in
    # flight cost the rest).
    assert snap.succeeded / (60 * 100) >= 0.91, snap.succeeded
    # After the first cooldown nothing more reaches the server inside one.
    assert totals["escalations"] <= len(KEYS), totals


def test_without_learning_the_same_run_keeps_getting_rejected():
    snap, totals, _ = told_25_allows_20(learn=False)
    learned, _, _ = told_25_allows_20()
    assert snap.rejected_429 > 3 * learned.rejected_429
    assert snap.succeeded < learned.succeeded
