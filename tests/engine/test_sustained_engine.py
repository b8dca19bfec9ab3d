"""The engine scored as an independent server scores it (issue 44), on virtual time.

The issue's jitter row: 5 keys x 20/1s moving window counted at arrival, 5..45 ms each way,
20..80 ms of server time, 60 s, offered the whole capacity. The figure is the sustained
efficiency from the simulator's own accept stamps (`RateRules.arrivals_ms`): per key, W / the
mean gap between accepted arrivals i and i+N, then the mean over the keys.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratedeck.bench.sustained import run_sustained, sustained_efficiency
from ratedeck.config import load_config
from ratedeck.core.policy import Policy
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import standard_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual

LIMIT, WINDOW_S, SECONDS = 20, 1.0, 60.0


def _run(
    server_timing: bool,
    seed: int = 1,
    latency_ms=(5, 45),
    slow_start: bool = False,
    seconds: float = SECONDS,
    told: int | None = None,
    server: dict | None = None,
):
    """The issue's jitter row (5 keys x 20/1s, `latency_ms` each way, 20..80 ms of server time,
    no headers), offered the capacity. `told`: the keys are told that limit per second and
    offered it; `server`: more of the simulator's settings."""
    settings = replace(
        standard_settings(),
        latency_in_ms=latency_ms,
        latency_out_ms=latency_ms,
        processing_ms=(20, 80),
        ratelimit_headers=False,
        retry_after=False,
        server_timing=server_timing,
        **(server or {}),
    )
    keys: dict = {"secrets": list(settings.keys)}
    if told is not None:
        keys["limits"] = [f"{told}/1s"]
    per_key = told if told is not None else settings.policies[0].limit
    cfg = load_config(
        preset="study",
        overrides={
            "target": {"nonce_param": ""},
            "keys": keys,
            "engine": {"graveyard_path": "", "slow_start": slow_start, "max_attempts": 20},
            # offered at capacity: the figure measures the client
            "workload": {"rate": float(len(settings.keys) * per_key)},
            "run": {"seed": seed},
        },
    )
    transport = SimulatedTransport(settings, seed=seed)
    snap = run_virtual(Engine(cfg, transport).run(seconds))
    return snap, transport.rules


# Measured at the time of writing, seeds 1..3: with Server-Timing 0.9625-0.9632 (the issue's
# target for its live row is >= 0.955; 0.9610-0.9618 while the pace kept 0.9 of its even gap
# with the server's time bounding each slot, `MEASURED_PACE`; 0.9596-0.9603 while the first guess
# held the slots answered in the first 2 s, HeadroomController._rebound; 0.957 when the even
# pace held back a slot that freed soon after another, WindowLimiter's pace_slack), no hints
# 0.930-0.932; the bounds sit just under.
@pytest.mark.parametrize(("server_timing", "least"), [(True, 0.962), (False, 0.925)])
def test_sustained_efficiency_from_the_simulators_stamps(server_timing, least):
    snap, rules = _run(server_timing)
    stamps = [[t / 1000.0 for t in key] for key in rules.arrivals_ms()]
    assert rules.arrivals_dropped == 0
    assert sum(map(len, stamps)) == rules.stats()["totals"]["accepted"]
    run = run_sustained(stamps, LIMIT, WINDOW_S)
    assert run.scored == len(stamps) == 5
    assert run.mean is not None and least <= run.mean <= 1.0, run.by_key
    assert snap.rejected_429 == 0
    # The engine paces from the first request and takes no free burst, so accepted / capacity
    # reads the same here (0.958 against 0.9575 with Server-Timing); a client that bursts
    # is where the two part (tests/bench/test_sustained.py).
    assert abs(snap.succeeded / (5 * LIMIT * SECONDS / WINDOW_S) - run.mean) < 0.01
    # The server's own pooled figure over every pair (`share()["all"]`) is the same measure.
    assert run.mean == pytest.approx(rules.share()["all"], abs=0.002)
    # Each key's figure is the pure function's on its own stamps.
    assert run.by_key[0] == sustained_efficiency(stamps[0], LIMIT, WINDOW_S)


def test_a_slow_start_on_a_told_limit_that_was_right_costs_little():
    # The steady row (100..104 ms each way, Server-Timing) as a run on a named target
    # runs it: with the engine's default slow start, which trusts the told 20/1s only as far
    # as the server accepts it. Each level beyond what it trusts at once costs a round trip
    # (about 250 ms here) of waiting. Measured at the time of writing, seeds 1-3: 0.9909-0.9911
    # (0.9877-0.9885 while the pace kept 0.9 of its even gap with the server's time bounding
    # each slot, `MEASURED_PACE`; 0.985 with a strict even pace; 0.972 when it trusted half the
    # told limit and the sends a probe's wait held back went at the even pace, one level a window).
    snap, rules = _run(True, latency_ms=(100, 104), slow_start=True)
    stamps = [[t / 1000.0 for t in key] for key in rules.arrivals_ms()]
    run = run_sustained(stamps, LIMIT, WINDOW_S)
    assert run.mean is not None and run.mean >= 0.990, run.by_key
    assert snap.rejected_429 == 0


def _run_told(told: int, allowed: int, seconds: float, escalation: bool = False):
    """3 keys told `told`/1s where the server allows `allowed`/1s, no hints, the engine's
    default slow start, offered the told capacity."""
    server = {
        "keys": tuple(f"key-{i:03d}" for i in range(3)),
        "policies": (Policy(allowed, WINDOW_S),),
        "escalation": escalation,
    }
    return _run(False, slow_start=True, seconds=seconds, told=told, server=server)


def test_a_server_that_lengthens_its_penalty_for_every_request_sent_into_it_gets_one():
    # Told 100/1s where the server allows 80, says no Retry-After, and holds a key that drew
    # a 429 for a second, twice as long for each request sent during it (up to 16 s). The
    # slow start's probe draws the first 429; the send after it goes alone and draws the
    # second (the server's penalty); the key then sits out two windows, and is through.
    # Before: 268 429s, 265 of them into the penalty, and 508 accepted (3 keys, 12 s); at
    # the time of writing 10, 7 and 1,446.
    snap, rules = _run_told(100, 80, 12.0, escalation=True)
    totals = rules.stats()["totals"]
    assert snap.rejected_429 <= 3 * 4
    assert totals["requests_during_cooldown"] <= 3 * 3
    assert snap.succeeded >= 1_300


def test_a_key_cools_off_only_where_429s_come_in_a_row():
    # The same told-wrong limit on a server that does not escalate: the probe's 429 lowers the
    # estimate and the send after it goes through; nothing waits out a penalty.
    snap, rules = _run_told(100, 80, 12.0)
    assert snap.rejected_429 <= 3 * 2
    assert snap.succeeded >= 2_600
