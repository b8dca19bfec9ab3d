"""`ratedeck bench --scenarios jobs`: the group, its rows, its table."""

from __future__ import annotations

import pytest

from ratedeck.bench import parse_args
from ratedeck.bench.jobs import least_for, run_strategy
from ratedeck.bench.output import ScenarioResult, scenario_table
from ratedeck.bench.scenarios import DEFAULT_SCENARIOS, GROUPS, JOB_SCENARIOS, JobScenario


def test_the_jobs_group_is_its_own_and_the_default_is_unchanged():
    assert GROUPS["jobs"] == ("jobs-sliding", "jobs-bucket", "jobs-fixed")
    assert DEFAULT_SCENARIOS == ("seed", "seed+jitter", "many-keys")
    args = parse_args(["--scenarios", "jobs", "--strategies", "ratedeck,aiolimiter"])
    assert args.scenarios == ["jobs-sliding", "jobs-bucket", "jobs-fixed"]
    assert args.strategies == ["ratedeck", "aiolimiter"]


def test_each_job_scenario_is_about_twelve_seconds_of_limit():
    for s in JOB_SCENARIOS.values():
        assert 10.0 <= least_for(s, 1_700_000_000.0) <= 14.0, s.name
    # 250 jobs of mean cost 1.5 on 5 buckets of 20 draining 5/s: (375 - 100) / 25 = 11 s, plus 6 ms
    assert least_for(JOB_SCENARIOS["jobs-bucket"], 0.0) == pytest.approx(11.006)


def test_a_job_row_and_its_table():
    tiny = JobScenario("tiny", "60 jobs, 2 keys x 20/1s", "20/1s", 2, 60)
    row = run_strategy(tiny, "ratedeck", loop_name="asyncio")
    assert row["jobs"] == 60 and row["units"] == 60 and row["rejected_429"] == 0
    assert row["least_s"] == pytest.approx(1.006) and row["ratio"] == pytest.approx(
        row["elapsed_s"] / row["least_s"], abs=1e-3
    )
    text = scenario_table(ScenarioResult("tiny", tiny.summary, tiny.capacity_tps, [row]), 20.0)
    lines = text.splitlines()
    assert lines[0] == "tiny: 60 jobs, 2 keys x 20/1s"
    assert lines[1].split() == ["strategy", "jobs", "elapsed", "s", "least", "s", "ratio", "429s", "units"]
    assert lines[3].split()[:2] == ["ratedeck", "60"] and lines[3].split()[4] == f"{row['ratio']:.3f}"
