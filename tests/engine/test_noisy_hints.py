"""Reading server time and remaining counts from answers, and judging them against
the round trip: a hint is used only when it fits, and never clamped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratedeck.engine.http.delays import answer_hints, remaining_count, server_time_s, server_timing_s
from ratedeck.engine.limits.headroom import hint_fits, network_rtt


@pytest.mark.parametrize(
    "header, seconds",
    [
        ("app;dur=12.5", 0.0125),
        ("db;dur=3, app;dur=50", 0.050),  # the largest: metrics may nest, a sum could count twice
        ('total;dur=80;desc="all", db;dur=50', 0.080),
        ('cache;desc="hit", app;dur=7', 0.007),
        ("app;dur=-5", None),
        ("app;dur=abc", None),
        ("app;dur=nan", None),
        ("app;dur=1e400", None),
        ("app", None),
        ('cache;desc="dur=5"', None),
        ("", None),
        (None, None),
        ("app;dur=4000000", None),  # over an hour: not believed
        # W3C: a parameter's value is a token or a quoted-string; browsers read both
        ('app;dur="53.2"', 0.0532),
        ('app; dur = "53.2"', 0.0532),
        ('app;desc="x;dur=99";dur="40"', 0.040),
        ("app;dur=1;dur=90", 0.001),  # a repeated parameter is ignored: the first counts
        ('app;dur=""', None),
        ('app;dur="53', None),
        ("app;dur", None),
    ],
)
def test_server_timing_takes_the_largest_usable_dur(header, seconds):
    got = server_timing_s(header)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(
    "headers, seconds",
    [
        ({"X-Response-Time": "12.3ms"}, 0.0123),
        ({"X-Response-Time": "12.3"}, 0.0123),
        ({"X-Response-Time": "0.5s"}, 0.5),
        ({"X-Runtime": "0.020"}, 0.020),
        ({"X-Envoy-Upstream-Service-Time": "7"}, 0.007),
        ({"openai-processing-ms": "412"}, 0.412),
        ({"openai-processing-ms": "412", "Server-Timing": "app;dur=5"}, 0.412),
        ({"X-Runtime": "0.02", "Server-Timing": "app;dur=5"}, 0.02),
        ({"X-Runtime": "-1", "Server-Timing": "app;dur=5"}, 0.005),
        ({"X-Response-Time": "soon"}, None),
        ({}, None),
    ],
)
def test_server_time_reads_every_known_hint(headers, seconds):
    got = server_time_s(headers)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize(
    "headers, count",
    [
        ({"X-RateLimit-Remaining": "3"}, 3),
        ({"RateLimit-Remaining": "0"}, 0),
        ({"RateLimit": '"a";r=2;t=1, "b";r=5;t=9'}, 2),
        ({"X-RateLimit-Remaining": "-1"}, None),
        ({"X-RateLimit-Remaining": "2.5"}, None),
        ({"X-RateLimit-Remaining": "many"}, None),
        ({}, None),
    ],
)
def test_remaining_count(headers, count):
    assert remaining_count(headers) == count


class Hostile:
    def get(self, name, default=None):
        raise RuntimeError("no headers for you")


def test_answer_hints_never_raise():
    assert answer_hints(Hostile()) == (None, None)


@given(st.text(max_size=300))
def test_any_header_text_gives_a_usable_span_or_none(text):
    for value in (server_timing_s(text), server_time_s({"X-Response-Time": text, "Server-Timing": text})):
        assert value is None or (math.isfinite(value) and 0.0 <= value <= 3600.0)


@pytest.mark.parametrize(
    "rtt, server, net",
    [
        (0.100, 0.040, 0.060),
        (0.100, 0.0, 0.100),
        (0.100, 0.100, 0.0),
        (0.100, -0.010, 0.100),  # negative: ignored, whole round trip
        (0.100, 0.150, 0.100),  # larger than the round trip: ignored, not clamped to 0
        (0.100, math.nan, 0.100),
        (0.100, math.inf, 0.100),
        (0.100, None, 0.100),
    ],
)
def test_a_hint_counts_only_when_it_fits_the_round_trip(rtt, server, net):
    assert network_rtt(rtt, server) == pytest.approx(net)
    assert hint_fits(rtt, server) == (net < rtt or server == 0.0)


@given(
    st.floats(min_value=0.0, max_value=10.0),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_the_network_share_is_never_negative_nor_more_than_the_round_trip(rtt, server):
    net = network_rtt(rtt, server)
    assert 0.0 <= net <= rtt
