"""The bench's baseline limiters (the study's two client designs) on a fake clock."""

import pytest

from ratedeck.bench.limiters import AdaptiveRing, FixedIntervalRing


def poll_grants(lim: FixedIntervalRing, count: int, start_ms: float = 0.0, step_ms: float = 1.0):
    """Drive the original's polling loop: check every `step_ms`, send when ready."""
    t, grants = start_ms, []
    while len(grants) < count:
        if lim.ready(t):
            lim.take(t)
            grants.append(t)
        t += step_ms
    return grants


def max_in_closed_window(times, window_ms):
    """The most sends in any closed window [t, t + window], as the study's server counts."""
    return max(sum(1 for u in times if t <= u <= t + window_ms) for t in times)


def test_fixed_interval_is_strict():
    lim = FixedIntervalRing(limit=20, window_ms=1000, min_interval_ms=50)
    lim.take(100.0)
    assert not lim.ready(150.0)  # exactly the interval: still too soon
    assert lim.ready(151.0)


def test_ring_blocks_the_send_a_full_window_after_the_oldest():
    lim = FixedIntervalRing(limit=3, window_ms=1000, min_interval_ms=10)
    for t in (0.0, 11.0, 22.0):
        lim.take(t)
    assert not lim.ready(500.0)
    assert not lim.ready(1000.0)  # strictly more than a window since the oldest
    assert lim.ready(1001.0)
    lim.take(1001.0)
    assert not lim.ready(1011.0)  # the interval binds: 10 ms since the last send
    assert lim.ready(1012.0)  # both hold: 11 ms since the last, 1001 ms since the oldest (11)


def test_original_polling_paces_at_the_interval_and_never_overfills_a_window():
    lim = FixedIntervalRing(limit=20, window_ms=1000, min_interval_ms=50)
    grants = poll_grants(lim, 100)
    gaps = [b - a for a, b in zip(grants, grants[1:], strict=False)]
    # 1 ms polling and a strict check: a send every 51 ms
    assert min(gaps) == pytest.approx(51.0)
    assert max_in_closed_window(grants, 1000.0) <= 20


def test_ring_alone_binds_when_the_interval_is_short():
    lim = FixedIntervalRing(limit=5, window_ms=1000, min_interval_ms=1)
    grants = poll_grants(lim, 10)
    assert grants[:5] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert grants[5] == 1001.0  # the sixth waits until the first leaves the window
    assert max_in_closed_window(grants, 1000.0) <= 5


def test_adaptive_buffer_follows_average_latency_within_30_to_50_ms():
    lim = AdaptiveRing()
    assert lim.buffer_ms == 40  # the study's starting value
    for _ in range(100):
        lim.record_latency(10.0)
    assert lim.buffer_ms == 30  # 11 ms, clamped up
    for _ in range(100):
        lim.record_latency(40.0)
    assert lim.buffer_ms == 44  # 40 x 1.1
    for _ in range(100):
        lim.record_latency(200.0)
    assert lim.buffer_ms == 50  # clamped down


def test_adaptive_ring_waits_a_window_plus_buffer_after_the_oldest():
    lim = AdaptiveRing(limit=20, window_ms=1000)
    for _ in range(20):
        assert lim.wait_ms(0.0) == 0.0
        lim.take(0.0)
    assert lim.wait_ms(500.0) == pytest.approx(540.0)
    assert lim.wait_ms(1040.0) > 0  # strict, like the server's check
    assert lim.wait_ms(1040.5) == 0.0


def test_adaptive_ring_has_no_fixed_interval():
    lim = AdaptiveRing(limit=20, window_ms=1000)
    lim.take(0.0)
    assert lim.wait_ms(0.0) == 0.0  # a second send at once is fine while the ring has room
