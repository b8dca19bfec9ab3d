"""Honouring "slow down" as one: delay sources, gate semantics, escalation, host budget, pools."""

import asyncio
import json
from email.utils import formatdate

import pytest
from multidict import CIMultiDict

from ratedeck.bench.cooldown import PerRequestCooldown
from ratedeck.config import load_config
from ratedeck.core.policy import Policy
from ratedeck.engine.engine import Engine
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.delays import (
    advertised_policies,
    json_field_hook,
    parse_retry_after,
    ratelimit_delay,
    response_delay,
    x_ratelimit_delay,
)
from ratedeck.engine.http.transport import TransportBase
from ratedeck.server.settings import ServerSettings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

# ---------------------------------------------------------------- delay sources


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(formatdate(1000.0 + 30, usegmt=True), now_wall=1000.0) == pytest.approx(30)
    assert (
        parse_retry_after("soon") is None
        and parse_retry_after("-3") is None
        and parse_retry_after(None) is None
    )


def test_ratelimit_fields():
    assert ratelimit_delay('"default";r=0;t=5') == 5.0
    assert ratelimit_delay('"default";r=3;t=5') is None
    assert advertised_policies('"a";q=20;w=1, "b";q=600;w=60') == (Policy(20, 1.0), Policy(600, 60.0))
    assert x_ratelimit_delay("0", "2.5") == 2.5
    assert x_ratelimit_delay("0", str(2_000_000_000 + 12), now_wall=2_000_000_000) == 12
    assert x_ratelimit_delay("4", "2.5") is None


def test_body_hook_reads_google_style_retry_delay():
    hook = json_field_hook("error.details.retryDelay")
    body = '{"error": {"details": [{"retryDelay": "15s"}]}}'
    assert hook(429, {}, body) == 15.0
    assert response_delay(429, {}, body, hook) == 15.0
    assert response_delay(429, {"Retry-After": "3"}, body, hook) == 3.0  # the header wins
    assert hook(429, {}, "not json") is None


def test_retry_after_ms_is_read_before_the_rounded_retry_after():
    # Azure OpenAI's 429: retry-after in whole seconds (rounded up), retry-after-ms exact
    headers = CIMultiDict({"Retry-After": "1", "Retry-After-Ms": "237"})
    assert response_delay(429, headers, "") == 0.237
    assert response_delay(429, CIMultiDict({"retry-after": "2", "retry-after-ms": "x"}), "") == 2.0
    assert response_delay(429, CIMultiDict({"retry-after-ms": "-5", "retry-after": "4"}), "") == 4.0


def test_gate_keeps_the_longest_delay():
    gate = CooldownGate("k1")
    assert gate.close(5.0, "first")
    assert not gate.close(3.0, "shorter")  # a shorter delay never reopens early
    assert gate.open_at == 5.0 and gate.reason == "first"
    assert gate.close(8.0, "longer") and gate.open_at == 8.0


# ---------------------------------------------------------------- gate semantics on the engine


class ScriptedTransport(TransportBase):
    """Answers per a script: (key secret, virtual time) -> (kind, retry_after). Logs sends."""

    def __init__(self, script, rtt=0.05):
        self.script, self.rtt = script, rtt
        self.sends: list[tuple[str, float]] = []
        self.in_flight = 0

    async def send(self, key, req, nonce):
        loop = asyncio.get_running_loop()
        t = loop.time()
        self.sends.append((key.secret, t))
        self.in_flight += 1
        try:
            await asyncio.sleep(self.rtt)
        finally:
            self.in_flight -= 1
        kind, delay = self.script(key.secret, t)
        return oc.Outcome(kind, 429 if kind == oc.RATE_LIMITED else 200, delay, self.rtt)

    async def close(self):
        pass


def one_key_engine(transport, **engine):
    cfg = load_config(
        preset="study",
        overrides={
            "keys": {"secrets": ["KEY-ONE-0000000000"], "limits": ["20/1s"]},
            "target": {"nonce_param": ""},
            "engine": {"graveyard_path": "", "ttl_s": 30.0, "max_attempts": 10, **engine},
        },
    )
    return Engine(cfg, transport)


def test_concurrent_rejections_close_one_gate_longest_wins_and_nothing_is_sent_meanwhile():
    # Three attempts in flight at t~0.1 are all rejected, with delays 2, 5 and 3 s.
    delays = iter([2.0, 5.0, 3.0])

    def script(key, t):
        if 0.1 <= t < 0.3:
            return oc.RATE_LIMITED, next(delays, 1.0)
        return oc.OK, None

    transport = ScriptedTransport(script, rtt=0.2)
    engine = one_key_engine(transport)

    async def main():
        engine.start()
        await asyncio.sleep(10)
        return await engine.stop()

    snap = run_virtual(main())
    rejected_at = [t for _, t in transport.sends if 0.1 <= t < 0.3]
    assert len(rejected_at) >= 3
    last_answer = max(rejected_at) + 0.2
    gate_open = min(t + 0.2 + d for t, d in zip(sorted(rejected_at), [2.0, 5.0, 3.0], strict=False))
    # nothing goes out between the first rejection's answer and the longest delay's end
    first_answer = min(rejected_at) + 0.2
    quiet = [t for _, t in transport.sends if first_answer < t < min(rejected_at) + 0.2 + 5.0 - 0.01]
    assert quiet == []
    assert snap.rejected_429 == len(rejected_at) and snap.balance() == 0
    assert gate_open <= last_answer + 5.0
    # the rejected requests were retried after the gate opened and succeeded
    assert snap.graveyard == 0 and snap.retried >= 3


def test_a_gate_closing_while_requests_are_in_flight_lets_them_finish():
    def script(key, t):
        return (oc.RATE_LIMITED, 1.0) if 0.5 <= t < 0.6 else (oc.OK, None)

    transport = ScriptedTransport(script, rtt=0.3)  # several in flight per key
    engine = one_key_engine(transport)
    peak = []

    async def main():
        engine.start()
        for _ in range(40):
            await asyncio.sleep(0.05)
            peak.append(engine.snapshot().in_flight)
        return await engine.stop()

    snap = run_virtual(main())
    assert max(peak) >= 3  # there really were several in flight
    answer = min(t for _, t in transport.sends if 0.5 <= t < 0.6) + 0.3
    during = [t for _, t in transport.sends if answer < t < answer + 1.0 - 1e-9]
    assert during == []
    assert snap.succeeded > 0 and snap.balance() == 0


def test_stopping_while_the_gate_is_closed_sends_nothing_and_loses_nothing():
    def script(key, t):
        return (oc.RATE_LIMITED, 60.0) if t < 0.01 else (oc.OK, None)

    transport = ScriptedTransport(script)
    engine = one_key_engine(transport)

    async def main():
        engine.start()
        await asyncio.sleep(3)
        return await engine.stop()

    snap = run_virtual(main())
    assert [t for _, t in transport.sends if t > 0.06] == []
    assert snap.keys[0].state == "cooling" or snap.keys[0].cooldown_left_s > 0
    assert snap.balance() == 0 and snap.main_depth + snap.dlq_depth > 0


# ---------------------------------------------------------------- escalation, by the server's stats


def escalation_run(engine_kw=None, **engine):
    server = ServerSettings(
        mode="standard",
        keys=("key-000", "key-001", "key-002"),
        policies=(Policy(10, 1.0),),
        latency_in_ms=(0, 50),
        latency_out_ms=(0, 50),
        escalation=True,
        escalation_base_s=1.0,
        escalation_cap_s=16.0,
    )
    eng, transport = seed_engine(
        server=server,
        keys={"secrets": list(server.keys), "limits": ["20/1s"]},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "max_attempts": 20, **engine},
        engine_kw=engine_kw,
    )
    snap = run_virtual(eng.run(120))
    return snap, transport.rules.stats()["totals"]


def test_escalation_mode_ratedeck_never_provokes_a_cooldown_and_the_pre_actor_design_does():
    snap, totals = escalation_run()  # defaults: shared gates, adopt advertised limits
    assert totals["requests_during_cooldown"] == 0 and totals["escalations"] == 0
    assert snap.rejected_429 == 0 and snap.throughput_tps > 25  # 3 keys x 10/s real capacity
    naive, naive_totals = escalation_run({"cooldown": PerRequestCooldown()}, learn_policy=False)
    assert naive_totals["escalations"] > 0 and naive_totals["requests_during_cooldown"] > 0
    assert naive.throughput_tps < snap.throughput_tps


def test_shared_gates_alone_beat_per_request_retries_when_no_policy_is_advertised():
    shared, shared_totals = escalation_run(learn_policy=False)
    naive, naive_totals = escalation_run({"cooldown": PerRequestCooldown()}, learn_policy=False)
    assert shared_totals["escalations"] < naive_totals["escalations"]
    assert shared.throughput_tps > naive.throughput_tps


# ---------------------------------------------------------------- host-wide budget


def test_a_host_wide_limit_is_one_budget_for_all_keys():
    server = ServerSettings(
        mode="standard",
        keys=tuple(f"key-{i:03d}" for i in range(5)),
        policies=(Policy(20, 1.0),),
        host_policies=(Policy(50, 1.0),),
        latency_in_ms=(0, 20),
        latency_out_ms=(0, 20),
    )
    eng, transport = seed_engine(
        server=server,
        keys={"secrets": list(server.keys), "limits": ["20/1s"], "host_limits": ["50/1s"]},
        target={"nonce_param": ""},
    )
    snap = run_virtual(eng.run(30))
    stats = transport.rules.stats()
    assert stats["host"]["rejected_429"] == 0 and stats["totals"]["rejected_429"] == 0
    assert all(a["max_in_window"] <= 50 for a in stats["host"]["max_in_window"])
    assert snap.capacity_tps == 50
    assert 45 <= snap.throughput_tps <= 50


# ---------------------------------------------------------------- pools


def test_a_pool_caps_concurrent_calls_and_other_pools_keep_going(tmp_path):
    lines = [json.dumps({"_pool": "write" if i % 4 == 0 else "read", "i": i}) for i in range(200)]
    path = tmp_path / "work.jsonl"
    path.write_text("\n".join(lines))
    concurrent = {"read": 0, "write": 0}
    peak = {"read": 0, "write": 0}

    class PoolTransport(ScriptedTransport):
        async def send(self, key, req, nonce):
            concurrent[req.pool] += 1
            peak[req.pool] = max(peak[req.pool], concurrent[req.pool])
            try:
                return await super().send(key, req, nonce)
            finally:
                concurrent[req.pool] -= 1

    transport = PoolTransport(lambda k, t: (oc.OK, None), rtt=0.4)
    cfg = load_config(
        preset="study",
        overrides={
            "target": {"nonce_param": ""},
            "workload": {"file": str(path)},
            "pools": {"read": 6, "write": 1},
            "engine": {"graveyard_path": "", "ttl_s": 60.0},
        },
    )
    snap = run_virtual(Engine(cfg, transport).run(None))
    assert snap.succeeded == 200
    assert peak["write"] == 1 and 2 <= peak["read"] <= 6


def test_an_unknown_pool_in_the_workload_file_is_a_clear_error(tmp_path):
    from ratedeck.config import ConfigError

    path = tmp_path / "work.jsonl"
    path.write_text('{"_pool": "nope"}\n')
    cfg = load_config(preset="study", overrides={"workload": {"file": str(path)}, "pools": {"read": 2}})
    with pytest.raises(ConfigError, match="line 1.*nope.*read"):
        Engine(cfg, ScriptedTransport(lambda k, t: (oc.OK, None)))
