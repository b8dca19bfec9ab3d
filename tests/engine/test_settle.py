"""settle.decide as a table: each kind of answer, and where the request goes."""

from __future__ import annotations

import pytest

from ratedeck.core.vocab import Ending, OutcomeKind
from ratedeck.engine.http.outcome import Outcome, classify
from ratedeck.engine.path.settle import Scope, SettleRules, Tally, decide, tally_of
from ratedeck.engine.request import Request
from ratedeck.server.simulated import run_virtual

RULES = SettleRules(max_attempts=5, backoff_base_s=0.05, backoff_cap_s=2.0)


def req(attempts: int = 1, deadline: float = 10.0) -> Request:
    r = Request(1, 0.0, deadline)
    r.attempts = attempts
    return r


@pytest.mark.parametrize(
    "outcome, tally, ending, backoff",
    [
        (Outcome(OutcomeKind.OK, 200), Tally.SUCCEEDED, Ending.SUCCEEDED, 0.0),
        (Outcome(OutcomeKind.RATE_LIMITED, 429), Tally.REJECTED_429, None, 0.05),
        (Outcome(OutcomeKind.CLIENT_ERROR, 404), Tally.REJECTED_OTHER, Ending.GRAVEYARD, 0.0),
        (Outcome(OutcomeKind.NONCE, 400), Tally.REJECTED_OTHER, None, 0.0),
        (Outcome(OutcomeKind.BLOCKED, 401), Tally.REJECTED_OTHER, None, 0.0),
        (Outcome(OutcomeKind.BLOCKED, 429), Tally.REJECTED_429, None, 0.0),
        (Outcome(OutcomeKind.SERVER_ERROR, 503), Tally.FAILED, None, 0.05),
        (Outcome(OutcomeKind.TIMEOUT), Tally.FAILED, None, 0.05),
    ],
)
def test_each_kind_of_answer(outcome, tally, ending, backoff):
    v = decide(outcome, req(), RULES, now=1.0)
    assert (v.tally, v.ending, v.backoff_cap_s) == (tally, ending, pytest.approx(backoff))


def test_backoff_doubles_per_attempt_up_to_the_cap():
    caps = [decide(Outcome(OutcomeKind.TIMEOUT), req(n), RULES, 1.0).backoff_cap_s for n in (1, 2, 3, 4)]
    assert caps == pytest.approx([0.05, 0.1, 0.2, 0.4])
    big = SettleRules(max_attempts=50, backoff_base_s=1.0, backoff_cap_s=2.0)
    assert decide(Outcome(OutcomeKind.TIMEOUT), req(10), big, 1.0).backoff_cap_s == 2.0


def test_used_attempts_bury_and_a_passed_deadline_expires():
    assert decide(Outcome(OutcomeKind.TIMEOUT), req(5), RULES, 1.0).ending is Ending.GRAVEYARD
    assert decide(Outcome(OutcomeKind.TIMEOUT), req(2, deadline=0.5), RULES, 1.0).ending is Ending.EXPIRED


def test_a_server_delay_closes_the_key_gate_or_the_host_gate_when_it_names_the_host():
    limited = Outcome(OutcomeKind.RATE_LIMITED, 429, retry_after_s=3.0, error="host limit reached")
    v = decide(limited, req(), RULES, 1.0)
    assert v.cooldown is not None and v.cooldown.scope is Scope.KEY and v.cooldown.delay_s == 3.0
    assert v.widen_headroom
    host_rules = SettleRules(5, 0.05, 2.0, host_gate=True, host_limit_match="host")
    assert decide(limited, req(), host_rules, 1.0).cooldown.scope is Scope.HOST
    # A 503 with Retry-After pauses the key too, and is retried.
    busy = decide(Outcome(OutcomeKind.SERVER_ERROR, 503, retry_after_s=2.0), req(), RULES, 1.0)
    assert busy.cooldown is not None and busy.ending is None and busy.cause == "503"


def test_a_library_caller_gets_errors_at_once_but_rate_limits_are_still_retried():
    lib = SettleRules(5, 0.05, 2.0, retry_errors=False)
    assert decide(Outcome(OutcomeKind.SERVER_ERROR, 500), req(), lib, 1.0).ending is Ending.GRAVEYARD
    blocked = decide(Outcome(OutcomeKind.BLOCKED, 403), req(), lib, 1.0)
    assert blocked.ending is Ending.GRAVEYARD and blocked.block_key
    assert decide(Outcome(OutcomeKind.RATE_LIMITED, 429), req(), lib, 1.0).ending is None


def test_a_400_mentioning_nonce_is_a_nonce_rejection_only_where_the_target_uses_one():
    assert classify(400, '{"error_msg":"invalid nonce"}', uses_nonce=True) is OutcomeKind.NONCE
    assert (
        classify(400, '{"error":"nonce is not a field we know"}', uses_nonce=False)
        is OutcomeKind.CLIENT_ERROR
    )


def test_an_error_while_settling_buries_the_request_with_the_error_named(tmp_path):
    from tests.support.engine_helpers import seed_engine

    engine, _ = seed_engine(tmp_path, workload={"total": 40})

    def broken(*_args):
        raise RuntimeError("outcome handling bug")

    engine.parts.path._settle = broken  # a bug anywhere in outcome handling
    snap = run_virtual(engine.run(5.0))
    assert snap.graveyard == 40 and snap.balance() == 0
    assert dict(snap.failures) == {"internal:RuntimeError": 40}
    assert any("outcome handling bug" in e.text for e in snap.events)


def write(
    kind: OutcomeKind, status: int | None = None, *, keyed: bool, replayed: bool = False, sent: bool = True
):
    """An answer to a POST (a write), with or without an Idempotency-Key."""
    o = Outcome(kind, status, error="connection refused" if not sent else None)
    o.write, o.keyed, o.replayed, o.maybe_sent = True, keyed, replayed, sent
    return o


@pytest.mark.parametrize(
    "outcome, attempts, ending, unsure",
    [
        # no Idempotency-Key: a write that may have happened is never sent again
        (write(OutcomeKind.SERVER_ERROR, 500, keyed=False), 1, Ending.UNCERTAIN, True),
        (write(OutcomeKind.TIMEOUT, keyed=False), 1, Ending.UNCERTAIN, True),
        (write(OutcomeKind.CONNECTION, keyed=False), 1, Ending.UNCERTAIN, True),  # reset after sending
        (write(OutcomeKind.CONNECTION, keyed=False, sent=False), 1, None, False),  # refused: never sent
        (write(OutcomeKind.RATE_LIMITED, 429, keyed=False), 1, None, False),  # refused before the write
        # with one: retried (on the same key) until the attempts are used, then uncertain
        (write(OutcomeKind.SERVER_ERROR, 500, keyed=True), 1, None, True),
        (write(OutcomeKind.TIMEOUT, keyed=True), 4, None, True),
        (write(OutcomeKind.SERVER_ERROR, 500, keyed=True), 5, Ending.UNCERTAIN, True),
        # the server replayed its saved 500: retrying only replays it again
        (write(OutcomeKind.SERVER_ERROR, 500, keyed=True, replayed=True), 2, Ending.UNCERTAIN, True),
        (write(OutcomeKind.CLIENT_ERROR, 400, keyed=True), 1, Ending.GRAVEYARD, False),
    ],
)
def test_a_write_that_may_have_happened_ends_uncertain(outcome, attempts, ending, unsure):
    v = decide(outcome, req(attempts), RULES, now=1.0)
    assert (v.ending, v.unsure) == (ending, unsure)


def test_once_unsure_a_request_never_ends_plainly_failed():
    r = req(5)
    r.unsure = True  # an earlier attempt answered 500 after it may have written
    assert decide(write(OutcomeKind.RATE_LIMITED, 429, keyed=True), r, RULES, 1.0).ending is Ending.UNCERTAIN
    assert decide(write(OutcomeKind.CLIENT_ERROR, 400, keyed=True), r, RULES, 1.0).ending is Ending.UNCERTAIN
    r2 = req(2, deadline=0.5)
    r2.unsure = True
    assert decide(write(OutcomeKind.TIMEOUT, keyed=True), r2, RULES, 1.0).ending is Ending.UNCERTAIN
    # a GET is no write: its 500s are retried anywhere and bury as before
    assert decide(Outcome(OutcomeKind.SERVER_ERROR, 500), req(5), RULES, 1.0).ending is Ending.GRAVEYARD


def _streamed(kind: OutcomeKind, status: int | None = 200) -> Outcome:
    out = Outcome(kind, status, error="the stream broke after the answer began (incomplete body)")
    out.streamed = True
    return out


@pytest.mark.parametrize(
    "kind, status",
    [
        (OutcomeKind.CONNECTION, 200),
        (OutcomeKind.TIMEOUT, 200),
        (OutcomeKind.SERVER_ERROR, 200),  # an error event in the stream
        (OutcomeKind.RATE_LIMITED, 429),  # whatever the kind: the client holds part of an answer
    ],
)
def test_a_stream_broken_after_it_began_is_never_retried(kind, status):
    v = decide(_streamed(kind, status), req(1), RULES, now=1.0)
    assert (v.tally, v.ending, v.cause) == (Tally.FAILED, Ending.GRAVEYARD, "stream broken")
    unsure = req(1)
    unsure.unsure = True  # an earlier attempt may have written: uncertain, as any failure then
    assert decide(_streamed(kind, status), unsure, RULES, now=1.0).ending is Ending.UNCERTAIN


def test_the_same_failure_not_streamed_is_retried():
    out = _streamed(OutcomeKind.CONNECTION)
    out.streamed = False
    assert decide(out, req(1), RULES, now=1.0).ending is None


def test_a_streamed_success_succeeds():
    out = Outcome(OutcomeKind.OK, 200)
    out.streamed = True
    assert decide(out, req(1), RULES, now=1.0).ending is Ending.SUCCEEDED


def test_a_live_client_gone_mid_answer_sheds_the_request():
    r = req(1)
    r.answer = object()  # any sink: decide never calls it
    r.cancelled = True
    for streamed in (False, True):  # gone at begin, or after some of the answer
        out = Outcome(OutcomeKind.CONNECTION, 200, error="its client went away")
        out.streamed = streamed
        v = decide(out, r, RULES, now=1.0)
        assert (v.ending, v.cause) == (Ending.SHED, "client gone")


def test_a_cancelled_library_call_keeps_the_usual_rules():
    r = req(1)
    r.cancelled = True  # no live client: it is retried, and the worker sheds it when popped
    assert decide(Outcome(OutcomeKind.TIMEOUT), r, RULES, now=1.0).ending is None


# -- what the key knew: pinning, stranding, the headroom's veto


def facts(
    label: str, refused: bool = False, explains: bool = False, cool_s: float = 0.0
) -> tuple[str, bool, bool, float]:
    """decide's last four arguments: the key's label, refused already, its limit explains a 429,
    how long it sits out for 429s in a row."""
    return label, refused, explains, cool_s


def keyed_500() -> Outcome:
    """A 500 to a write with an Idempotency-Key that may have reached the server: retried on its key."""
    o = Outcome(OutcomeKind.SERVER_ERROR, 500)
    o.write, o.keyed, o.maybe_sent = True, True, True
    return o


def pinned(to: str | None, unsure: bool = False) -> Request:
    r = req()
    r.pin, r.unsure = to, unsure
    return r


@pytest.mark.parametrize(
    "outcome, request_, key, pin, ending",
    [
        # an Idempotency-Key's first answer pins the request to the key that sent it
        (keyed_500(), pinned(None), facts("k1"), "k1", None),
        # pinned already: it stays where it is, nothing to pin again
        (keyed_500(), pinned("k1"), facts("k1"), None, None),
        # a plain retry of an unpinned request is not pinned
        (Outcome(OutcomeKind.SERVER_ERROR, 503), pinned(None), facts("k1"), None, None),
        # its key was refused for good before the answer: stranded, uncertain (it may have written)
        (keyed_500(), pinned("k1"), facts("k1", refused=True), None, Ending.UNCERTAIN),
        (keyed_500(), pinned(None), facts("k1", refused=True), "k1", Ending.UNCERTAIN),
        # a pinned request that never wrote, on a key this answer refuses: the graveyard
        (Outcome(OutcomeKind.BLOCKED, 401), pinned("k1"), facts("k1"), None, Ending.GRAVEYARD),
        # ... uncertain when an earlier attempt may have written
        (Outcome(OutcomeKind.BLOCKED, 401), pinned("k1", unsure=True), facts("k1"), None, Ending.UNCERTAIN),
        # an unpinned request on a refused key goes to another key (no pin)
        (Outcome(OutcomeKind.BLOCKED, 401), pinned(None), facts("k1"), None, None),
        # a success ends the request, whatever the key knew
        (Outcome(OutcomeKind.OK, 200), pinned("k1"), facts("k1", refused=True), None, Ending.SUCCEEDED),
    ],
    ids=["pins", "stays-pinned", "plain-retry", "stranded-refused", "pins-then-stranded",
         "stranded-graveyard", "stranded-uncertain", "unpinned-moves-on", "success"],
)  # fmt: skip
def test_pinning_and_stranding(outcome, request_, key, pin, ending):
    v = decide(outcome, request_, RULES, 1.0, *key)
    assert (v.pin, v.ending) == (pin, ending)


@pytest.mark.parametrize(
    "explains, widen",
    [(False, True), (True, False)],
)
def test_a_429_the_key_s_limit_explains_does_not_widen_the_headroom(explains, widen):
    limited = Outcome(OutcomeKind.RATE_LIMITED, 429)
    assert decide(limited, req(), RULES, 1.0, *facts("k1", explains=explains)).widen_headroom is widen
    # without the key's facts, the answer alone decides: a 429 widens it
    assert decide(limited, req(), RULES, 1.0).widen_headroom


def test_429s_in_a_row_close_the_keys_gate_unless_the_server_said_how_long():
    limited = Outcome(OutcomeKind.RATE_LIMITED, 429)
    v = decide(limited, req(), RULES, 1.0, *facts("k1", cool_s=8.0))
    assert v.cooldown is not None and (v.cooldown.scope, v.cooldown.delay_s) == (Scope.KEY, 8.0)
    assert "cooling off 8s" in v.cooldown.reason
    assert decide(limited, req(), RULES, 1.0, *facts("k1")).cooldown is None  # none in a row
    told = Outcome(OutcomeKind.RATE_LIMITED, 429, retry_after_s=3.0)
    v = decide(told, req(), RULES, 1.0, *facts("k1", cool_s=8.0))
    assert v.cooldown is not None and v.cooldown.delay_s == 3.0  # the server's wait, not ours
    failed = decide(Outcome(OutcomeKind.SERVER_ERROR, 503), req(), RULES, 1.0, *facts("k1", cool_s=8.0))
    assert failed.cooldown is None  # only a 429 cools the key off


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(OutcomeKind.OK, 200),
        Outcome(OutcomeKind.RATE_LIMITED, 429),
        Outcome(OutcomeKind.BANNED, 418),
        Outcome(OutcomeKind.BLOCKED, 401),
        Outcome(OutcomeKind.BLOCKED, 429),
        Outcome(OutcomeKind.BLOCKED, 403, retry_after_s=60.0),
        Outcome(OutcomeKind.CLIENT_ERROR, 404),
        Outcome(OutcomeKind.NONCE, 400),
        Outcome(OutcomeKind.SERVER_ERROR, 503),
        Outcome(OutcomeKind.TIMEOUT),
        keyed_500(),
    ],
)
def test_the_tally_the_key_judges_by_is_the_verdict_s(outcome):
    """`tally_of` (what the key's limit is judged by, before the decision) is `decide`'s tally."""
    assert tally_of(outcome) is decide(outcome, req(), RULES, 1.0, "k1").tally
