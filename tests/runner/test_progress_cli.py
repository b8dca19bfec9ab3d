"""A job's progress as a user meets it: the headless block's `jobs` line, the report's
`progress` and the Prometheus series, from the CLI in a child process against the
embedded simulator (the ETA's accuracy is tests/engine/test_progress.py's, on virtual time)."""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from ratedeck.engine.snapshot import Progress, Snapshot
from ratedeck.runner.headless import eta_text, metrics_block, progress_line, summary_lines
from ratedeck.runner.prometheus import families
from ratedeck.runner.report import build_report
from tests.runner.test_metrics_endpoint import RATEDECK, _env, _read_until, _value, scrape
from tests.runner.test_report_schema import validate

JOBS_LINE = re.compile(
    r"^jobs  (?P<done>[\d,]+) of 3,000 \((?P<pct>\d+)%\)  ETA (?P<eta>\d+s|\d+m\d\ds)  least (?P<least>\d+s|\d+m\d\ds)$"
)


@pytest.mark.slow
def test_a_3000_job_run_shows_done_of_total_and_an_eta_in_its_first_block(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(3000)))
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        RATEDECK
        + ["--no-ui", "--workload", str(jobs), "--duration", "2s", "--interval", "500ms"]
        + ["--metrics-port", "0", "--metrics-linger", "2m", "--report", str(report), "--graveyard", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    seen: list[str] = []
    try:
        url = re.search(r"http://\S+/metrics", _read_until(proc.stdout, "metrics at", seen)).group()
        _read_until(proc.stdout, "--- ratedeck metrics at", seen)
        first = proc.stdout.readline()  # the block's first line after its heading
        during = scrape(url)
        _read_until(proc.stdout, "serving the final metrics", seen)
        end = scrape(url)
        proc.send_signal(signal.SIGINT)  # ends the linger
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    m = JOBS_LINE.match(first.rstrip("\n"))
    assert m, first
    done = int(m["done"].replace(",", ""))
    assert 0 < done < 3000 and int(m["pct"]) == 100 * done // 3000
    # 5 keys x 20/1s (100/s) and 90/s arrivals: half a minute for the rest, not a guess from one second
    assert 20 <= _seconds(m["eta"]) <= 45 and _seconds(m["least"]) <= _seconds(m["eta"]), first
    assert _value(during, "ratedeck_job_size") == 3000
    assert 0 < _value(during, "ratedeck_job_done") < 3000
    assert 20 <= _value(during, "ratedeck_job_eta_seconds") <= 45
    assert _value(during, "ratedeck_job_least_seconds") <= _value(during, "ratedeck_job_eta_seconds")
    data = json.loads(report.read_text())
    assert validate(data) == []
    progress = data["progress"]
    assert progress["total"] == 3000 and progress["done"] == _value(end, "ratedeck_job_done")
    assert progress["done"] == data["requests"]["succeeded"] and 0 < progress["fraction"] < 1
    # the run stopped at 2 s, long before the end: no ETA to give, none exported
    assert progress["eta_s"] is None and "ratedeck_job_eta_seconds" not in end
    left = 3000 - progress["done"]
    assert (
        f"jobs  {progress['done']:,} of 3,000 ({100 * progress['done'] // 3000}%)  {left:,} left\n"
        in "".join(seen)
    )


def _seconds(text: str) -> int:
    minutes, _, secs = text.rstrip("s").rpartition("m")
    return int(minutes or 0) * 60 + int(secs)


def test_the_jobs_line_and_its_times():
    assert (
        progress_line(Progress(3000, 1234, 130.2, 121.5))
        == "jobs  1,234 of 3,000 (41%)  ETA 2m11s  least 2m02s"
    )
    assert progress_line(Progress(3000, 2999, None, None)) == "jobs  2,999 of 3,000 (99%)  ETA unknown"
    assert progress_line(Progress(3000, 3000, 0.0, 0.0)) == "jobs  3,000 of 3,000 (100%)"
    assert progress_line(Progress(3000, 180), stopped=True) == "jobs  180 of 3,000 (6%)  2,820 left"
    assert [eta_text(s) for s in (0.2, 59.0, 60.0, 3599.5, 3600.0, 7325.0)] == [
        "1s",
        "59s",
        "1m00s",
        "1h00m",
        "1h00m",
        "2h03m",
    ]
    snap = Snapshot(progress=Progress(10, 4, 3.0, 2.0))
    assert metrics_block(snap)[1] == "jobs  4 of 10 (40%)  ETA 3s  least 2s"
    assert "jobs  4 of 10 (40%)  ETA 3s  least 2s" in summary_lines(snap)
    assert not any(line.startswith("jobs") for line in metrics_block(Snapshot()))


def test_the_report_and_prometheus_carry_a_job_s_progress():
    snap = Snapshot(progress=Progress(3000, 1234, 130.25, 121.5))
    report = build_report(snap)
    assert validate(report) == []
    assert report["progress"] == {
        "total": 3000,
        "done": 1234,
        "fraction": 0.4113,
        "eta_s": 130.25,
        "least_s": 121.5,
    }
    samples = {s.name: s.value for family in families(snap) for s in family.samples}
    assert samples["ratedeck_job_size"] == 3000 and samples["ratedeck_job_done"] == 1234
    assert samples["ratedeck_job_eta_seconds"] == 130.25 and samples["ratedeck_job_least_seconds"] == 121.5
    # endless work: no progress anywhere
    assert "progress" not in build_report(Snapshot())
    assert not [f for f in families(Snapshot()) if f.name.startswith("ratedeck_job_")]
