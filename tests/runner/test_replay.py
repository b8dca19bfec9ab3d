"""Results files and `ratedeck replay`: every request written once, flushed as it ends; the
graveyard carries whole requests; replay sends exactly those requests again.

The target is a loopback server that fails 5% of the work for good (400 for the items in
`BAD`) and records every item it is sent, with the query string's `phase`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from ratedeck.runner.replay import ENDINGS, read_requests
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEY = "replay-test-key-7777"
ITEMS = 100
BAD = {i for i in range(ITEMS) if i % 20 == 7}  # 5%, refused for good


class RecordingServer:
    """aiohttp on loopback in its own thread: 400 for items in BAD, 200 otherwise."""

    def __init__(self):
        self.seen: list[tuple[str, dict]] = []  # (phase, query without the key)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        assert query.pop("api_key", None) == KEY
        self.seen.append((query.pop("phase", ""), query))
        if int(query.get("item", -1)) in BAD:
            return web.Response(status=400, text="item refused for good")
        return web.Response(text=json.dumps({"ok": True, "item": query.get("item")}))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/api", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def items(self, phase: str) -> Counter:
        return Counter(int(q["item"]) for p, q in self.seen if p == phase)

    def params(self, phase: str) -> dict[int, dict]:
        return {int(q["item"]): q for p, q in self.seen if p == phase}


def _cli(tmp_path, *argv, timeout=60):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    return subprocess.run(
        RATEDECK + list(argv), capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env
    )


def _run_flags(url: str, phase: str) -> list[str]:
    return [
        "--no-ui",
        "--target",
        f"{url}?phase={phase}",
        "--keys",
        KEY,
        "--key-param",
        "api_key",
        "--nonce-param",
        "none",
        "--limit",
        "400/1s",
        "--in-flight",
        "8",
        "--interval",
        "10s",
    ]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_replay_of_the_graveyard_sends_exactly_the_failed_requests_again(tmp_path):
    workload = tmp_path / "work.jsonl"
    workload.write_text(
        "".join(json.dumps({"item": i, "note": f"n{i}", "size": i * 10}) + "\n" for i in range(ITEMS))
    )
    graveyard, results, report = tmp_path / "dead.jsonl", tmp_path / "results.jsonl", tmp_path / "report.json"
    with RecordingServer() as server:
        first = _cli(
            tmp_path,
            *_run_flags(server.url, "first"),
            "--workload",
            str(workload),
            "--graveyard",
            str(graveyard),
            "--results",
            str(results),
            "--results-body",
            "--report",
            str(report),
        )
        assert first.returncode == 0, first.stderr
        assert server.items("first") == Counter(range(ITEMS))

        buried = _lines(graveyard)
        assert {b["params"]["item"] for b in buried} == BAD and len(buried) == len(BAD)
        for b in buried:
            assert b["ending"] == "graveyard" and b["last_status"] == 400 and b["reason"]
            assert b["params"] == {
                "item": b["params"]["item"],
                "note": f"n{b['params']['item']}",
                "size": b["params"]["item"] * 10,
            }

        lines = _lines(results)
        assert len(lines) == ITEMS and len({x["id"] for x in lines}) == ITEMS  # every request once
        endings = Counter(x["ending"] for x in lines)
        assert endings == {"succeeded": ITEMS - len(BAD), "graveyard": len(BAD)}
        for x in lines:
            assert x["key"] == "k1" and x["attempts"] == 1 and x["params"]["item"] in range(ITEMS)
            assert x["created_at"] <= x["first_sent_at"] <= x["done_at"] and x["latency_ms"] > 0
            assert x["total_ms"] >= x["latency_ms"] and x["queue_wait_ms"] >= 0
            assert x["status"] == (400 if x["params"]["item"] in BAD else 200)
            if x["status"] == 200:
                assert json.loads(x["body"]) == {"ok": True, "item": str(x["params"]["item"])}
        text = results.read_text() + graveyard.read_text() + first.stdout + first.stderr
        assert KEY not in text
        data = json.loads(report.read_text())
        assert validate(data) == [] and data["requests"]["graveyard"] == len(BAD)

        again = _cli(tmp_path, "replay", str(graveyard), *_run_flags(server.url, "replay"))
        # The server refuses these again: a run where nothing succeeded exits 1 and says so.
        assert again.returncode == 1, again.stderr
        assert f"nothing succeeded: {len(BAD)} of {len(BAD)} attempts failed (HTTP 400" in again.stderr
        assert f"replay: {len(BAD)} requests" in again.stderr
        assert server.items("replay") == Counter(BAD)  # exactly those, once each
        for item, query in server.params("replay").items():
            assert query["note"] == f"n{item}" and query["size"] == str(item * 10)  # original parameters

        # From the results file: the same requests (all but succeeded), or every one with --all.
        from_results = _cli(tmp_path, "replay", str(results), *_run_flags(server.url, "results"))
        assert from_results.returncode == 1, from_results.stderr  # refused again: nothing succeeded
        assert server.items("results") == Counter(BAD)
        every = _cli(tmp_path, "replay", str(results), "--all", *_run_flags(server.url, "all"))
        assert every.returncode == 0 and server.items("all") == Counter(range(ITEMS))


def test_replay_reads_both_files_and_skips_what_it_cannot_send(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        json.dumps({"id": 1, "ending": "graveyard", "params": {"a": 1}, "pool": "read"})
        + "\n"
        + json.dumps({"id": 2, "ending": "succeeded", "params": {"a": 2}, "pool": None})
        + "\n"
        + json.dumps({"id": 3, "ending": "expired", "params": {}, "pool": None})
        + "\n"
        + json.dumps({"id": 4, "attempts": 5, "last_error": "timed out"})  # an older graveyard line
        + "\n"
        + "\n"
        + '{"id": 5, "ending": "queued", "params": {"a"'  # cut short by a kill -9
    )
    got = read_requests(path)
    assert got.items == [{"a": 1, "_pool": "read"}, {}]
    assert (got.skipped_broken, got.skipped_no_params, got.skipped_ending) == (1, 1, 1)
    assert len(got.notes()) == 3
    assert read_requests(path, None).items == [{"a": 1, "_pool": "read"}, {"a": 2}, {}]
    assert read_requests(path, ("succeeded",)).items == [{"a": 2}]
    assert set(ENDINGS) >= {"succeeded", "expired", "graveyard", "shed", "queued", "in_flight"}


def test_replay_input_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from ratedeck.runner.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"ending": "graveyard", "params": {"a": 1}}) + "\n")
    for argv, needle in (
        (["replay", str(tmp_path / "nope.jsonl"), "--no-ui"], "cannot read"),
        (["replay", str(path), "--only", "lost", "--no-ui"], "--only"),
        (["replay", str(path), "--workload", str(path), "--no-ui"], "--workload"),
        (["replay", str(path), "--no-ui", "--duration", "5 parsecs"], "--duration"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    assert main(["replay", str(path), "--only", "succeeded", "--no-ui"]) == 0  # nothing to replay
    assert "nothing to replay" in capsys.readouterr().err


@pytest.mark.slow
def test_a_kill_9_leaves_at_most_a_partial_last_line(tmp_path):
    """Lines are flushed as requests end: after a kill -9 every line but the last is whole."""
    results = tmp_path / "results.jsonl"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    proc = subprocess.Popen(
        RATEDECK + ["--no-ui", "--interval", "500ms", "--results", str(results), "--graveyard", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        for line in proc.stdout:  # wait for real traffic, not for wall time
            if line.startswith("requests") and "succeeded 0 " not in line:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    lines = results.read_text().split("\n")
    whole = [json.loads(x) for x in lines[:-1]]  # everything before the last newline parses
    assert len(whole) > 10 and all(x["ending"] for x in whole)
    got = read_requests(results, None)
    assert len(got.items) == len(whole) and got.skipped_broken == (1 if lines[-1] else 0)
