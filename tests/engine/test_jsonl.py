"""One JSONL writer for the graveyard, the shed messages and --results: lines reach the file as
they are written, and a failure is one line of problem, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratedeck.engine.jsonl import JsonLines
from ratedeck.server.simulated import run_virtual
from tests.engine.test_multicall import message_engine


def test_lines_reach_the_file_at_once_and_an_append_file_keeps_what_was_there(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"old": 1}\n')
    out = JsonLines(str(path), "graveyard")
    assert out.write({"id": 1, "at": Path("x")})  # what JSON cannot hold is written as text
    assert path.read_text().splitlines()[-1] == '{"id": 1, "at": "x"}'  # flushed: readable now
    assert out.write_lines(['{"id": 2}', '{"id": 3}']) and out.written == 3
    out.close()
    assert out.write({"id": 4})  # opened again after close: appended, never emptied
    out.close()
    assert [json.loads(x).get("id") for x in path.read_text().splitlines()] == [None, 1, 2, 3, 4]


def test_a_fresh_file_is_emptied_at_once_and_only_once(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("from an earlier run\n")
    out = JsonLines(str(path), "results", fresh=True)
    assert path.read_text() == "" and out.problem is None
    out.write({"id": 1})
    out.close()
    out.write({"id": 2})
    out.close()
    assert path.read_text().splitlines() == ['{"id": 1}', '{"id": 2}']


@pytest.mark.parametrize("fresh", [False, True])
def test_a_path_that_cannot_be_written_is_one_line_of_problem(tmp_path, fresh):
    out = JsonLines(str(tmp_path / "no" / "such" / "dir.jsonl"), "results", fresh=fresh)
    assert out.write({"id": 1}) is False and out.written == 0
    assert out.problem == f"cannot write results {tmp_path}/no/such/dir.jsonl: No such file or directory"
    assert out.write({"id": 2}) is False and "\n" not in out.problem  # no later line is tried
    out.close()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_write_that_fails_after_the_open_stops_the_file_and_says_why():
    out = JsonLines("/dev/full", "graveyard")
    assert out.write({"id": 1}) is False and out.written == 0
    assert out.problem == "cannot write graveyard /dev/full: No space left on device"
    out.close()  # closing a failed file raises nothing, and keeps the first problem
    assert out.problem == "cannot write graveyard /dev/full: No space left on device"


def test_a_circular_record_is_a_problem_not_a_traceback(tmp_path):
    out = JsonLines(str(tmp_path / "g.jsonl"), "graveyard")
    loop: dict = {}
    loop["self"] = loop
    assert out.write(loop) is False and out.problem.startswith("cannot write graveyard")


def test_shed_lines_that_cannot_be_written_are_one_problem_and_still_counted(tmp_path):
    engine = message_engine(rate=30, throttle=10.0, excess="shed", shed_path=str(tmp_path))  # a directory
    snap = run_virtual(engine.run(4))
    assert snap.messages.shed > 20 and snap.balance() == 0
    problems = [p for p in engine.parts.ends.problems if "shed" in p]
    assert problems == [f"cannot write shed messages to {tmp_path}: Is a directory"]
