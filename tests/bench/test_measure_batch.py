"""bench/measure_batch.py, small: the measurement still runs and checks what it reports."""

from __future__ import annotations

import asyncio

import pytest

from ratedeck.bench.measure_batch import batch_lines, measure

pytestmark = pytest.mark.slow


def test_the_lines_are_openai_batch_input_lines():
    lines = batch_lines(3)
    assert [x["custom_id"] for x in lines] == ["request-0", "request-1", "request-2"]
    assert all(set(x) == {"custom_id", "method", "url", "body"} for x in lines)


def test_a_small_batch_through_the_cli_is_answered_once_per_custom_id():
    r = asyncio.run(measure(40, latency=0.05))
    assert r["exit"] == 0, r["stderr"]
    assert r["lines"] == 40 and r["exactly_once"] and r["duplicates"] == 0 and r["errors"] == 0
    assert 0 < r["used"] <= r["capacity"]
