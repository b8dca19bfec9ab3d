"""`python -m ratedeck.bench.cli_rows`: the live rows with the real CLI, scored by the server."""

from __future__ import annotations

import pytest

from ratedeck.bench.cli_rows import CPU_ROWS, ROWS, command, figure, main, run_peer, run_row
from ratedeck.bench.scenarios import SCENARIOS


def test_the_command_is_what_a_user_types():
    scenario = SCENARIOS["live-told-wrong"]
    cmd = command(scenario, "http://127.0.0.1:9", ROWS["jitter+probe"][1], 60.0)
    assert cmd[0].endswith("ratedeck") and cmd[1] == "--no-ui"
    assert "--preset" not in cmd and "--config" not in cmd  # the defaults, as a user's run has them
    assert cmd[cmd.index("--limit") + 1] == "25/1s"  # the limit they were told, not the server's
    assert cmd[cmd.index("--target") + 1] == "http://127.0.0.1:9/api/request"
    assert cmd[cmd.index("--probe-url") + 1] == "http://127.0.0.1:9/health"


def test_a_shared_row_is_scored_by_what_the_other_user_left():
    scenario = SCENARIOS["live-shared-keys"]  # 5 keys x 20/1s
    stats = {"keys": [{"other_accepted": 160} for _ in range(5)], "arrivals_ms": [[0.0]] * 5}
    assert figure(scenario, stats, 4_000, 60.0) == pytest.approx(4_000 / (6_000 - 800))
    # no other user: the sustained efficiency of the stamps, one a window / 20 apart
    stamps = [[i * 50.0 for i in range(100)] for _ in range(5)]
    assert figure(scenario, {"keys": [{}] * 5, "arrivals_ms": stamps}, 500, 5.0) == pytest.approx(1.0)


def test_a_real_run_is_scored_from_the_server_s_stamps():
    result = run_row("jitter+timing", 1, 5.0, seed=3)
    assert result.exit_code == 0
    assert result.accepted > 5 * 20  # more than the first windows' burst: paced after it
    assert result.figure is not None and 0.5 < result.figure <= 1.0  # a server that held its limit
    assert result.cpu_us_per_ok is not None and result.cpu_us_per_ok > 0


def test_the_cpu_rows_measure_the_peer_as_a_whole_process_too():
    assert CPU_ROWS <= set(ROWS)
    assert all("aiolimiter" in SCENARIOS[ROWS[row][0]].strategies for row in CPU_ROWS)
    # The peer on a small server of the same kind: its CPU, imports included, and what it got.
    cpu_us, accepted = run_peer(SCENARIOS["live-jitter+timing"], 3.0, seed=3)
    assert accepted > 5 * 20 and cpu_us is not None and cpu_us > 0


@pytest.mark.parametrize(
    "argv, said",
    [(["nope"], "unknown row 'nope'"), (["jitter", "--runs", "0"], "--runs must be 1 to 10")],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
