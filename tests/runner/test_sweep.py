"""`ratedeck sweep`: argument errors and the JSON report's stable names."""

import json

import pytest

from ratedeck.runner.sweep import main, parse_rates


@pytest.mark.parametrize(
    "argv, where",
    [
        (["--rates", "10:5:1"], "--rates"),
        (["--rates", "10:50"], "--rates"),
        (["--rates", "a:b:c"], "--rates"),
        (["--calls", "0"], "--calls"),
        (["--calls", "three"], "--calls"),
        (["--pattern", "zigzag"], "--pattern"),
        (["--duration", "0"], "--duration"),
        (["--limit", "fast"], "--limit"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(argv, where, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and where in err and "Traceback" not in err


def test_rates_are_inclusive():
    assert parse_rates("10:30:10") == [10, 20, 30]
    assert parse_rates("5:5:1") == [5]


def test_a_tiny_sweep_reports_with_stable_names(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    assert main(["--calls", "3", "--rates", "10:100:90", "--duration", "3", "--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "goodput off" in out and "throttle auto" in out and "\x1b[" not in out
    report = json.loads(path.read_text())
    assert report["capacity_tps"] == 100 and report["calls_per_message"] == 3
    assert report["pattern"] == "parallel"
    points = report["points"]
    assert [(p["arrival_rate"], p["throttle"]) for p in points] == [
        (10, "off"),
        (10, "auto"),
        (100, "off"),
        (100, "auto"),
    ]
    for p in points:
        assert set(p) >= {"arrival_rate", "throttle", "goodput", "messages_failed", "calls_wasted"}
    by = {(p["arrival_rate"], p["throttle"]): p for p in points}
    assert by[(100, "auto")]["goodput"] > by[(100, "off")]["goodput"]
