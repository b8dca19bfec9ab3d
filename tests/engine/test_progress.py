"""A job's progress on virtual time: done of total, and an ETA that is right from the start.

The jobs run against `server/policy_transport.py` (a server of any policy kind on the
loop's clock) and against the OpenAI stub (`server/stubs/openai.py`, answered in memory on
the same clock: tests/support/stub_transport.py) with the `openai` preset. Snapshots are
taken every quarter second, as the console would; the ETA each gives is compared with when
the job really ended.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ratedeck.config import load_config
from ratedeck.core.policy import parse_policy
from ratedeck.engine.commands import PauseAll, ResumeAll
from ratedeck.engine.engine import Engine
from ratedeck.engine.observe.progress import ProgressMeter, eta, merge_progress
from ratedeck.engine.snapshot import Progress, Snapshot
from ratedeck.engine.sources.workload import read_jsonl
from ratedeck.server.policy_transport import PolicyTransport
from ratedeck.server.simulated import run_virtual
from ratedeck.server.stubs.openai import OpenAIState
from tests.engine.test_jobs_fed import job_engine
from tests.support.stub_transport import InMemoryStub, loop_clock


def watch(engine: Engine, every_s: float = 0.25, steer=None) -> tuple[list[tuple[float, Progress]], float]:
    """Run `engine` to its end, a snapshot every `every_s`: [(elapsed, progress)] and when it ended."""
    seen, snap = watch_to_end(engine, every_s, steer)
    return seen, snap.makespan.elapsed_s


def watch_to_end(
    engine: Engine, every_s: float = 0.25, steer=None
) -> tuple[list[tuple[float, Progress]], Snapshot]:
    """`watch`, with the run's last snapshot."""
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
    return seen, snap


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
        # slow answers: the headroom their spread needs, not the limits alone, sets the time (the
        # limits alone foresee 29.5 s, a quarter short of the 39 s it takes), and the pace
        # observed at 10% (half of the one to come: the engine still settles) is not the rest's
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
    # the limits' figure, with the engine's headroom: no pace yet
    assert first.least_s is not None and first.eta_s is not None
    assert first.least_s <= first.eta_s <= first.least_s * 1.05
    assert at + first.eta_s == pytest.approx(finished, rel=0.05)
    # and the ETA counts down with the job, never below what the limits allow
    for _, p in seen:
        assert p.eta_s is not None and p.least_s is not None and p.eta_s >= p.least_s


OPENAI_KEYS = [f"sk-proj-eta{i:02d}00000000000000000000" for i in range(5)]
#: The stub's default limits (500 requests and 30,000 tokens a minute per key), for each model.
STUB_DEFAULT = {"rpm": OpenAIState.rpm, "tpm": OpenAIState.tpm}


def openai_job(tmp_path, models: dict[str, dict[str, int]], max_tokens: int, rtt_s: float) -> Engine:
    """3,000 prompts through the `openai` preset as shipped (no tier told) on 5 keys, against the
    OpenAI stub with `models`' limits, lines naming the models in turn."""
    path = tmp_path / "prompts.jsonl"
    names = list(models)
    with path.open("w") as f:
        for i in range(3000):
            body = {
                "model": names[i % len(names)],
                "messages": [{"role": "user", "content": f"prompt {i}: say ok"}],
                "max_tokens": max_tokens,
            }
            f.write(json.dumps({"_id": f"p{i}", "_path": "/v1/chat/completions", "_body": body}) + "\n")
    cfg = load_config(
        preset="openai",
        overrides={
            "target": {"url": "http://openai-stub.invalid", "http_client": "aiohttp"},
            "keys": {"secrets": OPENAI_KEYS},
            "engine": {"graveyard_path": ""},
            "workload": {"file": str(path)},
        },
    )
    stub = OpenAIState(clock=loop_clock, keys=OPENAI_KEYS, models=models)
    return Engine(cfg, InMemoryStub(cfg.engine_settings, stub.handle, rtt_s))


@pytest.mark.parametrize(
    ("models", "max_tokens", "rtt_s", "limits_bind"),
    [
        # requests bind: 500 a minute per key and model, the first 2,500 at once; each key's
        # in-flight size (its rate times the round trip) spends that burst at ~75 a second
        ({"gpt-4o-mini": STUB_DEFAULT}, 16, 0.2, False),
        # tokens bind: 30,000 a minute per key and model, where the preset starts at 200,000 (the
        # first answers' headers tell the tier)
        ({"gpt-4o-mini": STUB_DEFAULT}, 100, 0.2, True),
        # completions of 3 s each: answers come back in waves a round trip apart
        ({"gpt-4o-mini": STUB_DEFAULT}, 16, 3.0, False),
        # two models, each with its own limits on every key: the small one's half of the job
        # binds, at 150 requests a minute per key
        (
            {"gpt-small": {"rpm": 150, "tpm": 30_000}, "gpt-large": {"rpm": 500, "tpm": 200_000}},
            16,
            0.2,
            True,
        ),
    ],
    ids=["requests-bind", "tokens-bind", "slow-completions", "two-models"],
)
def test_an_openai_job_s_eta_at_10_percent_is_within_15_percent_of_the_finish(
    tmp_path, models, max_tokens, rtt_s, limits_bind
):
    """The issue's job: 3,000 prompts on 5 keys, the OpenAI preset's defaults, a server whose
    limits hold per key and model. The least time counts each model's lane in each unit,
    with the limits the first answers tell; the ETA does not extrapolate a burst."""
    engine = openai_job(tmp_path, models, max_tokens, rtt_s)
    seen, snap = watch_to_end(engine)
    finished = snap.makespan.elapsed_s
    at, first = seen[0]
    assert first.total == 3000 and first.eta_s is not None and first.least_s is not None
    at, foreseen = finish_seen_at(seen, 0.10)
    assert foreseen == pytest.approx(finished, rel=0.15), (at, foreseen, finished)
    if limits_bind:  # the makespan's least time counts each model's lanes too
        assert snap.makespan.ratio is not None and 1.0 <= snap.makespan.ratio <= 1.05, snap.makespan


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
    assert items.models is None  # not asked: no limit per model


def test_with_limits_per_model_the_check_pass_counts_each_model_s_lines(tmp_path):
    path = tmp_path / "prompts.jsonl"
    bodies = [{"model": "a"}, {"model": "b"}, {"model": "a"}, {"messages": []}, {"model": "x" * 90}]
    lines = [{"_body": b} for b in bodies] + [{"i": 1}]  # a line with no body
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items = read_jsonl(str(path), model_field="model")
    # by the lane each line's request spends from: no model named is one lane, a long name is cut
    assert items.models == {"a": 2, "b": 1, "-": 2, "x" * 80: 1} and items.count == 6
    # a nested model field, as `target.model_field` names it
    path.write_text(json.dumps({"_body": {"params": {"model": "m"}}}) + "\n")
    assert read_jsonl(str(path), model_field="params.model").models == {"m": 1}


def test_the_eta_is_the_later_of_the_limits_and_the_pace():
    # nothing left: done
    assert eta(0, None, None) == 0.0
    # nothing known: unknown; only the limits: the limits; only a pace: the pace
    assert eta(100, None, None) is None
    assert eta(100, 12.0, None) == 12.0
    assert eta(100, None, 10.0) == pytest.approx(10.0)
    # a pace slower than the limits allow (the answers, not the limits, set it): the pace
    assert eta(100, 5.0, 2.0) == pytest.approx(50.0)
    # a pace faster than the limits allow (a burst being spent) never brings the ETA below them:
    # the limits' least time counts what is left of the burst and then their steady pace
    assert eta(100, 5.0, 1000.0) == 5.0


class _Ended:
    """A job's endings as a meter counts them, on a clock a test moves."""

    def __init__(self):
        self.now = 0.0
        self.succeeded = self.uncertain = self.expired = self.graveyard = self.shed = 0
        self.job_total = 10_000

    def clock(self) -> float:
        return self.now


def paced(rates: list[float], every_s: float = 0.25) -> ProgressMeter:
    """A meter ticked every 0.1 s while jobs end at `rates[i]` a second in second i."""
    ended = _Ended()
    meter = ProgressMeter(ended, None, ended, ended, None)  # type: ignore[arg-type]
    done = 0.0
    for second, rate in enumerate(rates):
        for tenth in range(10):
            ended.now = second + tenth / 10
            done += rate / 10
            ended.succeeded = int(done)
            meter.tick(ended.now)
    ended.now += every_s
    return meter


def test_the_pace_for_the_rest_is_a_steady_or_falling_one_never_a_rising_one():
    # steady: the window's pace
    assert paced([50.0] * 6).rest_pace() == pytest.approx(50.0, rel=0.05)
    # a burst spent at the start, then the refill: the newer half's pace, not the burst's
    falling = paced([400.0, 400.0, 20.0, 20.0, 20.0, 20.0])
    assert falling.pace() > 100 and falling.rest_pace() == pytest.approx(20.0, rel=0.1)
    # still rising (the engine settling its headroom and in-flight sizes): says nothing yet
    rising = paced([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert rising.pace() is not None and rising.rest_pace() is None


def test_a_sample_still_filling_is_not_counted():
    """Jobs ending in bursts of 100 each second (a sliding window's turns), each burst seen by
    two ticks 0.1 s apart: a snapshot between them does not count half a burst."""
    ended = _Ended()
    meter = ProgressMeter(ended, None, ended, ended, None)  # type: ignore[arg-type]
    for second in range(5):
        for tenth in (0, 1):
            ended.now = second + tenth / 10
            ended.succeeded += 50
            meter.tick(ended.now)
            if second == 4 and tenth == 0:
                break
    assert ended.succeeded == 450
    assert meter.pace() == pytest.approx(100.0)  # bursts 1 to 4 of 100 over 3 s, not 350 over 4 s


def test_processes_sharing_a_job_merge_their_progress():
    assert merge_progress([None, None]) is None
    merged = merge_progress([Progress(100, 40, 6.0, 5.0), None, Progress(50, 10, 9.0, 4.0)])
    assert merged == Progress(150, 50, 9.0, 5.0)
    assert merge_progress([Progress(10, 1, None, 2.0), Progress(10, 2, 3.0, 2.0)]).eta_s is None
    assert (
        Progress(0, 0).fraction == 1.0 and Progress(4, 1).fraction == 0.25 and Progress(4, 5).remaining == 0
    )
