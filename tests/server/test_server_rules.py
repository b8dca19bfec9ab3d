"""RateRules on explicit times: the study's server's semantics and the richer modes."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from ratedeck.core.policy import Policy, parse_policy
from ratedeck.server.audit import WindowAudit
from ratedeck.server.rules import RateRules
from ratedeck.server.settings import STUDY_KEYS, ServerSettings, study_settings

KEY = STUDY_KEYS[0]


def plain(**changes) -> ServerSettings:
    """Standard settings with every extra off unless a test turns it on."""
    base = ServerSettings(
        keys=("k-one", "k-two", "k-three"),
        policies=(Policy(20, 1.0),),
        latency_in_ms=(0, 0),
        latency_out_ms=(0, 0),
        retry_after=False,
        ratelimit_headers=False,
        seed=1,
    )
    return replace(base, **changes)


def fill(rules: RateRules, key: str, count: int, now_ms: float, first_nonce: int = 1) -> int:
    """Send `count` requests at `now_ms` that must all succeed; return the next nonce."""
    for nonce in range(first_nonce, first_nonce + count):
        decision = rules.decide(key, nonce, now_ms)
        assert decision.status == 200, (nonce, decision)
    return first_nonce + count


def test_unknown_key_is_401_with_the_seed_body():
    decision = RateRules(study_settings()).decide("NOT-A-KEY", 1, 0.0)
    assert decision.status == 401
    assert decision.body == {"status": "error", "error_msg": "invalid api key"}


def test_success_echoes_req_id():
    decision = RateRules(study_settings()).decide(KEY, 1, 0.0, req_id="abc")
    assert (decision.status, decision.body) == (200, {"status": "OK", "req_id": "abc"})


def test_window_boundary_is_strict():
    rules = RateRules(plain())
    fill(rules, "k-one", 20, 0.0)
    at_boundary = rules.decide("k-one", None, 1000.0)
    assert at_boundary.status == 429
    assert at_boundary.body == {"status": "error", "error_msg": "exceeded rate limit"}
    assert rules.decide("k-one", None, 1000.001).status == 200


def test_seed_mode_stamps_whole_milliseconds_like_the_original():
    rules = RateRules(study_settings())
    nonce = fill(rules, KEY, 20, 0.0)
    # 1000.9 ms is stamped 1000, which is not more than one window after 0.
    assert rules.decide(KEY, nonce, 1000.9).status == 429
    assert rules.decide(KEY, nonce, 1001.0).status == 200


def test_keys_have_separate_budgets():
    rules = RateRules(plain())
    fill(rules, "k-one", 20, 0.0)
    assert rules.decide("k-one", None, 1.0).status == 429
    assert rules.decide("k-two", None, 1.0).status == 200


def test_several_policies_are_all_or_nothing():
    rules = RateRules(plain(policies=(parse_policy("1/1s"), parse_policy("2/10s"))))
    assert rules.decide("k-one", None, 0.0).status == 200
    assert rules.decide("k-one", None, 1001.0).status == 200
    # The 1/1s policy has room, the 2/10s one does not: nothing may be spent.
    assert rules.decide("k-one", None, 9500.0).status == 429
    # Had 9500 taken the 1/1s slot, this would be rejected by it.
    assert rules.decide("k-one", None, 10001.0).status == 200
    assert rules.decide("k-one", None, 10001.0).status == 429


def test_nonce_must_increase_and_a_bad_nonce_wastes_the_slot():
    rules = RateRules(study_settings())
    assert rules.decide(KEY, 0, 0.0).status == 400  # the original starts from 0
    assert rules.decide(KEY, "7", 0.0).status == 200
    bad = rules.decide(KEY, "7", 0.0)
    assert (bad.status, bad.body["error_msg"]) == (400, "invalid nonce")
    assert rules.decide(KEY, None, 0.0).status == 400
    assert rules.decide(KEY, "abc", 0.0).status == 400
    assert rules.decide(KEY, 7.5, 0.0).status == 400
    assert rules.decide(KEY, "8", 0.0).status == 200
    # 7 requests so far, every one of which spent a slot; 13 left in this second.
    for _ in range(13):
        assert rules.decide(KEY, 1, 0.0).status == 400
    assert rules.decide(KEY, 100, 0.0).status == 429
    key_stats = rules.stats()["keys"][0]
    assert key_stats["accepted"] == 20
    assert key_stats["ok"] == 2
    assert key_stats["rejected_nonce"] == 18


def test_nonce_is_ignored_when_not_required():
    rules = RateRules(plain())
    assert rules.decide("k-one", None, 0.0).status == 200
    assert rules.decide("k-one", "whatever", 0.0).status == 200


def test_seed_mode_blocks_after_ten_rejections_for_good():
    rules = RateRules(study_settings())
    fill(rules, KEY, 20, 0.0)
    for _ in range(10):
        decision = rules.decide(KEY, 999, 500.0)
        assert decision.body["error_msg"] == "exceeded rate limit"
        assert decision.headers == {}  # the original sends no Retry-After
    for later in (500.0, 5_000.0, 10_000_000.0):
        blocked = rules.decide(KEY, 10_000 + later, later)
        assert blocked.status == 429
        assert blocked.body == {"status": "error", "error_msg": "too many rate limit errors: blocked"}
    assert rules.decide(STUDY_KEYS[1], 1, 500.0).status == 200
    stats = rules.stats()["keys"]
    assert stats[0]["blocked"] is True
    assert stats[0]["rejected_429"] == 10
    assert stats[0]["blocked_answers"] == 3
    assert stats[1]["blocked"] is False


def test_nine_rejections_do_not_block():
    rules = RateRules(study_settings())
    fill(rules, KEY, 20, 0.0)
    for _ in range(9):
        rules.decide(KEY, 999, 500.0)
    assert rules.decide(KEY, 21, 1001.0).status == 200


def test_retry_after_is_the_wait_rounded_up_to_whole_seconds():
    rules = RateRules(plain(policies=(parse_policy("2/10s"),), retry_after=True))
    fill(rules, "k-one", 2, 0.0)
    assert rules.decide("k-one", None, 2500.0).headers["Retry-After"] == "8"
    assert rules.decide("k-one", None, 9999.5).headers["Retry-After"] == "1"


def test_escalation_doubles_the_cooldown_up_to_the_cap():
    settings = plain(
        policies=(parse_policy("1/1s"),),
        escalation=True,
        escalation_base_s=1.0,
        escalation_cap_s=4.0,
        retry_after=True,
    )
    rules = RateRules(settings)
    assert rules.decide("k-one", None, 0.0).status == 200
    first = rules.decide("k-one", None, 100.0)
    assert (first.status, first.outcome, first.headers["Retry-After"]) == (429, "rate_limited", "1")
    answers = [rules.decide("k-one", None, t) for t in (200.0, 300.0, 400.0)]
    assert [a.headers["Retry-After"] for a in answers] == ["2", "4", "4"]
    assert {a.outcome for a in answers} == {"cooldown"}
    # The last cooldown started at 400 and lasts 4 s: 4399 is still inside it.
    assert rules.decide("k-one", None, 4399.0).outcome == "cooldown"
    # ... which restarted it at 4399 for another 4 s.
    assert rules.decide("k-one", None, 8398.0).outcome == "cooldown"
    assert rules.decide("k-one", None, 12_398.0).status == 200
    key_stats = rules.stats()["keys"][0]
    assert key_stats["requests_during_cooldown"] == 5
    assert key_stats["escalations"] == 5
    assert key_stats["rejected_429"] == 6


def test_without_escalation_rejections_do_not_extend_anything():
    rules = RateRules(plain(policies=(parse_policy("1/1s"),)))
    rules.decide("k-one", None, 0.0)
    for t in (100.0, 200.0, 900.0):
        assert rules.decide("k-one", None, t).status == 429
    assert rules.decide("k-one", None, 1000.5).status == 200


def test_host_limit_is_shared_and_has_its_own_answer():
    rules = RateRules(plain(host_policies=(parse_policy("5/1s"),), block_after=1, retry_after=True))
    keys = ["k-one", "k-two", "k-three"]
    for i in range(5):
        assert rules.decide(keys[i % 3], None, float(i)).status == 200
    rejected = rules.decide("k-three", None, 10.0)
    assert rejected.status == 429
    assert rejected.outcome == "host_limited"
    assert rejected.body["error_msg"] == "exceeded host rate limit"
    assert rejected.headers["Retry-After"] == "1"
    # The host's 429 is not the key's fault: it does not count toward the block.
    assert rules.decide("k-three", None, 1000.5).status == 200
    stats = rules.stats()
    assert stats["host"]["accepted"] == 6
    assert stats["host"]["rejected_429"] == 1
    assert stats["host"]["max_in_window"] == [{"policy": "5/1s", "limit": 5, "max_in_window": 5}]
    assert stats["keys"][2]["rejected_host"] == 1
    assert stats["keys"][2]["blocked"] is False


def test_a_key_rejection_does_not_spend_host_capacity():
    rules = RateRules(plain(policies=(parse_policy("1/1s"),), host_policies=(parse_policy("2/1s"),)))
    assert rules.decide("k-one", None, 0.0).status == 200
    assert rules.decide("k-one", None, 1.0).status == 429
    assert rules.decide("k-two", None, 2.0).status == 200
    assert rules.decide("k-three", None, 3.0).outcome == "host_limited"


def test_ratelimit_headers_describe_the_tightest_policy():
    settings = plain(policies=(parse_policy("3/1s"), parse_policy("10/1m")), ratelimit_headers=True)
    rules = RateRules(settings)
    headers = rules.decide("k-one", None, 0.0).headers
    assert headers["RateLimit-Policy"] == '"3/1s";q=3;w=1, "10/1m";q=10;w=60'
    assert headers["RateLimit"] == '"3/1s";r=2;t=1'
    assert headers["X-RateLimit-Limit"] == "3"
    assert headers["X-RateLimit-Remaining"] == "2"
    assert headers["X-RateLimit-Reset"] == "1.000"
    rules.decide("k-one", None, 250.0)
    full = rules.decide("k-one", None, 500.0).headers
    assert full["X-RateLimit-Remaining"] == "0"
    assert full["X-RateLimit-Reset"] == "0.500"  # the stamp at 0 leaves the window at 1000
    assert rules.decide("k-one", None, 30_000.0).headers["RateLimit"] == '"3/1s";r=2;t=1'
    for t in (32_000.0, 34_000.0, 36_000.0):
        rules.decide("k-one", None, t)
    # Both have 2 left now; the minute policy waits longer, so it is the one reported.
    later = rules.decide("k-one", None, 38_000.0).headers
    assert later["RateLimit"] == '"10/1m";r=2;t=22'


def test_fault_injection_answers_503_after_spending_the_slot():
    rules = RateRules(plain(policies=(parse_policy("2/1s"),), error_rate=1.0, retry_after=True))
    fault = rules.decide("k-one", None, 0.0)
    assert fault.status == 503
    assert fault.headers["Retry-After"] == "1"
    rules.decide("k-one", None, 0.0)
    assert rules.decide("k-one", None, 0.0).status == 429
    assert rules.stats()["keys"][0]["faults"] == 2


def test_fault_rate_is_roughly_the_fraction_asked_for():
    rules = RateRules(plain(policies=(parse_policy("100000/1s"),), error_rate=0.25))
    statuses = [rules.decide("k-one", None, 0.0).status for _ in range(4000)]
    assert 800 < statuses.count(503) < 1200


def test_stats_mask_keys_and_are_json_ready():
    rules = RateRules(study_settings())
    rules.decide(KEY, 1, 0.0)
    text = json.dumps(rules.stats())
    for key in STUDY_KEYS:
        assert key not in text
    rows = rules.stats()["keys"]
    assert [(row["index"], row["key"]) for row in rows][:2] == [(0, "…JYA6"), (1, "…9F5O")]


def test_reset_forgets_everything():
    rules = RateRules(study_settings())
    fill(rules, KEY, 20, 0.0)
    for _ in range(11):
        rules.decide(KEY, 999, 1.0)
    rules.reset()
    assert rules.decide(KEY, 1, 2.0).status == 200
    assert rules.stats()["totals"]["requests"] == 1


def test_audit_counts_a_closed_window():
    audit = WindowAudit(Policy(3, 1.0))
    for stamp in (0.0, 1000.0, 2000.0):
        audit.record(stamp)
    assert audit.max_in_window == 2  # [0, 1000] holds both ends
    audit.record(2999.0)
    audit.record(3000.0)
    assert audit.max_in_window == 3  # [2000, 3000]
    assert audit.ok
    audit.record(3000.0)
    assert audit.max_in_window == 4
    assert not audit.ok


def test_audit_matches_brute_force_on_random_stamps():
    rng = random.Random(7)
    stamps = sorted(rng.uniform(0, 5000) for _ in range(300))
    audit = WindowAudit(Policy(10, 0.1))
    for stamp in stamps:
        audit.record(stamp)
    brute = max(sum(1 for s in stamps if t - 100.0 <= s <= t) for t in stamps)
    assert audit.max_in_window == brute


def test_rules_never_let_more_than_the_limit_through_random_traffic():
    rng = random.Random(3)
    settings = plain(policies=(parse_policy("5/100ms"), parse_policy("12/1s")))
    rules = RateRules(settings)
    now, accepted = 0.0, []
    for _ in range(3000):
        now += rng.choice((0.0, 0.5, 3.0, 17.0, 40.0))
        if rules.decide("k-one", None, now).status == 200:
            accepted.append(now)
    for limit, window in ((5, 100.0), (12, 1000.0)):
        worst = max(sum(1 for s in accepted if t - window <= s <= t) for t in accepted)
        assert worst <= limit
    audits = rules.stats()["keys"][0]["max_in_window"]
    assert [row["max_in_window"] for row in audits] == [5, 12]
    assert rules.stats()["audit_ok"] is True


@pytest.mark.parametrize(
    "data, field",
    [
        ({"policies": ["abc"]}, "policies"),
        ({"latency_in_ms": [5, 1]}, "latency_in_ms"),
        ({"block_after": -1}, "block_after"),
        ({"error_rate": 1.5}, "error_rate"),
        ({"mode": "fast"}, "mode"),
        ({"keys": []}, "keys"),
        ({"nonce": "yes"}, "nonce"),
        ({"escalation_cap_s": 0.5}, "escalation_cap_s"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_settings_errors_name_the_field(data, field):
    with pytest.raises(ValueError, match=field):
        ServerSettings.from_dict(data)


def test_settings_round_trip_through_dicts():
    settings = plain(host_policies=(parse_policy("5/500ms"),), escalation=True, seed=4)
    assert ServerSettings.from_dict(settings.to_dict()) == settings
    assert ServerSettings.from_dict(study_settings().to_dict()) == study_settings()


def test_study_settings_are_the_study_server():
    s = study_settings()
    assert s.keys == STUDY_KEYS and len(s.keys) == 5
    assert s.policies == (Policy(20, 1.0),)
    assert s.latency_in_ms == s.latency_out_ms == (0, 50)
    assert (s.block_after, s.nonce, s.retry_after) == (10, True, False)
    assert ServerSettings.from_dict({"mode": "study"}) == s


def test_from_dict_fills_from_the_mode_and_generates_keys():
    s = ServerSettings.from_dict({"keys": 3, "policies": "5/1s"})
    assert s.mode == "standard"
    assert s.keys == ("key-000", "key-001", "key-002")
    assert s.policies == (Policy(5, 1.0),)
