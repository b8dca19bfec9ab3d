"""Sends told to Redis (`RedisShared.sent`): a sliding window counts a granted send from its real time.

A grant counts each lease over `[s, s + W + h + slack + u)`, since its member
may send up to `slack` late. Once the member says when it sent, the interval
ends at that send's upper bound on Redis's clock plus `W + h`, so the slot
frees that much sooner; a send later than its grant allowed moves nothing.
Then many members that tell their sends: never over the limit, counted on
the intervals as told, and the budget used more fully than its slack allows.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from ratedeck.core.policy import Policy, parse_policy
from ratedeck.engine.ports import Ask
from ratedeck.store.redis_shared import RedisShared
from tests.support.redis_server import pause_between_grants, shared_state

# a real redis-server and wall-clock runs (DESIGN.md: such tests are marked slow)
pytestmark = pytest.mark.slow

W_US = 1_000_000


_shared = shared_state


async def _next_slot_after_two(shared: RedisShared, budget: str, late_s: float | None) -> tuple[int, int]:
    """Two slots of 2/1s with 0.2 s of slack, both told sent `late_s` after their lease (None:
    not told); then one more. Returns (the first slot, the third), on Redis's clock (µs)."""
    policy = (Policy(2, 1.0),)
    first = await shared.lease([Ask(budget, policy)], 2, 0.0, 0.2, 0.0, 0.0, 2.0, 0.0)
    granted = shared.last_grant_us
    assert len(first.times) == 2
    if late_s is not None:
        tickets = first.tickets or ()
        await shared.sent([(ticket, t + late_s) for ticket, t in zip(tickets, first.times, strict=True)])
    third = await shared.lease([Ask(budget, policy)], 1, 0.0, 0.2, 0.0, 0.0, 2.0, 0.0)
    assert len(third.times) == 1
    return granted[0], shared.last_grant_us[0]


def test_a_told_send_frees_its_slot_at_its_real_time_plus_the_window(redis_server):
    async def main():
        shared = _shared(redis_server.url, "sent")
        try:
            untold = await _next_slot_after_two(shared, "host/untold", None)
            told = await _next_slot_after_two(shared, "host/told", 0.0)
            late = await _next_slot_after_two(shared, "host/late", 0.5)  # past its slack
            return untold, told, late, shared.offset.width
        finally:
            await shared.close()

    untold, told, late, u = asyncio.run(main())
    assert u < 0.01  # loopback: the clocks' offset is known within a few ms
    # not told: the slot frees only after the window, the slack and the clocks' uncertainty
    assert untold[1] - untold[0] >= W_US + 200_000
    # told at its lease time: after the window and the clocks' uncertainty, none of the slack
    assert W_US <= told[1] - told[0] <= W_US + 20_000
    # told later than the grant allowed: nothing moves (a told send never counts longer)
    assert late[1] - late[0] >= W_US + 200_000


def _max_occupancy(intervals: list[tuple[int, int]]) -> int:
    """Most intervals [start, end) covering one instant."""
    events = sorted([(s, 1) for s, _e in intervals] + [(e, -1) for _s, e in intervals])
    best = cur = 0
    for _t, d in events:  # an interval ending at t frees before one starting at t (-1 < 1)
        cur += d
        best = max(best, cur)
    return best


async def _member(url: str, seed: int, policy: Policy, slack: float, stop_at: float, told: list) -> None:
    """Asks for leases as fast as it can; says each sent up to 10 ms after its lease; keeps each
    send's counting interval as told: [slot, min(granted end, send's upper bound + W + h))."""
    rng = random.Random(seed)
    shared = _shared(url, "members")
    headroom = rng.uniform(0.0, 0.02)
    window = int(policy.window_s * 1e6)
    try:
        while time.monotonic() < stop_at:
            grant = await shared.lease(
                [Ask("host/k", (policy,))], rng.randint(1, 4), headroom, slack, 0.0, 0.9, 0.5, 0.0
            )
            h_us = int((headroom + slack + shared.offset.width) * 1e6) + 1
            sends = [
                (ticket, t + rng.uniform(0.0, 0.01))
                for ticket, t in zip(grant.tickets or (), grant.times, strict=True)
            ]
            hi = shared.offset.hi
            await shared.sent(sends)
            for slot, (_ticket, at) in zip(shared.last_grant_us, sends, strict=True):
                upper = int((at + hi) * 1e6) + 1
                told.append((slot, min(slot + window + h_us, upper + window + int(headroom * 1e6) + 1)))
            await pause_between_grants(grant, rng)
    finally:
        await shared.close()


def test_members_that_tell_their_sends_stay_within_the_limit_and_use_the_slack(redis_any):
    policy = parse_policy("10/200ms")
    slack = 0.1  # half the window: untold, the budget would go 1 - 0.22 / 0.32 unused
    told: list[tuple[int, int]] = []

    async def main():
        stop_at = time.monotonic() + 2.0
        await asyncio.gather(*(_member(redis_any.url, i, policy, slack, stop_at, told) for i in range(6)))

    asyncio.run(main())
    told.sort()
    assert _max_occupancy(told) <= 10  # never over, counted as told
    span = (told[-1][0] - told[0][0]) / 1e6
    # close to N per (W + h + what a send is late): 1.04-1.10 of N per 0.24 s measured, 0.81
    # when the sends are not told (N per W + h + slack)
    assert len(told) >= 0.93 * span * 10 / 0.24, (len(told), span)
