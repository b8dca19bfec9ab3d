"""bench/measure_teams.py's `priority` and `shares` cases, shortened to 12 s each, in-process
(the OpenAI stub, a `GatewayService` with `[[gateway.clients]]`, the official SDK).

Loosened from the issue's targets, as a 12 s run allows:
- priority: the tokens are judged from 3 s in (a quarter of the run) instead of 5 s; the
  interactive client's slowest answer within 3 s instead of 1.2 s (the client, the gateway
  and the stub share one process here, beside other tests on a shared CI box: the first
  interactive call goes while 200 SDK calls are being made, and once took 1.57 s in CI;
  behind the batch client's backlog, without priority, it would wait ~9 s). The issue's
  1.2 s is judged by the full-length bench (`measure_teams priority`, docs/measurements.md).
  The errors and the 429s keep the issue's targets.
- shares: the answers are counted from 4 s to 11 s (the full buckets' burst is over by
  then) with 60,000 TPM per key (twice the case's) so the window holds ~70 answers; each
  share within 0.08 of 0.25 and 0.75 instead of 0.05 (one answer moves a share by ~0.015).
"""

import asyncio

import pytest

from ratedeck.bench.measure_teams import run_priority, run_shares, sliding_max


@pytest.mark.slow
def test_an_interactive_client_beside_a_batch_client_waits_little_and_the_tokens_are_used():
    r = asyncio.run(asyncio.wait_for(run_priority(12.0), 90))
    n = r.numbers
    assert n["interactive_answers"] >= 18, r.table()  # 2 a second for 11 s
    assert n["interactive_max_s"] <= 3.0, r.table()
    assert n["interactive_p50_s"] <= 0.8, r.table()  # the stub alone takes 0.3 s
    assert not n["interactive_errors"] and not n["batch_errors"], r.table()
    assert n["batch_left_waiting"] == 200, r.table()  # the batch client held 200 to the end
    assert n["share"] >= 0.90, r.table()
    assert n["stub_429s"] <= 3, r.table()


@pytest.mark.slow
def test_two_clients_of_weights_1_and_3_get_a_quarter_and_three_quarters():
    r = asyncio.run(asyncio.wait_for(run_shares(12.0, tpm=60_000, window=(4.0, 11.0)), 90))
    n = r.numbers
    counted = n["answers_in_window"]
    assert sum(counted.values()) >= 40, r.table()
    assert abs(n["shares"]["light"] - 0.25) <= 0.08, r.table()
    assert abs(n["shares"]["heavy"] - 0.75) <= 0.08, r.table()
    assert not n["errors"] and n["stub_429s"] <= 3, r.table()


def test_the_sliding_window_max_steps_by_each_record():
    # 60 s windows starting at each record: [0, 60) holds 100 + 50, [30, 90) holds 50 + 70 + 10
    records = [(0.0, 100.0), (30.0, 50.0), (61.0, 70.0), (89.9, 10.0), (90.0, 500.0)]
    assert sliding_max(records[:4], 60.0) == (150.0, 0.0)
    assert sliding_max(records, 60.0) == (580.0, 61.0)
    assert sliding_max([], 60.0)[0] == 0.0
