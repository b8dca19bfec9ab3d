"""The one wait a timer or a poke ends (engine/limits/waker.py), and where its timer is set."""

from __future__ import annotations

import asyncio

import uvloop

from ratedeck.engine.limits.waker import TIMER_GRAIN_S, Waker, timer_grain
from ratedeck.server.simulated import VirtualTimeLoop, run_virtual


def test_a_loop_with_whole_millisecond_timers_gets_them_set_half_a_millisecond_later():
    # uvloop's timers keep whole ms from a clock read at the turn's start: set for the moment
    # itself, about one wake in two came early on a busy loop, and the worker slept again.
    uv = uvloop.new_event_loop()
    plain = asyncio.new_event_loop()
    try:
        assert timer_grain(uv) == TIMER_GRAIN_S == 0.0005
        assert timer_grain(plain) == 0.0  # asyncio's timers keep the loop's float time
        assert timer_grain(VirtualTimeLoop()) == 0.0  # so does the virtual clock (tests exact)
    finally:
        uv.close()
        plain.close()


def test_a_timed_wait_ends_at_its_time_on_the_virtual_clock_and_a_poke_ends_it_sooner():
    async def main():
        loop = asyncio.get_running_loop()
        waker = Waker()
        t0 = loop.time()
        await waker.wait(loop, t0 + 0.25)
        slept = loop.time() - t0
        loop.call_later(0.1, waker.poke)
        t1 = loop.time()
        await waker.wait(loop, t1 + 5.0)
        return slept, loop.time() - t1, waker.waiting

    slept, poked_after, waiting = run_virtual(main())
    assert slept == 0.25  # no grain on a clock that keeps float time
    assert abs(poked_after - 0.1) < 1e-9
    assert not waiting
