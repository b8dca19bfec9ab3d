"""The Redis grant script against a real redis-server: many members, one budget, never over.

Each member is its own connection asking for leases as fast as it can, with
its own headroom; every grant is stamped by Redis's clock (`TIME`), and the
audit replays them all: at most N in any window (sliding), per window
(fixed), in the bucket.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from ratedeck.core.policy import Policy, parse_policy
from ratedeck.engine.cluster.member import LeasedSlots
from ratedeck.engine.ports import Ask
from ratedeck.store.redis_shared import RedisShared
from tests.support.redis_server import pause_between_grants

# a real redis-server and wall-clock runs (DESIGN.md: such tests are marked slow)
pytestmark = pytest.mark.slow

SLACK_S = 0.004


async def _member(url: str, seed: int, policies, stop_at: float, grants: list, ns: str) -> int:
    rng = random.Random(seed)
    shared = RedisShared(url, namespace=ns)
    shared.bind(time.monotonic)
    headroom = rng.uniform(0.0, 0.02)  # each member its own headroom
    calls = 0
    try:
        while time.monotonic() < stop_at:
            grant = await shared.lease(
                [Ask("host0/k", tuple(policies))],
                rng.randint(1, 5),
                headroom,
                SLACK_S,
                headroom,
                0.9,
                0.3,
                0.0,
            )
            calls += 1
            h_us = int((headroom + SLACK_S) * 1e6)
            grants.extend((t, h_us, seed) for t in shared.last_grant_us)
            await pause_between_grants(grant, rng)
    finally:
        await shared.close()
    return calls


def _run_members(url: str, policies: list[Policy], members: int = 8, seconds: float = 1.5) -> list:
    grants: list = []

    async def main():
        stop_at = time.monotonic() + seconds
        return await asyncio.gather(
            *(_member(url, i, policies, stop_at, grants, "grants") for i in range(members))
        )

    calls = asyncio.run(main())
    assert all(c > 3 for c in calls), calls  # every member took part
    return sorted(grants)


def _max_in_sliding(times: list[int], window_us: int) -> int:
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window_us:
            j += 1
        best = max(best, i - j + 1)
    return best


def _max_occupancy(grants: list, window_us: int) -> int:
    """Most grants whose counting interval [t, t + W + h) covers one instant."""
    events = []
    for t, h_us, _m in grants:
        events.append((t, 1))
        events.append((t + window_us + h_us, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an interval ending at t frees before one starting at t
    best = cur = 0
    for _t, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_sliding_window_never_exceeded_by_many_members(redis_any):
    grants = _run_members(redis_any.url, [parse_policy("10/200ms")])
    times = [t for t, _h, _m in grants]
    assert len(times) >= 40  # 1.5 s of 10/200ms: the budget was really contended
    assert len({m for _t, _h, m in grants}) >= 4  # shared out, not one member's
    assert _max_in_sliding(times, 200_000) <= 10
    assert _max_occupancy(grants, 200_000) <= 10  # with each member's headroom too
    # the budget was used, not starved: close to N per (W + h) over the run
    span = (times[-1] - times[0]) / 1e6
    assert len(times) >= 0.8 * span * 10 / 0.224


def test_several_policies_together(redis_any):
    policies = [parse_policy("10/200ms"), parse_policy("30/1s fixed"), parse_policy("6@20/s")]
    grants = _run_members(redis_any.url, policies)
    times = [t for t, _h, _m in grants]
    assert _max_in_sliding(times, 200_000) <= 10
    per_window: dict[int, int] = {}
    for t in times:
        per_window[t // 1_000_000] = per_window.get(t // 1_000_000, 0) + 1
    assert max(per_window.values()) <= 30
    # the bucket: 6 deep, draining 20/s, never overflows
    level, at = 0.0, None
    for t in times:
        if at is not None:
            level = max(0.0, level - 20 * (t - at) / 1e6)
        level, at = level + 1, t
        assert level <= 6 + 1e-9


def test_fixed_window_counts_sends_near_a_boundary_in_both(redis_server):
    grants = _run_members(redis_server.url, [parse_policy("8/250ms fixed")], members=5, seconds=1.2)
    counts: dict[int, int] = {}
    for t, h_us, _m in grants:
        for w in range((t - h_us) // 250_000, (t + h_us) // 250_000 + 1):
            counts[w] = counts.get(w, 0) + 1
    assert max(counts.values()) <= 8


def test_a_cost_above_the_limit_is_refused_not_granted(redis_server):
    from ratedeck.engine.cluster.member import StoreUnavailable

    async def main():
        shared = RedisShared(redis_server.url, namespace="refuse")
        shared.bind(time.monotonic)
        try:
            await shared.lease([Ask("k", (Policy(1, 1.0),))], 2, 0.0, SLACK_S, 0.0, 1.0, 0.3, 0.0)
            return None
        except StoreUnavailable as exc:
            return str(exc)
        finally:
            await shared.close()

    # a lease is one unit: this budget of 1 grants one at a time, never two in a window
    assert asyncio.run(main()) is None
    grants = _run_members(redis_server.url, [Policy(1, 0.1)], members=3, seconds=0.8)
    assert _max_in_sliding([t for t, _h, _m in grants], 100_000) <= 1


def test_grant_times_map_to_the_members_clock_never_early(redis_server):
    """A lease's loop time, seen on Redis's clock, is never before the slot granted."""

    async def main():
        shared = RedisShared(redis_server.url, namespace="clock")
        shared.bind(time.monotonic)
        try:
            grant = await shared.lease([Ask("k", (Policy(50, 1.0),))], 5, 0.0, SLACK_S, 0.0, 0.9, 0.3, 0.0)
            raw = shared.last_grant_us
            return grant, raw, shared.offset
        finally:
            await shared.close()

    grant, raw, offset = asyncio.run(main())
    assert len(grant.times) == 5
    for local, t_us in zip(grant.times, raw, strict=True):
        # the true offset lies in [lo, hi]: sending at `local` is at or after t on Redis's clock
        assert local + offset.lo >= t_us / 1e6 - 1e-6
    assert 0 <= offset.width < 0.05


def test_leased_slots_drop_what_is_too_late_to_use():
    from ratedeck.engine.cluster.member import Grant

    slots = LeasedSlots()
    slots.add(Grant((1.0, 1.1, 1.2), usable_s=0.004))
    assert slots.next_at(0.5) == 1.0
    assert slots.next_at(1.003) == 1.0  # still usable
    assert slots.next_at(1.05) == 1.1  # the first went stale: dropped, never used late
    assert slots.dropped == 1
    slots.take(1.1)
    assert slots.used == 1 and len(slots) == 1
    slots.clear()
    assert slots.next_at(0.0) == float("inf") and slots.dropped == 2
