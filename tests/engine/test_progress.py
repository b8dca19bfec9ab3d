"""A job's progress on virtual time: done of total, and an ETA that is right from the start.

The jobs run against `server/policy_transport.py` (a server of any policy kind on the
loop's clock). Snapshots are taken every quarter second, as the console would; the ETA
each gives is compared with when the job really ended.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ratedeck.config import load_config
from ratedeck.core.policy import parse_policy
from ratedeck.engine.commands import PauseAll, ResumeAll
from ratedeck.engine.engine import Engine
from ratedeck.engine.observe.progress import BLEND_AT, eta, merge_progress
from ratedeck.engine.snapshot import Progress
from ratedeck.engine.sources.workload import read_jsonl
from ratedeck.server.policy_transport import PolicyTransport
from ratedeck.server.simulated import run_virtual
from tests.engine.test_jobs_fed import job_engine


def watch(engine: Engine, every_s: float = 0.25, steer=None) -> tuple[list[tuple[float, Progress]], float]:
    """Run `engine` to its end, a snapshot every `every_s`: [(elapsed, progress)] and when it ended."""
    seen: list[tuple[float, Progress]] = []

    async def main():
        engine.start()
        finished = engine.finished
        assert finished is not None
        while not finished.is_set():
            await asyncio.sleep(every_s)
            snap = engine.snapshot()
            assert snap.progress is not None
            seen.append((snap.elapsed_s, snap.progress))
            if steer is not None:
                steer(engine, snap)
        return await engine.stop()

    snap = run_virtual(main())
    assert snap.progress == Progress(snap.progress.total, snap.progress.total, 0.0, 0.0)
    return seen, snap.makespan.elapsed_s


def finish_seen_at(seen: list[tuple[float, Progress]], share: float) -> tuple[float, float]:
    """(when, the finish the ETA foresaw) at the first snapshot with `share` of the job done."""
    at, p = next((t, p) for t, p in seen if p.done >= share * p.total)
    assert p.eta_s is not None
    return at, at + p.eta_s


@pytest.mark.parametrize(
    ("policy", "keys", "n", "latency"),
    [
        ("20/1s", 5, 3000, (1, 5)),
        ("20/2s fixed", 5, 3000, (1, 5)),
        ("15@0.33/s", 2, 70, (1, 5)),
        # slow answers (8 in flight per key): the pace, not the limits, sets the time; the limits
        # alone would foresee 29.5 s, 40% short of the 49 s it takes
        ("20/1s", 5, 3000, (200, 400)),
    ],
    ids=["sliding", "fixed", "bucket", "slow-answers"],
)
def test_the_eta_at_10_percent_done_is_within_15_percent_of_the_finish(tmp_path, policy, keys, n, latency):
    engine, _ = job_engine(tmp_path, policy, keys, n, latency=latency)
    seen, finished = watch(engine)
    at, foreseen = finish_seen_at(seen, 0.10)
    assert foreseen == pytest.approx(finished, rel=0.15), (at, foreseen, finished)
    assert seen[0][1].total == n


@pytest.mark.parametrize(
    ("policy", "turn_s", "first_most"),
    [
        ("20/1s", None, 100),
        # the Unix clock 1.5 s before the fixed window's turn: the first snapshot sees its 100
        ("20/2s fixed", 1.5, 100),
        # 0.12 s before it: the second window's 100 are sent as it turns, inside the first quarter
        ("20/2s fixed", 0.12, 200),
        # 0.05 s before it: the first sends may land after the turn, so they count in both
        # windows (engine/limits/limiter.py's _Fixed), and the second waits for the next turn
        ("20/2s fixed", 0.05, 100),
    ],
    ids=["sliding", "fixed-turns-late", "fixed-turns-at-once", "fixed-turns-too-soon-to-trust"],
)
def test_the_first_snapshot_already_has_an_eta_from_the_limits(
    tmp_path, unix_clock, policy, turn_s, first_most
):
    """A quarter of a second in, nothing to measure a pace by: the limits alone are right,
    wherever the Unix clock stands in a fixed window when the job starts."""
    n = 3000
    unix_clock(1_800_000_000.0 - (turn_s or 0.0))
    engine, _ = job_engine(tmp_path, policy, 5, n)
    seen, finished = watch(engine)
    at, first = seen[0]
    assert at < 0.5 and first_most / 2 < first.done <= first_most, first.done
    assert first.least_s is not None and first.eta_s == first.least_s
    assert at + first.eta_s == pytest.approx(finished, rel=0.05)
    # and the ETA counts down with the job, never below what the limits allow
    for _, p in seen:
        assert p.eta_s is not None and p.least_s is not None and p.eta_s >= p.least_s


def test_after_a_pause_the_eta_is_right_again_at_once(tmp_path):
    """Every key paused for 5 s at a quarter done: a second after they resume, the ETA foresees
    the finish again (the pace is measured anew after a stall, and never beats the limits)."""
    engine, _ = job_engine(tmp_path, "20/1s", 5, 2000)
    paused_at: list[float] = []

    def steer(engine, snap):
        if not paused_at and snap.progress.done >= 500:
            paused_at.append(snap.elapsed_s)
            engine.apply(PauseAll())
        elif paused_at and snap.elapsed_s >= paused_at[0] + 5.0 and len(paused_at) == 1:
            paused_at.append(snap.elapsed_s)
            engine.apply(ResumeAll())

    seen, finished = watch(engine, steer=steer)
    assert finished > 23.0  # 19 s of limits plus the pause
    _, foreseen = next((t, t + p.eta_s) for t, p in seen if t >= paused_at[1] + 1.0)
    assert foreseen == pytest.approx(finished, rel=0.05)


def test_the_generated_stream_has_progress_only_with_a_total():
    def engine(**workload) -> Engine:
        cfg = load_config(
            overrides={
                "target": {"url": "http://policy-server/api"},
                "keys": {"secrets": ["key-00-0000000000000000"], "limits": ["20/1s"]},
                "engine": {"graveyard_path": ""},
                "workload": workload,
            }
        )
        return Engine(cfg, PolicyTransport((parse_policy("20/1s"),)))

    endless = engine()
    assert endless.snapshot().progress is None
    counted = engine(total=40)
    snap = run_virtual(counted.run(60.0))
    assert snap.progress == Progress(40, 40, 0.0, 0.0)


def test_a_workload_file_s_size_is_counted_in_its_check_pass(tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" + ("\n" if i % 7 == 0 else "") for i in range(123)))
    items = read_jsonl(str(path))
    assert items.count == 123  # blank lines are not jobs
    assert next(items) == {"i": 0} and sum(1 for _ in items) == 122


def test_the_eta_blend():
    # nothing left: done
    assert eta(0, 1.0, None, None) == 0.0
    # nothing known: unknown; only the limits: the limits; only a pace: the pace
    assert eta(100, 0.0, None, None) is None
    assert eta(100, 0.0, 12.0, None) == 12.0
    assert eta(100, 0.5, None, 10.0) == pytest.approx(10.0)
    # the pace counts more as the share done grows, all of it from BLEND_AT on
    assert eta(100, 0.0, 5.0, 2.0) == pytest.approx(5.0)
    assert eta(100, BLEND_AT / 2, 5.0, 2.0) == pytest.approx(27.5)
    assert eta(100, BLEND_AT, 5.0, 2.0) == pytest.approx(50.0)
    # a pace faster than the limits allow (a burst just spent) never brings the ETA below them
    assert eta(100, 0.9, 5.0, 1000.0) == 5.0


def test_processes_sharing_a_job_merge_their_progress():
    assert merge_progress([None, None]) is None
    merged = merge_progress([Progress(100, 40, 6.0, 5.0), None, Progress(50, 10, 9.0, 4.0)])
    assert merged == Progress(150, 50, 9.0, 5.0)
    assert merge_progress([Progress(10, 1, None, 2.0), Progress(10, 2, 3.0, 2.0)]).eta_s is None
    assert (
        Progress(0, 0).fraction == 1.0 and Progress(4, 1).fraction == 0.25 and Progress(4, 5).remaining == 0
    )
