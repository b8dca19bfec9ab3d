"""What happens to a request after one attempt: one pure decision.

`decide(outcome, request, rules, now, key, refused, explains, cool_s)` looks at nothing else and
changes nothing; the request path carries the `Verdict` out in one place
(`RequestPath._apply`).
Every branch of "what does this answer mean for this request" lives here,
so it can be read, and tested, as a table: what to count, whose gate to close,
whether to block the key, to pin the request to its key (an Idempotency-Key's
account) or end it there when that key is refused (stranded), whether the
headroom widens, and where the request goes.

What the key side said of the answer comes in as facts, before the decision:
the key's label, whether it was `refused` for good already, whether its
limit `explains` the answer's 429 (`KeyLimits.judged`, given `tally_of`), and
how long it sits out for 429s in a row (`KeyLimits.cool_off`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ratedeck.core.vocab import Ending, OutcomeKind
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.request import Request


class Tally(StrEnum):
    """Which attempt counter an answer adds to."""

    SUCCEEDED = "succeeded"
    REJECTED_429 = "rejected_429"
    REJECTED_OTHER = "rejected_other"  # 4xx other than 429: nonce, auth, bad request
    FAILED = "failed"  # 5xx, timeouts, connection errors


class Scope(StrEnum):
    """Whose gate a server's delay closes."""

    KEY = "key"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class SettleRules:
    """The run's settings the decision depends on."""

    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    retry_errors: bool = True  # False for a library caller: errors reach it at once
    host_gate: bool = False  # a host-wide budget (and gate) exists
    host_limit_match: str = "host"  # a 429 whose error text says this is the host's
    ban_default_s: float = 120.0  # a ban with no stated length: Binance's first ban is 2 minutes


@dataclass(frozen=True, slots=True)
class CooldownOrder:
    """What a verdict orders of a gate (not the `ports.Cooldown` that carries it out): close
    `scope`'s gate, its senders all wait `delay_s`."""

    scope: Scope
    delay_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one answered attempt.

    `ending` is where the request ends now, or None when it is retried: at
    once (`backoff_cap_s == 0`) or after a uniformly random wait of up to
    `backoff_cap_s` (exponential backoff with full jitter; the engine draws).
    """

    tally: Tally
    ending: Ending | None = None
    backoff_cap_s: float = 0.0
    cooldown: CooldownOrder | None = None
    block_key: bool = False
    widen_headroom: bool = False
    cause: str | None = None  # the failure's name in the failures table
    unsure: bool = False  # this attempt may have written: the request can no longer fail plainly
    pin: str | None = None  # from now on only this key may send it (an Idempotency-Key's account)


#: The verdict of every success: immutable, so one serves them all (no allocation per answer).
_SUCCESS = Verdict(Tally.SUCCEEDED, Ending.SUCCEEDED)


def tally_of(outcome: Outcome, client_gone: bool = False) -> Tally:
    """The counter `decide` adds `outcome` to, from the answer alone (`client_gone`: its live
    client left while it held part of the answer); the key judges its limit by it first."""
    kind = outcome.kind
    if kind is OutcomeKind.OK:
        return Tally.SUCCEEDED
    if outcome.streamed or client_gone:
        return Tally.FAILED  # its live client's end (`_live_client_end`)
    if kind is OutcomeKind.RATE_LIMITED or (kind is OutcomeKind.BLOCKED and outcome.status == 429):
        return Tally.REJECTED_429
    if kind is OutcomeKind.BLOCKED and outcome.status == 403 and _rate_limit_signs(outcome):
        return Tally.REJECTED_429
    if kind in (OutcomeKind.BANNED, OutcomeKind.BLOCKED, OutcomeKind.CLIENT_ERROR, OutcomeKind.NONCE):
        return Tally.REJECTED_OTHER
    return Tally.FAILED


def decide(
    outcome: Outcome,
    req: Request,
    rules: SettleRules,
    now: float,
    key: str | None = None,
    refused: bool = False,
    explains: bool = False,
    cool_s: float = 0.0,
) -> Verdict:
    """What to count, whom to pause and where `req` goes after `outcome`.

    `req.attempts` already counts this attempt. `key` is the label of the key that sent
    it, `refused` whether that key was refused for good before this answer, `explains`
    whether its limit explains the answer's 429 (then the headroom does not widen), `cool_s`
    how long the key sits out for 429s in a row (`KeyLimits.cool_off`; a 429 that gave no
    wait of its own closes the key's gate that long). With no `key` the answer alone
    decides: nothing is pinned or stranded.
    """
    if outcome.kind is OutcomeKind.OK:
        return _SUCCESS
    v = _decide(outcome, req, rules, now)
    if explains and v.widen_headroom:
        v = replace(v, widen_headroom=False)  # a 429 the limit explains, not the timing
    if cool_s > 0 and v.tally is Tally.REJECTED_429 and v.cooldown is None:
        reason = f"429s in a row, the server holds the key: cooling off {cool_s:g}s"
        v = replace(v, cooldown=CooldownOrder(Scope.KEY, cool_s, reason))
    if key is not None and v.ending is None and (outcome.keyed or req.pin is not None):
        # An Idempotency-Key is scoped to the account that first sent it: its retries go out on
        # that key only, like a workload line's `_key`; refused for good, it strands them.
        if req.pin is None:
            v = replace(v, pin=key)
        if (req.pin is None or req.pin == key) and (refused or v.block_key):
            v = replace(v, ending=Ending.UNCERTAIN if req.unsure or v.unsure else Ending.GRAVEYARD)
    return v


def _decide(outcome: Outcome, req: Request, rules: SettleRules, now: float) -> Verdict:
    """The verdict on the answer alone (`decide` adds what the key knew)."""
    kind = outcome.kind
    if outcome.streamed or req.cancelled:
        ended = _live_client_end(outcome, req)
        if ended is not None:
            return ended
    if kind == OutcomeKind.BLOCKED and outcome.status == 403 and _rate_limit_signs(outcome):
        kind = OutcomeKind.RATE_LIMITED  # a 403 that asks to wait is a limit, not a refusal (GitHub's)
    if kind == OutcomeKind.RATE_LIMITED:
        cooldown = None
        if outcome.retry_after_s is not None:
            host = rules.host_gate and rules.host_limit_match in (outcome.error or "")
            reason = f"429, asked to wait {outcome.retry_after_s:g}s"
            cooldown = CooldownOrder(Scope.HOST if host else Scope.KEY, outcome.retry_after_s, reason)
        return _retry(
            Tally.REJECTED_429, req, rules, now, backoff=True, cooldown=cooldown, widen_headroom=True
        )
    if kind == OutcomeKind.BANNED:
        # Refused for a while for not slowing down: every sender from this host waits
        # it out (Binance bans the IP), then the request is tried again.
        delay = outcome.retry_after_s if outcome.retry_after_s is not None else rules.ban_default_s
        cooldown = CooldownOrder(Scope.HOST, delay, f"banned ({outcome.status}), asked to wait {delay:g}s")
        return _retry(
            Tally.REJECTED_OTHER, req, rules, now, backoff=False, cooldown=cooldown, widen_headroom=True
        )
    if kind == OutcomeKind.BLOCKED:
        tally = Tally.REJECTED_429 if outcome.status == 429 else Tally.REJECTED_OTHER
        if not rules.retry_errors:
            return Verdict(tally, _failed(req), block_key=True)
        # another key may still serve it (not a pinned one: the path ends that)
        return _retry(tally, req, rules, now, backoff=False, block_key=True)
    if kind == OutcomeKind.CLIENT_ERROR:
        return Verdict(Tally.REJECTED_OTHER, _failed(req))  # retrying only repeats the error
    if kind == OutcomeKind.NONCE:
        return _retry(Tally.REJECTED_OTHER, req, rules, now, backoff=False)
    # server error, timeout, connection
    cause = str(outcome.status) if outcome.status is not None else str(kind)
    cooldown = None
    if outcome.retry_after_s is not None:
        cooldown = CooldownOrder(
            Scope.KEY, outcome.retry_after_s, f"{cause}, asked to wait {outcome.retry_after_s:g}s"
        )
    if outcome.write and outcome.maybe_sent:
        # A write that may have happened. With no Idempotency-Key, sending it again could do
        # it twice; a replayed answer is all a retry with the key would bring; without
        # retries (a library caller) nobody sends it again: it ends uncertain now. Else it is
        # retried with the same key on the same key (the path pins it), up to max_attempts.
        if not outcome.keyed or outcome.replayed or not rules.retry_errors:
            return Verdict(Tally.FAILED, Ending.UNCERTAIN, cooldown=cooldown, cause=cause, unsure=True)
        return _retry(
            Tally.FAILED, req, rules, now, backoff=True, cooldown=cooldown, cause=cause, unsure=True
        )
    if not rules.retry_errors:
        return Verdict(Tally.FAILED, _failed(req), cooldown=cooldown, cause=cause)
    return _retry(Tally.FAILED, req, rules, now, backoff=True, cooldown=cooldown, cause=cause)


def _live_client_end(outcome: Outcome, req: Request) -> Verdict | None:
    """A failed attempt whose live client (`Request.answer`) left, or already holds part of the
    answer, ends now: nothing can send it the answer again. A client that left ends the
    request shed, as a cancelled request ends (what it reserved stays spent); a stream that
    broke after it began ends as a failure with the reason. None: the usual rules apply."""
    if req.cancelled and req.answer is not None:
        return Verdict(Tally.FAILED, Ending.SHED, cause="client gone")
    if outcome.streamed:
        return Verdict(Tally.FAILED, _failed(req), cause="stream broken")
    return None


def _rate_limit_signs(outcome: Outcome) -> bool:
    """The answer says when to come back, or that nothing is left: a delay or remaining 0."""
    return (
        outcome.retry_after_s is not None
        or outcome.remaining == 0
        or any(q.remaining == 0 for q in outcome.quotas)
    )


def _failed(req: Request) -> Ending:
    """Where a request that failed ends: uncertain if an earlier attempt may have written."""
    return Ending.UNCERTAIN if req.unsure else Ending.GRAVEYARD


def _retry(
    tally: Tally,
    req: Request,
    rules: SettleRules,
    now: float,
    *,
    backoff: bool,
    cooldown: CooldownOrder | None = None,
    block_key: bool = False,
    widen_headroom: bool = False,
    cause: str | None = None,
    unsure: bool = False,
) -> Verdict:
    """A retry, unless the request has used its attempts (graveyard) or its time (expired);
    uncertain instead of either when an attempt may have written (`unsure`, `req.unsure`)."""
    if req.attempts >= rules.max_attempts:
        ending: Ending | None = Ending.GRAVEYARD
    elif req.deadline <= now:
        ending = Ending.EXPIRED
    else:
        ending = None
    if ending is not None and (unsure or req.unsure):
        ending = Ending.UNCERTAIN
    cap = 0.0
    if ending is None and backoff:
        cap = min(rules.backoff_cap_s, rules.backoff_base_s * (2 ** (req.attempts - 1)))
    return Verdict(tally, ending, cap, cooldown, block_key, widen_headroom, cause, unsure)
