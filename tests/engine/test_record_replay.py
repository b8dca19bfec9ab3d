"""Record and replay (issue 44): a run's answers recorded (engine/observe/recording.py) and
replayed over a fresh estimate and headroom (engine/path/replay.py), so a live case is a
fast, deterministic test.

`data/told-wrong.jsonl` is a real recording: the CLI told 25/1s per key against `ratedeck
serve` allowing 20/1s (no RateLimit headers, 429 + Retry-After, escalating cooldowns, 0..50
ms each way) for 8 s, with two fake keys; `data/told-wrong.live.json` is what that run's
report said at its end (see its "made_by")."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from ratedeck.core.policy import Policy
from ratedeck.engine.http.outcome import OK, RATE_LIMITED, Outcome
from ratedeck.engine.http.transport import Response
from ratedeck.engine.observe.recording import Recorder, limit_headers
from ratedeck.engine.path.replay import RecordingError, replay
from ratedeck.server.settings import standard_settings
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

DATA = Path(__file__).parent / "data"
TOLD_WRONG = DATA / "told-wrong.jsonl"
LIVE = json.loads((DATA / "told-wrong.live.json").read_text())


def _answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


# -- the live case, replayed
def test_replaying_the_told_wrong_recording_lowers_each_estimate_from_25_to_20_at_its_first_429():
    result = replay(TOLD_WRONG)
    answers = _answers(TOLD_WRONG)
    assert set(result.keys) == {"k1", "k2"} and result.answers == len(answers)
    for label, key in result.keys.items():
        first_429 = min(a["at"] for a in answers if a["key"] == label and a["status"] == 429)
        assert key.estimate[0] == (0.0, 25, "told")
        # The first 429 lowers it, to what the server accepted in the window before it.
        t, value, reason = key.estimate[1]
        assert t == first_429 and 19 <= value <= 20 and reason == "lowered by a 429 at 25"
        assert all(v <= 20 for _t, v, _r in key.estimate[1:])  # never back above the server's 20
        assert 19 <= key.final <= 20
        assert key.rejected_429 == sum(1 for a in answers if a["key"] == label and a["status"] == 429)


def test_the_headroom_settles_within_what_the_recordings_round_trips_say():
    result = replay(TOLD_WRONG)
    rtts_ms = [(a["at"] - a["sent"]) * 1000 for a in _answers(TOLD_WRONG) if a["status"] is not None]
    spread = max(rtts_ms) - min(rtts_ms)
    assert result.rtt_spread_ms == pytest.approx(spread, abs=0.01)
    # The headroom covers the spread of the way in: about half the round trips' spread, with a
    # safety margin, never the whole of it; it starts at its initial 100 ms and narrows to it.
    assert result.headroom[0] == (0.0, 100.0)
    settled = [ms for t, ms in result.headroom if t >= 2.0]
    assert settled and all(spread / 2 <= ms <= spread for ms in settled), (spread, settled)
    assert result.headroom_source == "round trip"


def test_the_replay_ends_where_the_live_run_that_recorded_it_ended():
    result = replay(TOLD_WRONG)
    assert round(result.headroom_effective_ms, 1) == LIVE["headroom_ms_final"]
    assert round(result.rtt_spread_ms, 1) == LIVE["rtt_spread_ms"]
    assert {k: f"{v.final}/1s" for k, v in result.keys.items()} == LIVE["limit_estimate"]
    assert {k: v.rejected_429 for k, v in result.keys.items()} == LIVE["rejected_429"]


def test_a_replay_is_deterministic_from_a_path_or_from_lines():
    first = replay(TOLD_WRONG)
    assert replay(TOLD_WRONG) == first
    assert replay(TOLD_WRONG.read_text().splitlines()) == first
    assert [text for _t, text in first.events] == [
        "k1: told 25/1s, limit estimate 20/1s (lowered by a 429 at 25)",
        "k2: told 25/1s, limit estimate 20/1s (lowered by a 429 at 25)",
    ]


def test_what_is_not_a_recording_is_refused_in_one_line():
    header, *answers = TOLD_WRONG.read_text().splitlines()
    with pytest.raises(RecordingError, match="not a ratedeck recording"):
        replay(answers)  # no header: a results file, say
    with pytest.raises(RecordingError, match="version 2"):
        replay([header.replace('"version": 1', '"version": 2'), *answers])
    with pytest.raises(RecordingError, match="key 'k9' is not in the header"):
        replay([header, answers[0].replace('"k1"', '"k9"')])


def test_advertised_limits_and_counts_are_read_from_the_recorded_headers():
    header = {
        "recording": "ratedeck",
        "version": 1,
        "keys": {"k1": ["25/1s"]},
        "headroom": {},
        "estimate": {},
    }
    said = {"RateLimit-Policy": '"20/1s";q=20;w=1', "X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "19"}
    answer = {"key": "k1", "sent": 0.0, "at": 0.05, "status": 200, "kind": "ok", "headers": said}
    result = replay([json.dumps(header), json.dumps(answer)])
    assert result.keys["k1"].estimate == [(0.0, 25, "told"), (0.05, 20, "advertised")]
    lower = {name.lower(): value for name, value in said.items()}  # names in any case, as HTTP says
    assert replay([json.dumps(header), json.dumps({**answer, "headers": lower})]) == result


# -- a recording made by the engine, replayed, ends where the engine ended
def _recorded_run(
    tmp_path: Path, seconds: float, record: bool = True, secrets=("sk-RECORDME-1", "sk-RECORDME-2")
):
    server = replace(
        standard_settings(),
        keys=secrets,
        policies=(Policy(20, 1.0),),
        latency_in_ms=(5, 45),
        latency_out_ms=(5, 45),
        processing_ms=(20, 80),
        seed=3,
        ratelimit_headers=False,
        escalation=True,
    )
    path = tmp_path / "run.jsonl"
    eng, transport = seed_engine(
        tmp_path,
        server=server,
        transport_kw={"seed": 3},
        keys={"secrets": list(secrets), "limits": ["25/1s"]},
        target={"nonce_param": ""},
        engine={"ttl_s": 60.0, "max_attempts": 20, **({"record_path": str(path)} if record else {})},
        workload={"rate": 60.0},
        run={"seed": 3},
    )
    snap = run_virtual(eng.run(seconds))
    return snap, transport, path, eng


def test_a_replay_of_the_engines_own_recording_ends_where_the_engine_ended(tmp_path):
    snap, transport, path, _eng = _recorded_run(tmp_path, 20)
    result = replay(path)
    assert snap.rejected_429 > 0 and result.rejected_429 == snap.rejected_429
    assert {k: f"{v.final}/1s" for k, v in result.keys.items()} == {
        k.label: k.limit_estimate for k in snap.keys
    }
    assert {k: v.reason for k, v in result.keys.items()} == {k.label: k.estimate_reason for k in snap.keys}
    # to 10 µs: the recording keeps times to the µs, and the simulator's delays have fractions
    assert result.headroom_effective_ms == pytest.approx(snap.headroom_ms, abs=0.01)


def test_the_recording_holds_each_answer_once_no_key_and_is_the_users_alone(tmp_path):
    old = os.umask(0o022)
    try:
        snap, transport, path, _eng = _recorded_run(tmp_path, 5)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "RECORDME" not in text  # the keys' labels, never their secrets
    head, *lines = [json.loads(line) for line in text.splitlines()]
    assert {a["key"] for a in lines} == {"k1", "k2"}
    assert head["recording"] == "ratedeck" and head["keys"] == {"k1": ["25/1s"], "k2": ["25/1s"]}
    # Each attempt once: as many lines as the server was sent, each (key, send) once.
    assert snap.in_flight == 0 and len(lines) == transport.attempts == snap.sent
    assert len({(a["key"], a["sent"]) for a in lines}) == len(lines)
    assert [a["at"] for a in lines] == sorted(a["at"] for a in lines)  # in the order they came


def test_nothing_is_recorded_unless_asked(tmp_path):
    _snap, _transport, path, eng = _recorded_run(tmp_path, 2, record=False)
    assert eng.parts.path.recorder is None
    assert not path.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


# -- the recorder alone
class _Headers(dict):
    """Headers as a client hands them: `items`, names in the server's case."""


def _answer(status: int, headers: dict[str, str]) -> Outcome:
    out = Outcome(OK if status == 200 else RATE_LIMITED, status, 1.0 if status == 429 else None)
    out.response = Response(status, _Headers(headers), b'{"secret": "sk-RECORDME-1"}')
    return out


def test_only_the_headers_about_limits_and_timing_are_kept():
    kept = limit_headers(
        _Headers(
            {
                "Authorization": "Bearer sk-RECORDME-1",
                "Set-Cookie": "session=abc",
                "Content-Type": "application/json",
                "Retry-After": "1",
                "RateLimit-Policy": '"a";q=20;w=1',
                "X-RateLimit-Remaining": "3",
                "x-ratelimit-reset-tokens": "6m0s",
                "anthropic-ratelimit-requests-remaining": "9",
                "Server-Timing": "app;dur=12",
            }
        )
    )
    assert set(kept) == {
        "Retry-After",
        "RateLimit-Policy",
        "X-RateLimit-Remaining",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-remaining",
        "Server-Timing",
    }


def test_a_secret_in_a_kept_header_is_masked_and_lines_are_written_each_second(tmp_path):
    from ratedeck.core.secrets import Redactor

    path = tmp_path / "r.jsonl"
    rec = Recorder(str(path), {"keys": {"k1": ["20/1s"]}}, Redactor(["sk-RECORDME-1"]))
    rec.start(100.0, 1_700_000_000.0)
    rec.record("k1", 100.0, 100.05, _answer(200, {"X-RateLimit-Resource": "sk-RECORDME-1"}))
    rec.record("k1", 100.1, 100.15, _answer(429, {"Retry-After": "1"}))  # within the second: kept
    assert len(path.read_text().splitlines()) == 2  # the header and the first answer
    rec.record("k1", 101.0, 101.06, _answer(200, {}))  # a second on: written
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 4 and rec.answers == 3 and rec.close() is None
    assert "RECORDME" not in path.read_text() and "body" not in path.read_text()
    assert lines[0]["wall_t0"] == 1_700_000_000.0
    assert lines[2] == {
        "key": "k1",
        "sent": 0.1,
        "at": 0.15,
        "status": 429,
        "kind": "rate_limited",
        "retry_after_s": 1.0,
        "headers": {"Retry-After": "1"},
    }
    assert lines[1]["headers"]["X-RateLimit-Resource"] != "sk-RECORDME-1"


def test_a_429_the_limit_does_not_explain_widens_the_headroom_as_in_the_engine():
    # Five accepted in the window at the told 5/1s, then a 429: the limit holds as told, so the
    # 429 is the timing's (settle.decide widens the headroom), and the estimate stays.
    header = {"recording": "ratedeck", "version": 1, "keys": {"k1": ["5/1s"]}, "headroom": {}, "estimate": {}}
    lines = [json.dumps(header)]
    for i in range(5):
        lines.append(
            json.dumps({"key": "k1", "sent": i / 10, "at": i / 10 + 0.05, "status": 200, "kind": "ok"})
        )
    rejected = {
        "key": "k1",
        "sent": 0.5,
        "at": 0.55,
        "status": 429,
        "kind": "rate_limited",
        "retry_after_s": 1.0,
    }
    result = replay([*lines, json.dumps(rejected)])
    assert result.keys["k1"].estimate == [(0.0, 5, "told")]
    (t_before, before), (t_after, after) = result.headroom[-2:]
    assert (t_before, t_after) == (0.45, 0.55) and after > before * 1.4, result.headroom
