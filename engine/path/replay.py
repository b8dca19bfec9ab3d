"""A recording replayed over a fresh limit estimate and headroom: a live case as a fast test.

A run with `--record FILE` writes every answer's times, status and rate-limit
headers (observe/recording.py). `replay` feeds them, in time order, to what
the engine learns with, built anew from the recording's header:

- each key gets the engine's own `KeyLimits` (its limits as told, a
  `WindowLimiter`, the estimate's settings), and the run one
  `HeadroomController` with the run's arguments;
- a send (a line's `sent`): the key's limiter spends a slot and the key
  counts it (`WindowLimiter.record`, `KeyLimits.note_send`), as the key
  worker does when it sends;
- an answer (its `at`), rebuilt as an `Outcome` (its status, kind and
  hints as recorded; the server's counts and RateLimit-Policy parsed from its
  headers by the engine's readers, `delays.read_quotas`): the headroom times
  it (`request_path.time_answer`), the key learns from it and judges its
  limit by its tally (`KeyLimits.learn`, `KeyLimits.judged`, as
  `KeyWorker.answered`), and the headroom widens when `settle.decide` says
  so (as `RequestPath._apply`).

It is open loop: the sends are those recorded, whatever the estimate and
the headroom conclude; nothing is sent again or held back. A replay says what
the engine learns from those answers, not what a run with other settings
would have sent. Attempts still in flight when the run ended are not in the
recording (neither their send nor their answer); nor are a shared store's
leases, budgets beyond each key's own, or the cooldowns a Retry-After closes
(they decide when to send, which the recording already says).

Pure and deterministic: no clock, no loop, no randomness; the same lines give
the same result.

    from ratedeck.engine.path.replay import replay
    result = replay("run.jsonl")
    result.keys["k1"].estimate  # [(0.0, 25, "told"), (0.98, 20, "lowered by a 429 at 25"), ...]
    result.headroom             # [(0.0, 100.0), (0.06, 98.4), ...]: (seconds, ms)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from ratedeck.core.policy import Policy, parse_policy
from ratedeck.core.vocab import EventKind, OutcomeKind, Pacing
from ratedeck.engine.http.delays import read_quotas
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.limits.limiter import Stamp, WindowLimiter
from ratedeck.engine.observe.recording import FORMAT, VERSION
from ratedeck.engine.request import Request
from ratedeck.engine.settings import EngineSettings, KeySpec

from .key import UNKNOWN_LIMIT, KeyLimits, Learning
from .request_path import time_answer
from .settle import SettleRules, decide, tally_of

__all__ = ["KeyTrajectory", "RecordingError", "ReplayResult", "replay"]

# What `decide` needs to say whether an answer widens the headroom (nothing here depends on it).
_RULES = SettleRules(max_attempts=1, backoff_base_s=0.0, backoff_cap_s=0.0)


class RecordingError(ValueError):
    """The lines are not a recording this version reads; the message is one line."""


@dataclass
class KeyTrajectory:
    """One key's estimate through the replay.

    `estimate` is (seconds from the run's start, value, reason) at the start and at every
    move; `final`/`reason` where it ended; `answers` and `rejected_429` count its answers."""

    label: str
    told: tuple[Policy, ...]
    estimate: list[tuple[float, int, str]] = field(default_factory=list)
    final: int | None = None
    reason: str = ""
    answers: int = 0
    rejected_429: int = 0
    shared_share: float | None = None


@dataclass
class ReplayResult:
    """What a replay concluded: each key's estimate over time (`keys`), the headroom's value in
    ms over time (`headroom`: (seconds, ms) at the start and at every change of 0.1 ms or
    more), where the headroom ended (`headroom_ms`; `headroom_effective_ms`, what the windows
    carry on average, as the console shows it; `headroom_source`), the spread of
    round trips it saw, the answers and 429s replayed, and what the engine would have logged
    (`events`: (seconds, text))."""

    keys: dict[str, KeyTrajectory]
    headroom: list[tuple[float, float]]
    headroom_ms: float
    headroom_effective_ms: float
    headroom_source: str
    rtt_spread_ms: float | None
    answers: int
    rejected_429: int
    events: list[tuple[float, str]]


class _Said:
    """The replay's event sink: what the key's learning says, with the replay's time."""

    __slots__ = ("now", "rows")

    def __init__(self) -> None:
        self.now = 0.0
        self.rows: list[tuple[float, str]] = []

    def event(self, kind: EventKind, text: str) -> None:
        self.rows.append((round(self.now, 6), text))


def replay(recording: str | Path | Iterable[str]) -> ReplayResult:
    """Replay a recording (a path, or its lines) over a fresh estimate per key and a fresh
    headroom (see the module doc). Raises `RecordingError` for lines that are not one."""
    if isinstance(recording, str | Path):
        with open(recording, encoding="utf-8") as fh:
            return _replay(fh)
    return _replay(iter(recording))


def _replay(lines: Iterable[str]) -> ReplayResult:
    it = iter(lines)
    header = _header(next(it, ""))
    answers = [json.loads(line) for line in it if line.strip()]
    said = _Said()
    headroom = HeadroomController(**header.get("headroom", {}))
    wall_t0 = float(header.get("wall_t0", 0.0))
    told = {label: tuple(parse_policy(p) for p in policies) for label, policies in header["keys"].items()}
    specs = tuple(KeySpec(label, "", policies) for label, policies in told.items())

    def make(policies: tuple[Policy, ...]) -> WindowLimiter:
        return WindowLimiter(
            policies,
            headroom.seconds,
            Pacing.BURST,
            pace_s=headroom.pace_seconds,
            wall_offset=wall_t0,
            headroom=headroom.figures,
        )

    estimate = header.get("estimate", {})
    learning = Learning(
        budgets=Budgets(EngineSettings(keys=specs), make),
        headroom=headroom,
        events=said,
        learn_policy=bool(estimate.get("learn_policy", True)),
    )
    keys = {
        spec.label: KeyLimits(
            spec,
            make(spec.policies or (UNKNOWN_LIMIT,)),
            learning,
            max_in_flight=1,
            climb=str(estimate.get("climb", "additive")),
            slow_start=bool(estimate.get("slow_start", False)),
        )
        for spec in specs
    }
    paths = {label: KeyTrajectory(label, told[label]) for label in keys}
    for label, limits in keys.items():
        _moved(paths[label], limits, 0.0)
    trail = [(0.0, round(headroom.value_ms, 1))]

    # Every send and every answer, in time order (a send before an answer at the same time).
    events: list[tuple[float, int, int]] = []
    for i, line in enumerate(answers):
        if line.get("key") not in keys:
            raise RecordingError(f"line {i + 2}: key {line.get('key')!r} is not in the header")
        if line.get("sent") is not None:
            events.append((float(line["sent"]), 0, i))
        events.append((float(line["at"]), 1, i))
    events.sort()
    stamps: dict[int, Stamp] = {}
    rejected = 0
    for t, kind, i in events:
        line = answers[i]
        limits = keys[line["key"]]
        said.now = t
        if kind == 0:  # a send
            limits.limiter.next_free(t)  # the limiter forgets what left its windows
            stamps[i] = limits.limiter.record(t)
            limits.note_send(t)
            continue
        result = _outcome(line, wall_t0 + t)
        stamp = stamps.pop(i, None)
        sent = (stamp,) if stamp is not None else ()
        req = Request(i, stamp.t if stamp is not None else t, math.inf)
        req.attempts = 1
        if stamp is not None:
            req.mark_sent(stamp.t, line["key"])
        # As the request path: the headroom times the answer, the key learns from it and
        # judges its limit by its tally, and the verdict may widen the headroom.
        time_answer(headroom, result, sent, t)
        limits.learn(result, req, sent, t)
        tally = tally_of(result)
        explains = limits.judged(tally, req.last_sent_at, t)
        cool = limits.cool_off(tally, req.last_sent_at, t, result.retry_after_s is not None)
        if decide(result, req, _RULES, t, line["key"], False, explains, cool).widen_headroom:
            headroom.observe_rejection(t)
        path = paths[line["key"]]
        path.answers += 1
        if result.kind is OutcomeKind.RATE_LIMITED:
            path.rejected_429 += 1
            rejected += 1
        _moved(path, limits, t)
        ms = round(headroom.value_ms, 1)
        if ms != trail[-1][1]:
            trail.append((round(t, 6), ms))
    return ReplayResult(
        keys=paths,
        headroom=trail,
        headroom_ms=headroom.value_ms,
        headroom_effective_ms=headroom.effective_ms,
        headroom_source=headroom.source,
        rtt_spread_ms=headroom.rtt_spread_ms,
        answers=len(answers),
        rejected_429=rejected,
        events=said.rows,
    )


def _header(first: str) -> dict[str, Any]:
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("recording") != FORMAT:
        raise RecordingError("not a ratedeck recording: its first line is not the header")
    if header.get("version") != VERSION:
        raise RecordingError(f"a recording of version {header.get('version')}; this reads version {VERSION}")
    if not isinstance(header.get("keys"), dict):
        raise RecordingError("the recording's header names no keys")
    return header


def _outcome(line: dict[str, Any], now_wall: float) -> Outcome:
    """A recorded answer as the transport made it: its status, kind and hints as recorded,
    the server's counts and RateLimit-Policy read from its headers as the transport reads them."""
    headers = CIMultiDict(line.get("headers") or {})
    out = Outcome(
        OutcomeKind(line["kind"]),
        line.get("status"),
        line.get("retry_after_s"),
        error=None,
        policy_header=headers.get("RateLimit-Policy"),
        server_time_s=line.get("server_time_s"),
        remaining=line.get("remaining"),
    )
    if line.get("sent") is not None:
        out.latency_s = float(line["at"]) - float(line["sent"])
    if headers:
        out.quotas = read_quotas(headers, now_wall)
    return out


def _moved(path: KeyTrajectory, limits: KeyLimits, t: float) -> None:
    est = limits.estimate
    if est is None:
        return
    if not path.estimate or path.estimate[-1][1:] != (est.value, est.reason):
        path.estimate.append((round(t, 6), est.value, est.reason))
    path.final, path.reason, path.shared_share = est.value, est.reason, est.shared_share
