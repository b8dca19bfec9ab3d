"""An endpoint's health in a pool (engine/path/health.py), as a table of answers on a fake clock."""

from __future__ import annotations

import math

from ratedeck.core.vocab import EventKind, OutcomeKind
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.path.health import DOWN_AFTER, FIRST_DOWN_S, MAX_DOWN_S, EndpointHealth

REFUSED = Outcome(OutcomeKind.CONNECTION, error="connection refused")
TIMED_OUT = Outcome(OutcomeKind.TIMEOUT)
HTTP_503 = Outcome(OutcomeKind.SERVER_ERROR, 503)
OK = Outcome(OutcomeKind.OK, 200)
LIMITED = Outcome(OutcomeKind.RATE_LIMITED, 429)
BAD = Outcome(OutcomeKind.CLIENT_ERROR, 400)


class Events:
    def __init__(self) -> None:
        self.lines: list[tuple[EventKind, str]] = []

    def event(self, kind: EventKind, text: str) -> None:
        self.lines.append((kind, text))


def health() -> tuple[EndpointHealth, Events, list[int]]:
    events, woken = Events(), []
    return EndpointHealth("east", events, lambda: woken.append(1)), events, woken


def test_a_run_of_failures_takes_the_endpoint_out_and_its_gate_closes_for_the_first_spell():
    h, events, woken = health()
    for _ in range(DOWN_AFTER - 1):
        h.answered(REFUSED, 10.0)
    assert h.state == "up" and h.gate.open_at == 0.0
    h.answered(TIMED_OUT, 10.0)
    assert h.state == "down" and h.gate.open_at == 10.0 + FIRST_DOWN_S
    assert "3 attempts in a row failed (the last: timeout)" in h.reason
    assert (
        events.lines[-1][0] is EventKind.COOLDOWN and "endpoint east: out of the pool" in events.lines[-1][1]
    )
    assert woken and h.downs == 1


def test_any_answer_between_failures_keeps_it_in_the_pool():
    h, _, _ = health()
    for outcome in (REFUSED, HTTP_503, LIMITED, REFUSED, HTTP_503, BAD, REFUSED, REFUSED):
        h.answered(outcome, 1.0)
    assert h.state == "up" and h.downs == 0  # a 429 or a 400 is an answer: the endpoint is there


def test_after_the_spell_one_probe_goes_and_the_others_wait_for_it():
    h, _, _ = health()
    for _ in range(DOWN_AFTER):
        h.answered(REFUSED, 0.0)
    h.sent(FIRST_DOWN_S)  # the first send once the gate opened
    assert h.state == "probing" and h.gate.open_at == math.inf  # held: nothing else goes
    h.sent(FIRST_DOWN_S)
    assert h.gate.open_at == math.inf


def test_a_probe_answered_brings_it_back_and_wakes_its_keys():
    h, events, woken = health()
    for _ in range(DOWN_AFTER):
        h.answered(REFUSED, 0.0)
    h.sent(5.0)
    woken.clear()
    h.answered(OK, 5.2)
    assert h.state == "up" and h.gate.open_at <= 5.2 and not h.reason
    assert woken and "back in the pool" in events.lines[-1][1]
    for _ in range(DOWN_AFTER):  # out again later: the first spell again, not a doubled one
        h.answered(REFUSED, 20.0)
    assert h.gate.open_at == 20.0 + FIRST_DOWN_S


def test_each_failed_probe_doubles_the_spell_up_to_the_cap():
    h, _, _ = health()
    for _ in range(DOWN_AFTER):
        h.answered(REFUSED, 0.0)
    spells, now = [], 0.0
    for _ in range(6):
        now = h.gate.open_at if h.gate.open_at < math.inf else now
        h.sent(now)
        h.answered(REFUSED, now)
        spells.append(h.gate.open_at - now)
    assert spells == [10.0, 20.0, 40.0, MAX_DOWN_S, MAX_DOWN_S, MAX_DOWN_S]
    assert "the probe failed (connection)" in h.reason


def test_failures_while_out_do_not_extend_the_spell():
    h, _, _ = health()
    for _ in range(DOWN_AFTER):
        h.answered(REFUSED, 0.0)
    for _ in range(20):  # the rest of what was in flight when it died
        h.answered(REFUSED, 1.0)
    assert h.gate.open_at == FIRST_DOWN_S and h.downs == 1
