"""Batch files through the CLI (a subprocess) to the real OpenAI and Anthropic stubs on loopback:
an OpenAI Batch or Anthropic Message Batches file in, that API's output file out, one line per
custom_id; bad lines refused before anything is sent; a SQLite store run killed and resumed
still answers every custom_id exactly once."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.openai import start_openai

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEYS = ["sk-test-batch-000000000000001", "sk-test-batch-000000000000002"]


def run_async(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 90))

    return run


def openai_lines(n: int, prefix: str = "req") -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 10 + i % 7,
            },
        }
        for i in range(n)
    ]


def anthropic_lines(n: int) -> list[dict]:
    return [
        {
            "custom_id": f"msg-{i}",
            "params": {
                "model": "claude-3-5-haiku-latest",
                "max_tokens": 8 + i % 5,
                "messages": [{"role": "user", "content": f"question {i}"}],
            },
        }
        for i in range(n)
    ]


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def env_for(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"))


async def cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *RATEDECK,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env=env_for(tmp_path),
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# ---------------------------------------------------------------- a file in, the API's file out


@run_async
async def test_an_openai_batch_file_gets_one_output_line_per_custom_id_with_the_servers_answers(tmp_path):
    lines = openai_lines(12)
    lines.append({**lines[0], "custom_id": "wrong-url", "url": "/v1/nowhere"})  # a 404, as it is
    work = write(tmp_path / "batch.jsonl", lines)
    out, errors = tmp_path / "output.jsonl", tmp_path / "errors.jsonl"
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        code, stdout, stderr = await cli(
            tmp_path, "--no-ui", "--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS),
            "--workload", str(work), "--results", str(out), "--errors", str(errors),
        )  # fmt: skip
        answered = {a.id: a for a in stub.state.answered}
        assert stub.state.book.duplicates() == 0
    assert code == 0, stderr
    good, bad = read(out), read(errors)
    assert sorted(x["custom_id"] for x in good) == sorted(x["custom_id"] for x in lines[:-1])
    for x in good:
        assert set(x) == {"id", "custom_id", "response", "error"} and x["error"] is None
        assert x["id"].startswith("batch_req_")
        response = x["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_stub")
        body = response["body"]
        i = int(x["custom_id"].split("-")[1])
        # The stub's own answer to this very line: its text, and half its max_tokens.
        assert body["choices"][0]["message"]["content"] == answered[body["id"]].text
        assert body["usage"]["completion_tokens"] == math.ceil((10 + i % 7) / 2)
    assert len({x["response"]["request_id"] for x in good}) == len(good)
    # The Batch API's error file: the answer of the line that failed, as the server gave it.
    (miss,) = bad
    assert miss["custom_id"] == "wrong-url" and miss["error"] is None
    assert (
        miss["response"]["status_code"] == 404
        and "Invalid URL" in miss["response"]["body"]["error"]["message"]
    )
    assert f"results: 13 requests in {out} (errors in {errors})" in stdout
    assert not any(k in out.read_text() + errors.read_text() + stdout + stderr for k in KEYS)


@run_async
async def test_an_anthropic_batch_file_gets_its_results_format(tmp_path):
    lines = anthropic_lines(8)
    bad_params = {k: v for k, v in lines[0]["params"].items() if k != "max_tokens"}
    lines.append({"custom_id": "no-max-tokens", "params": bad_params})  # a 400 from the API
    work = write(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "results.jsonl"
    async with await start_anthropic(keys=KEYS, rpm=1000, itpm=1_000_000, otpm=1_000_000) as stub:
        code, _, stderr = await cli(
            tmp_path, "--no-ui", "--preset", "anthropic", "--target", stub.url, "--keys", ",".join(KEYS),
            "--workload", str(work), "--results", str(out),
        )  # fmt: skip
        answered = {a.id: a for a in stub.state.answered}
    assert code == 0, stderr
    got = read(out)
    assert Counter(x["custom_id"] for x in got) == Counter(x["custom_id"] for x in lines)
    by_id = {x["custom_id"]: x for x in got}
    for line in lines[:-1]:
        x = by_id[line["custom_id"]]
        assert x["result"]["type"] == "succeeded" and x["request_id"].startswith("req_stub")
        message = x["result"]["message"]
        assert message["type"] == "message" and message["content"][0]["text"] == answered[message["id"]].text
        assert message["usage"]["output_tokens"] == math.ceil(line["params"]["max_tokens"] / 2)
    errored = by_id["no-max-tokens"]["result"]
    assert errored["type"] == "errored"
    assert (
        errored["error"]["type"] == "error" and errored["error"]["error"]["type"] == "invalid_request_error"
    )


@run_async
async def test_a_capped_run_answers_the_lines_it_never_sent_as_cancelled(tmp_path):
    lines = openai_lines(10)
    work = write(tmp_path / "batch.jsonl", lines)
    out = tmp_path / "output.jsonl"
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        code, _, stderr = await cli(
            tmp_path, "--no-ui", "--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS),
            "--workload", str(work), "--results", str(out), "--total", "4",
        )  # fmt: skip
        sent = len(stub.ledger.accepted())
    assert code == 0, stderr
    got = read(out)
    assert Counter(x["custom_id"] for x in got) == Counter(x["custom_id"] for x in lines)
    answered = [x for x in got if x["response"] is not None]
    cancelled = [x for x in got if x["response"] is None]
    assert len(answered) == sent == 4
    assert all(x["error"]["code"] == "batch_cancelled" for x in cancelled) and len(cancelled) == 6


# ---------------------------------------------------------------- bad files, before anything is sent


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (
            [*openai_lines(3), openai_lines(1)[0]],
            "line 4: custom_id 'req-0' is also the custom_id of line 1: ids must be unique",
        ),
        (
            [*anthropic_lines(2), {"custom_id": "x", "params": "hello"}],
            "line 3: params must be a JSON object",
        ),
        (
            [*openai_lines(2), "", {**openai_lines(1)[0], "custom_id": "z", "url": "chat"}],
            "line 4: url must be",
        ),
    ],
)
def test_a_bad_batch_line_exits_2_in_one_line_naming_it(tmp_path, lines, needle):
    import subprocess

    work = write(tmp_path / "batch.jsonl", lines)
    for argv in (
        ["--no-ui", "--target", "http://127.0.0.1:9", "--keys", KEYS[0], "--workload", str(work)],
        ["enqueue", "--store", f"sqlite:{tmp_path / 'jobs.db'}", str(work)],
    ):
        proc = subprocess.run(
            [*RATEDECK, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env_for(tmp_path),
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"batch.jsonl: {needle}" in proc.stderr, proc.stderr
    assert not (tmp_path / "jobs.db").exists() or "0 pending" not in proc.stdout


# ---------------------------------------------------------------- a store, a kill, a resume


async def stop_when(out: Path, proc: asyncio.subprocess.Process, written: int, sig: signal.Signals) -> None:
    """Send `sig` to the run once its results file holds `written` lines."""
    deadline = time.monotonic() + 30
    while (done := out.read_text().count("\n") if out.exists() else 0) < written:
        assert proc.returncode is None, "the run ended before it could be stopped"
        assert time.monotonic() < deadline, f"only {done} lines written"
        await asyncio.sleep(0.01)
    proc.send_signal(sig)
    await asyncio.wait_for(proc.wait(), 30)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "again"), [(signal.SIGKILL, ("--resume",)), (signal.SIGTERM, ())])
@run_async
async def test_a_store_run_stopped_and_run_again_answers_every_custom_id_exactly_once(tmp_path, sig, again):
    """120 prompts enqueued in SQLite, the run stopped a quarter of the way, then run again on the
    same results file: after a kill -9 (in flight and unjournaled endings lost with it) with
    `--resume`; after SIGTERM (a drain: the queued go back to pending, unwritten) as it is. Every
    custom_id once, each with the stub's answer."""
    lines = openai_lines(120)
    db, out = tmp_path / "jobs.db", tmp_path / "output.jsonl"
    code, _, err = await cli(
        tmp_path, "enqueue", "--store", f"sqlite:{db}", str(write(tmp_path / "b.jsonl", lines))
    )
    assert code == 0, err
    # Two keys of 20 requests per 2 s minute: about 6 s of limit for the job.
    async with await start_openai(keys=KEYS, rpm=20, tpm=1_000_000, minute_s=2.0, latency=0.1) as stub:
        run = ["--no-ui", "--preset", "openai", "--target", stub.url, "--keys", ",".join(KEYS)]
        run += ["--store", f"sqlite:{db}", "--results", str(out)]
        proc = await asyncio.create_subprocess_exec(
            *RATEDECK,
            *run,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=tmp_path,
            env=env_for(tmp_path),
        )
        await stop_when(out, proc, 30, sig)
        first = [json.loads(x) for x in out.read_text().split("\n")[:-1]]  # whole lines (a kill -9)
        code, _, err = await cli(tmp_path, *run, *again)
        assert code == 0, err
        answered = {a.id for a in stub.state.answered}
    assert 30 <= len(first) < len(lines)
    got = read(out)
    counts = Counter(x["custom_id"] for x in got)
    assert counts == Counter(x["custom_id"] for x in lines), [c for c, n in counts.items() if n != 1]
    assert got[: len(first)] == first  # the resumed run appended to what the stopped one wrote
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["id"] in answered for x in got)


# ---------------------------------------------------------------- the results file itself


class Host:
    """What a results file reads of an engine (`ports.ResultsHost`), for a file written by hand."""

    def redact(self, text: str, limit: int | None = None) -> str:
        return text if limit is None else text[:limit]

    def clock(self) -> float:
        return 0.0

    def wall_time(self, t: float) -> float:
        return t

    def queued(self) -> list:
        return []

    def in_flight_requests(self) -> list:
        return []


def test_a_resumed_store_run_writes_no_custom_id_the_file_holds_and_cuts_a_partial_last_line(tmp_path):
    """A kill -9 can come after a line was written and before its ending reached the store: the
    resumed run sends it again, and its second answer must not make a second line."""
    from ratedeck.core.vocab import Ending
    from ratedeck.engine.observe.results import ResultsFile
    from ratedeck.engine.request import Request

    out = tmp_path / "output.jsonl"
    out.write_text(json.dumps({"custom_id": "a", "response": None}) + "\n" + '{"custom_id": "b", "resp')

    def request(custom_id: str) -> Request:
        req = Request(1, 0.0, 10.0, params={"_batch": "openai"})
        req.line_id, req.last_status = custom_id, 500
        return req

    results = ResultsFile(str(out), Host(), store=True, append=True, resume=True)
    for custom_id in ("a", "b", "c", "c"):
        results.finished(request(custom_id), Ending.GRAVEYARD)
    results.finished(request("d"), Ending.SUCCEEDED)
    results.close()
    got = read(out)  # every line whole again
    assert [x["custom_id"] for x in got] == ["a", "b", "c", "d"]
    assert results.written == 3
    # A store run without --resume adds to the file, and writes whatever it ends.
    again = ResultsFile(str(out), Host(), store=True, append=True)
    again.finished(request("a"), Ending.SUCCEEDED)
    again.close()
    assert [x["custom_id"] for x in read(out)] == ["a", "b", "c", "d", "a"]
    fresh = ResultsFile(str(out), Host())  # a file run: a new file
    fresh.close()
    assert out.read_text() == ""


@run_async
async def test_errors_splits_a_ratedeck_workloads_failed_lines_out_and_a_bad_path_is_exit_2(tmp_path):
    lines = [
        {"_id": f"p{i}", "_path": "/v1/chat/completions", "_body": x["body"]}
        for i, x in enumerate(openai_lines(3))
    ]
    lines.append({"_id": "lost", "_path": "/v1/nowhere", "_body": {"model": "gpt-4o-mini"}})
    work = write(tmp_path / "prompts.jsonl", lines)
    out, errors = tmp_path / "answers.jsonl", tmp_path / "failed.jsonl"
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        run = [
            "--no-ui",
            "--preset",
            "openai",
            "--target",
            stub.url,
            "--keys",
            KEYS[0],
            "--workload",
            str(work),
        ]
        code, _, stderr = await cli(tmp_path, *run, "--results", str(out), "--errors", str(errors))
        assert code == 0, stderr
        code, _, stderr = await cli(tmp_path, *run, "--errors", str(tmp_path / "no-such-dir" / "e.jsonl"))
        assert code == 2 and "errors" in stderr and "no such directory" in stderr, stderr
    good, bad = read(out), read(errors)
    assert sorted(x["line_id"] for x in good) == ["p0", "p1", "p2"] and all(
        x["ending"] == "succeeded" for x in good
    )
    assert [(x["line_id"], x["ending"], x["status"]) for x in bad] == [("lost", "graveyard", 404)]


def test_a_run_split_over_processes_refuses_errors_as_it_does_results():
    from ratedeck.config import load_config
    from ratedeck.host.shards import ShardError, shard_configs

    cfg = load_config(preset="study", overrides={"keys": {"secrets": ["k1-000000000001", "k2-000000000002"]}})
    assert len(shard_configs(cfg, 2)) == 2
    with pytest.raises(ShardError, match="--errors"):
        shard_configs(
            load_config(
                preset="study",
                overrides={
                    "keys": {"secrets": ["k1-000000000001", "k2-000000000002"]},
                    "run": {"errors": "e.jsonl"},
                },
            ),
            2,
        )


def test_a_batch_output_line_keeps_an_answer_past_64_kib_whole_and_names_its_request_id(tmp_path):
    from ratedeck.core.vocab import Ending
    from ratedeck.engine.http.outcome import OK, Outcome
    from ratedeck.engine.http.transport import Response
    from ratedeck.engine.observe.results import RESULTS_BODY_CHARS, ResultsFile
    from ratedeck.engine.request import Request

    answer = {"id": "chatcmpl-1", "choices": [{"message": {"content": "word " * RESULTS_BODY_CHARS}}]}
    headers = {"Content-Type": "application/json", "x-request-id": "req_big"}
    req = Request(1, 0.0, 10.0, params={"_batch": "openai"})
    req.line_id, req.last_status = "big", 200
    req.result = Outcome(OK, 200, response=Response(200, headers, json.dumps(answer).encode()))
    plain = Request(2, 0.0, 10.0)
    plain.result = req.result
    out = tmp_path / "output.jsonl"
    results = ResultsFile(str(out), Host(), body=True)
    results.finished(req, Ending.SUCCEEDED)
    results.finished(plain, Ending.SUCCEEDED)
    results.close()
    batch, ours = read(out)
    assert batch["response"] == {"status_code": 200, "request_id": "req_big", "body": answer}
    assert isinstance(ours["body"], str) and len(ours["body"]) <= RESULTS_BODY_CHARS  # a ratedeck line is cut


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b"", b""),
        (b'{"a": 1}\n', b'{"a": 1}\n'),
        (b'{"a": 1}\n{"b": ', b'{"a": 1}\n'),
        (b'{"b": ', b""),
        (b'{"a": 1}\n' + b"x" * 200_000, b'{"a": 1}\n'),  # a cut line longer than a block
    ],
)
def test_a_kill_9s_cut_last_line_is_cut_off_before_a_store_run_adds_to_the_file(tmp_path, before, after):
    from ratedeck.engine.observe.results import cut_partial_line

    path = tmp_path / "output.jsonl"
    path.write_bytes(before)
    cut_partial_line(str(path))
    assert path.read_bytes() == after
    cut_partial_line(str(tmp_path / "none.jsonl"))  # no file yet: nothing to mend
    assert not (tmp_path / "none.jsonl").exists()
