"""The engine end to end on virtual time against the simulator's own rules."""

import asyncio
import json
from dataclasses import replace

import pytest

from ratedeck.core.policy import Policy
from ratedeck.engine.commands import (
    PauseAll,
    PauseKey,
    ResumeAll,
    ResumeKey,
    SetArrivalRate,
    SetBackpressure,
    SetHeadroom,
)
from ratedeck.engine.engine import UnknownKey
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import audit_max, seed_engine


def test_seed_mode_reaches_92_per_second_with_no_rejection():
    engine, transport = seed_engine(workload={"rate": 100.0})  # offered at capacity (the demo offers 90)

    async def main():
        return await engine.run(60)

    snap = run_virtual(main())
    stats = transport.rules.stats()
    assert snap.throughput_tps >= 92.0
    assert snap.rejected_429 == 0 and snap.rejected_other == 0
    assert stats["totals"]["rejected_429"] == 0 and stats["totals"]["rejected_nonce"] == 0
    assert audit_max(stats) <= 20
    assert snap.balance() == 0


@pytest.mark.parametrize("extra_ms", [(0, 40), (0, 120)])
def test_extra_network_delay_never_exceeds_the_server_limit(extra_ms):
    # Extra random delay on both legs: the headroom must learn the wider spread.
    engine, transport = seed_engine(
        transport_kw={"extra_in_ms": extra_ms, "extra_out_ms": extra_ms, "seed": 9}
    )
    snap = run_virtual(engine.run(60))
    stats = transport.rules.stats()
    assert audit_max(stats) <= 20
    assert stats["totals"]["rejected_429"] == 0, stats["totals"]
    assert snap.headroom_ms > 50  # wider than for the plain seed server
    # Jitter beyond the send gap reorders nonces in the network: those attempts
    # are rejected by the server, retried, and none is lost.
    assert snap.retried + snap.expired >= snap.rejected_other
    assert snap.balance() == 0 and snap.graveyard == 0
    assert snap.throughput_tps > 65


def test_requests_balance_at_every_snapshot_under_injected_faults(tmp_path):
    engine, transport = seed_engine(
        tmp_path, transport_kw={"fail_every": 7}, engine={"max_attempts": 2, "ttl_s": 1.0}
    )
    balances = []

    async def main():
        engine.start()
        for _ in range(300):
            await asyncio.sleep(0.05)
            balances.append(engine.snapshot().balance())
        return await engine.stop()

    snap = run_virtual(main())
    assert snap.failed > 0 and snap.graveyard > 0  # the faults did bite
    assert set(balances) == {0}
    assert snap.balance() == 0
    assert snap.generated == (
        snap.succeeded
        + snap.expired
        + snap.graveyard
        + snap.shed
        + snap.main_depth
        + snap.dlq_depth
        + snap.in_flight
    )
    lines = (tmp_path / "graveyard.jsonl").read_text().splitlines()
    assert len(lines) == snap.graveyard
    first = json.loads(lines[0])
    assert first["attempts"] == 2 and first["last_error"] == "timed out"


def test_a_request_past_its_ttl_is_never_sent():
    engine, transport = seed_engine(engine={"ttl_s": 0.5})

    async def main():
        engine.start()
        engine.apply(PauseAll())
        await asyncio.sleep(2.0)
        paused = engine.snapshot()
        engine.apply(ResumeAll())
        await asyncio.sleep(1.0)
        return paused, await engine.stop()

    paused, snap = run_virtual(main())
    assert paused.sent == 0 and paused.expired > 0
    assert transport.attempts == snap.sent
    assert snap.expired >= paused.expired and snap.balance() == 0


def test_backpressure_on_bounds_the_queue_off_lets_it_swell_and_expire():
    engine, _ = seed_engine(engine={"queue_max": 30}, workload={"rate": 300.0})

    async def main():
        engine.start()
        await asyncio.sleep(5)
        on = engine.snapshot()
        engine.apply(SetBackpressure(False))
        await asyncio.sleep(5)
        off = engine.snapshot()
        return on, off, await engine.stop()

    on, off, end = run_virtual(main())
    assert on.main_peak <= 30 and on.expired == 0
    assert off.main_depth > 100 and off.expired > on.expired
    assert end.balance() == 0


def test_pausing_a_key_stops_its_sends_and_resuming_restarts_them():
    engine, _ = seed_engine()

    async def main():
        engine.start()
        await asyncio.sleep(2)
        engine.apply(PauseKey("k2"))
        await asyncio.sleep(0.2)  # let in-flight attempts of k2 come back
        before = {k.label: k.sent for k in engine.snapshot().keys}
        await asyncio.sleep(3)
        during = engine.snapshot()
        engine.apply(ResumeKey("k2"))
        await asyncio.sleep(2)
        return before, during, await engine.stop()

    before, during, after = run_virtual(main())
    rows = {k.label: k for k in during.keys}
    assert rows["k2"].state == "paused" and rows["k2"].sent == before["k2"]
    assert rows["k1"].sent > before["k1"]
    assert {k.label: k for k in after.keys}["k2"].sent > before["k2"]


def test_retry_after_closes_the_key_gate_and_nothing_is_sent_during_cooldown():
    # The client believes 20/1s; the server allows 10/1s and answers 429 with
    # Retry-After. After each such answer the key must send nothing until it passes.
    server = replace(
        study_settings(),
        mode="standard",
        policies=(Policy(10, 1.0),),
        retry_after=True,
        block_after=0,
        nonce=False,
        whole_ms_stamps=False,
    )
    engine, transport = seed_engine(
        server=server, target={"nonce_param": ""}, engine={"ttl_s": 30.0, "max_attempts": 10}
    )
    states = []

    async def main():
        engine.start()
        for _ in range(40):
            await asyncio.sleep(0.25)
            states.extend(k.state for k in engine.snapshot().keys)
        return await engine.stop()

    snap = run_virtual(main())
    assert snap.rejected_429 > 0 and "cooling" in states and transport.cooldowns
    for key, start, until in transport.cooldowns:
        inside = [t for k, t in transport.sends if k == key and start < t < until]
        assert inside == [], f"sent during a cooldown {start:.3f}..{until:.3f}: {inside[:3]}"
    assert snap.balance() == 0


def test_commands_change_the_running_engine():
    engine, _ = seed_engine()

    async def main():
        engine.start()
        await asyncio.sleep(1)
        engine.apply(SetHeadroom(35))
        a = engine.snapshot()
        engine.apply(SetHeadroom(None))
        engine.apply(SetArrivalRate(10))
        await asyncio.sleep(5)
        b = engine.snapshot()
        with pytest.raises(UnknownKey, match="k9"):
            engine.apply(PauseKey("k9"))
        with pytest.raises(ValueError, match="headroom"):
            engine.apply(SetHeadroom(-1))
        await engine.stop()
        return a, b

    a, b = run_virtual(main())
    assert a.headroom_ms == 35 and not a.headroom_adaptive
    assert b.headroom_adaptive and b.arrival_rate == 10
    assert b.current_tps <= 11
    assert any("headroom fixed at 35" in e.text for e in b.events)


def test_workload_total_ends_the_run_with_every_request_accounted():
    engine, _ = seed_engine(workload={"total": 250})
    snap = run_virtual(engine.run(None))
    assert snap.generated == 250
    assert snap.succeeded + snap.expired + snap.graveyard == 250
    assert snap.main_depth == snap.dlq_depth == snap.in_flight == 0


def test_nonces_reach_the_server_in_order_even_with_several_in_flight():
    engine, transport = seed_engine(engine={"in_flight_per_key": 16})
    snap = run_virtual(engine.run(20))
    assert transport.rules.stats()["totals"]["rejected_nonce"] == 0
    assert snap.rejected_other == 0 and snap.succeeded > 1700


def test_errors_are_grouped_by_status_and_cause_with_the_last_text_per_key(tmp_path):
    from ratedeck.core.vocab import OutcomeKind

    engine, _ = seed_engine(tmp_path, transport_kw={"fail_every": 7}, workload={"total": 140})
    snap = run_virtual(engine.run(10.0))
    timeouts = [row for row in snap.errors if row.kind is OutcomeKind.TIMEOUT]
    assert len(timeouts) == 1 and timeouts[0].status is None and timeouts[0].count == snap.failed
    assert sum(k.errors for k in snap.keys) == sum(row.count for row in snap.errors)
    failing = [k for k in snap.keys if k.errors]
    assert failing and all(k.last_error.startswith("timeout") for k in failing)
    assert snap.balance() == 0


def test_each_key_reports_its_own_last_failed_attempts(tmp_path):
    """The key detail lists a key's own recent errors: newest last, each its own, at most RECENT_ERRORS."""
    from ratedeck.engine.path.worker import RECENT_ERRORS

    engine, _ = seed_engine(tmp_path, transport_kw={"fail_every": 3}, workload={"total": 300})
    snap = run_virtual(engine.run(10.0))
    failing = [k for k in snap.keys if k.errors]
    assert failing
    for row in failing:
        recent = row.recent_errors
        assert 0 < len(recent) <= RECENT_ERRORS and len(recent) == min(row.errors, RECENT_ERRORS)
        assert all(e.last_key == row.label and e.count == 1 for e in recent)
        assert [e.last_at_s for e in recent] == sorted(e.last_at_s for e in recent)
        assert recent[-1].last_text in row.last_error
    assert all(not k.recent_errors for k in snap.keys if not k.errors)


def test_events_print_rates_with_at_most_two_decimals():
    engine, _ = seed_engine(keys={"limits": ["41/75s"]})  # 5 keys of 41/75s: 2.7333.../s in all

    async def main():
        engine.start()
        engine.apply(SetArrivalRate(100 / 11))  # what [ makes of 10/s
        snap = engine.snapshot()
        await engine.stop()
        return snap

    texts = [e.text for e in run_virtual(main()).events]
    assert any(t.endswith("capacity 2.73/s") for t in texts), texts
    assert "arrival rate 9.09/s" in texts, texts
