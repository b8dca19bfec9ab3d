"""Prompts as workload lines (issue 24): an object `_body` goes out as it is, `_id` links a
results line to its line, and both survive replay and a store.

Real loopback servers (aiohttp) for the transport, the OpenAI stub for the end-to-end run
through the CLI in a subprocess, a real SQLite file and a real redis-server for the stores.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from ratedeck.config import load_config
from ratedeck.core.vocab import Ending
from ratedeck.engine.http.outcome import OK, Outcome
from ratedeck.engine.http.transport import HttpTransport, Response
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.settings import ConfigError, KeySpec, TargetConfig
from ratedeck.engine.sources.workload import LineRules, Workload, read_jsonl, take_shape
from ratedeck.runner.replay import read_requests, workload_file
from ratedeck.server.stubs.llm_common import prompt_identity
from ratedeck.server.stubs.openai import start_openai

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
SECRET = "sk-test-0123456789abcdef"
KEY = KeySpec(label="k1", secret=SECRET, policies=())
PROMPT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say «hi» & go"}],
    "max_tokens": 20,
}


def run_async(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 60))

    return run


def write_lines(tmp_path: Path, lines: list, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


async def run_cli(cwd: Path, env: dict[str, str], *argv: str) -> tuple[int, str]:
    """The real CLI in a subprocess: its exit code and what it wrote to stderr."""
    proc = await asyncio.create_subprocess_exec(
        *RATEDECK, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd, env=env
    )
    _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


class Recorder:
    """A loopback aiohttp server recording (method, path, query string, headers, body); answers JSON."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, dict, bytes]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append((request.method, request.path, request.query_string, dict(request.headers), body))
        return web.json_response({"echo": len(body)})

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def shaped(line: dict) -> Request:
    """A request made from a workload line as `Workload.run` makes it."""
    params = dict(line)
    line_id = params.pop("_id", None)
    req = Request(1, 0.0, 100.0, params=params or None)
    req.shape = take_shape(params)
    req.line_id = line_id
    return req


# ---------------------------------------------------------------- the wire


@run_async
async def test_an_object_body_goes_out_as_it_is_with_the_key_header_and_nothing_added():
    async with Recorder() as server:
        target = TargetConfig(
            url=f"{server.url}/base?fixed=1",
            method="GET",
            key_header="Authorization",
            nonce_param="nonce",
            id_param="rid",
            params={"static": "yes"},
            headers={"X-Team": "ops"},
        )
        t = HttpTransport(target, target.url, 4)
        line = {"_id": "q17", "_path": "/v1/chat/completions", "_body": PROMPT, "note": "own field"}
        req = shaped(line)
        try:
            out = await t.send(KEY, req, 7)
            again = await t.send(KEY, req, 8)  # a retry: the same bytes, encoded once
            put = await t.send(KEY, shaped({"_method": "put", "_body": [1, {"a": None}]}), 9)
        finally:
            await t.close()
    assert out.kind is OK and again.kind is OK and put.kind is OK
    method, path, query, headers, body = server.seen[0]
    assert (method, path, query) == ("POST", "/v1/chat/completions", "")  # no nonce, id, params, key
    assert json.loads(body) == PROMPT and b"note" not in body and b"q17" not in body
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == f"Bearer {SECRET}" and headers["X-Team"] == "ops"
    assert server.seen[1][4] == body
    assert req.shape is not None and req.shape.payload == body
    # No _path: the target's own URL (its own query kept), nothing added to it.
    method, path, query, headers, body = server.seen[2]
    assert (method, path, query) == ("PUT", "/base", "fixed=1")
    assert json.loads(body) == [1, {"a": None}] and headers["Content-Type"] == "application/json"


@run_async
async def test_a_key_param_target_puts_no_key_in_an_object_body_or_its_query():
    async with Recorder() as server:
        target = TargetConfig(url=f"{server.url}/x", key_header="", key_param="api_key")
        t = HttpTransport(target, target.url, 4)
        try:
            await t.send(KEY, shaped({"_body": {"q": 1}, "api_key": "not sent either"}), None)
        finally:
            await t.close()
    method, _path, query, headers, body = server.seen[0]
    assert method == "POST" and query == "" and json.loads(body) == {"q": 1}
    assert SECRET not in json.dumps(headers) and SECRET.encode() not in body


def test_a_shape_with_an_object_body_is_still_frozen_and_hashable():
    a, b = take_shape({"_body": {"x": [1]}}), take_shape({"_body": {"x": [1]}})
    assert a is not None and a == b and hash(a) == hash(b) and a.method == "POST"
    with pytest.raises(AttributeError):
        a.body = "form"  # type: ignore[misc]
    assert take_shape({"_body": "json"}) == Shape(body="json")  # the old meaning, no payload


# ---------------------------------------------------------------- refused up front


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"_body": 3}, "_body must be"),
        ({"_body": True}, "_body must be"),
        ({"_body": None}, "_body must be"),
        ({"_body": "yaml"}, "_body must be"),
        ({"_method": "GET", "_body": {"q": 1}}, "_method GET cannot send an object _body"),
        ({"_id": 1.5}, "_id must be a string or a whole number"),
        ({"_id": True}, "_id must be a string or a whole number"),
        ({"_id": {"a": 1}}, "_id must be a string or a whole number"),
    ],
)
def test_a_bad_line_is_refused_naming_file_line_and_problem(tmp_path, bad, needle):
    path = write_lines(tmp_path, [{"_id": "a", "_body": PROMPT}, bad])
    with pytest.raises(ConfigError) as err:
        read_jsonl(str(path))
    text = str(err.value)
    assert "prompts.jsonl" in text and "line 2" in text and needle in text and "\n" not in text


def test_a_repeated_id_names_both_lines_and_7_is_not_7_quoted(tmp_path):
    path = write_lines(tmp_path, [{"_id": "q1"}, {"_id": 7}, {"_id": "7"}, {"_id": "q1"}])
    with pytest.raises(ConfigError) as err:
        read_jsonl(str(path))
    assert "line 4" in str(err.value) and "line 1" in str(err.value) and "'q1'" in str(err.value)
    assert len(list(read_jsonl(str(write_lines(tmp_path, [{"_id": 7}, {"_id": "7"}], "ok.jsonl"))))) == 2


def test_a_signing_target_refuses_an_object_body_line_before_the_run(tmp_path):
    path = write_lines(tmp_path, [{"_body": {"q": 1}}])
    with pytest.raises(ConfigError) as err:
        read_jsonl(str(path), LineRules(signed=True))
    assert "line 1" in str(err.value) and "signs its requests" in str(err.value)
    cfg = load_config(
        overrides={
            "target": {"url": "http://127.0.0.1:9/x", "signing": "binance"},
            "keys": {"secrets": ["kA bB"], "limits": ["5/1s"]},
            "workload": {"file": str(path)},
        }
    )
    with pytest.raises(ConfigError, match="signs its requests"):
        Workload.from_config(cfg.engine_settings, random.Random(0))


@pytest.mark.parametrize(
    ("preset", "url", "refused"),
    [
        ("openai", "http://127.0.0.1:9", True),
        ("openai", "http://127.0.0.1:9/?tag=t0p", True),
        ("anthropic", "http://127.0.0.1:9", True),
        ("azure-openai", "http://127.0.0.1:9", True),
        ("openai-compatible", "http://127.0.0.1:9", True),
        ("openai", "http://127.0.0.1:9/v1/chat/completions", False),  # the URL names the endpoint
        (None, "http://127.0.0.1:9", False),  # a plain target may answer at its root
    ],
)
def test_a_line_without_path_to_an_llm_api_s_bare_url_is_refused_before_the_run(
    tmp_path, preset, url, refused
):
    path = write_lines(
        tmp_path, [{"_id": "a", "_path": "/v1/chat/completions", "_body": PROMPT}, {"_body": PROMPT}]
    )
    cfg = load_config(
        preset=preset,
        overrides={"target": {"url": url}, "keys": {"secrets": [SECRET]}, "workload": {"file": str(path)}},
    )
    if not refused:
        assert len(list(Workload.from_config(cfg.engine_settings, random.Random(0)).items or ())) == 2
        return
    with pytest.raises(ConfigError) as err:
        Workload.from_config(cfg.engine_settings, random.Random(0))
    text = str(err.value)
    assert "prompts.jsonl" in text and "line 2" in text and "no _path" in text
    assert "http://127.0.0.1:9" in text and "t0p" not in text


@run_async
async def test_a_stored_job_without_path_is_refused_unsent_and_the_others_go(tmp_path):
    """`enqueue` cannot know the run's target; the run refuses such a job when it takes it:
    shed with the reason in its results line, never sent (the API would answer 404)."""
    lines = [
        {"_id": "good", "_path": "/v1/chat/completions", "_body": PROMPT},
        {"_id": "bare", "_body": PROMPT},
    ]
    db, results = tmp_path / "jobs.db", tmp_path / "answers.jsonl"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"))

    cli = functools.partial(run_cli, tmp_path, env)

    code, err = await cli(
        "enqueue", "--preset", "openai", "--store", f"sqlite:{db}", str(write_lines(tmp_path, lines))
    )
    assert code == 0, err
    assert "jobs without a _path: 1;" in err  # enqueue cannot know the run's target: a note
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000) as stub:
        code, err = await cli(
            "--no-ui", "--preset", "openai", "--target", stub.url, "--keys", SECRET,
            "--store", f"sqlite:{db}", "--results", str(results), "--results-body",
        )  # fmt: skip
        assert code == 0, err
        assert sum(stub.state.book.prompts[SECRET].values()) == 1  # the bare one never went
    assert "Traceback" not in err and "no _path" in err
    ends = {x["line_id"]: x for x in map(json.loads, results.read_text().splitlines())}
    assert ends["good"]["ending"] == "succeeded"
    assert ends["bare"]["ending"] == "shed" and ends["bare"]["attempts"] == 0
    assert "no _path" in ends["bare"]["error"]


def test_the_cli_refuses_a_bad_line_in_one_line_without_a_traceback(tmp_path):
    import subprocess

    path = write_lines(tmp_path, [{"_id": "a", "_body": PROMPT}, {"_id": "a", "_body": PROMPT}])
    proc = subprocess.run(
        [*RATEDECK, "--no-ui", "--target", "http://127.0.0.1:9/", "--keys", SECRET, "--workload", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "prompts.jsonl" in proc.stderr and "line 2" in proc.stderr and "line 1" in proc.stderr


def test_results_id_names_id_or_an_own_field():
    assert (
        load_config(overrides={"run": {"results_id": "custom_id"}}, keys_needed=False).runner.results_id
        == "custom_id"
    )
    with pytest.raises(ConfigError, match="results_id"):
        load_config(overrides={"run": {"results_id": "_path"}}, keys_needed=False)


# ---------------------------------------------------------------- the results line


class _Host:
    """What a results file reads of an engine (`ResultsHost`), for one request."""

    def redact(self, text: str, limit: int | None = None) -> str:
        text = text.replace(SECRET, "***")
        return text if limit is None else text[:limit]

    def clock(self) -> float:
        return 2.0

    def wall_time(self, t: float) -> float:
        return 1_700_000_000.0 + t

    def queued(self) -> list:
        return []

    def in_flight_requests(self) -> list:
        return []

    def watch(self, watcher) -> None:
        pass


def _answered(req: Request, body: bytes, content_type: str) -> Request:
    req.result = Outcome(OK, status=200, response=Response(200, {"Content-Type": content_type}, body))
    req.last_status, req.attempts = 200, 1
    return req


@pytest.mark.parametrize("link", ["_id", "custom_id"])
def test_a_results_line_carries_the_line_id_its_own_fields_and_the_parsed_answer(tmp_path, link):
    from ratedeck.engine.observe.results import ResultsFile

    path = tmp_path / "answers.jsonl"
    out = ResultsFile(str(path), _Host(), body=True, link=link)  # type: ignore[arg-type]
    line = {"_id": "q1", "custom_id": "c1", "_path": "/v1/chat/completions", "_body": PROMPT, "_weight": 2}
    answer = json.dumps({"choices": [{"text": f"hi {SECRET}"}]}).encode()
    out.finished(_answered(shaped(line), answer, "application/json; charset=utf-8"), Ending.SUCCEEDED)
    out.finished(_answered(shaped({"_id": 2, "_body": "json"}), b'{"a": 1}', "text/plain"), Ending.SUCCEEDED)
    out.close()
    first, second = (json.loads(x) for x in path.read_text().splitlines())
    assert first["line_id"] == ("q1" if link == "_id" else "c1")
    assert first["params"] == {"custom_id": "c1"}  # the line's own fields (not sent)
    assert first["line"] == {
        "_id": "q1",
        "_method": "POST",
        "_path": "/v1/chat/completions",
        "_body": PROMPT,
        "_weight": 2,
    }
    assert first["body"] == {"choices": [{"text": "hi ***"}]}  # parsed, and masked
    assert second["line_id"] == (2 if link == "_id" else None)
    assert second["body"] == '{"a": 1}'  # not said to be JSON: text, as before
    assert SECRET not in path.read_text()


@pytest.mark.parametrize("link", ["_id", "custom_id"])
def test_a_resumed_store_run_writes_no_second_line_for_an_id_that_succeeded_there(tmp_path, link):
    """A kill -9 can land after a prompt's answer was written and before its ending reached the
    store: a prompt is safe to send again, so the resume sends it (`safe_writes`), and its second
    answer must not make a second line (seen: 901 lines for 900 prompts, 4 kills of 4 just after
    the OpenAI stub's first minute's burst). Only a line that succeeded there is left out: one
    that expired or was shed ends again, and one without an `_id` cannot be told apart."""
    from ratedeck.engine.observe.results import ResultsFile

    path = tmp_path / "answers.jsonl"
    killed = [
        {"id": 1, "ending": "succeeded", "line_id": "q1", "line": {"_id": "q1", "custom_id": "c1"}},
        {"id": 2, "ending": "expired", "line_id": "q2"},
        {"id": 3, "ending": "succeeded", "line_id": None},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in killed) + '{"id": 4, "ending": "succ')
    out = ResultsFile(str(path), _Host(), link=link, store=True, append=True, resume=True)  # type: ignore[arg-type]
    for line in ({"_id": "q1", "custom_id": "c1"}, {"_id": "q2"}, {"k": 3}, {"_id": "q4"}):
        out.finished(_answered(shaped(line), b"{}", "application/json"), Ending.SUCCEEDED)
    out.close()
    written = [json.loads(x) for x in path.read_text().splitlines()[len(killed) :]]
    again = [] if link == "_id" else ["c1"]  # another field than `_id` may repeat in a file: not judged
    assert [x["line_id"] for x in written] == [
        *again,
        "q2" if link == "_id" else None,
        None,
        "q4" if link == "_id" else None,
    ]
    # a store run without --resume adds whatever it ends
    more = ResultsFile(str(path), _Host(), store=True, append=True)  # type: ignore[arg-type]
    more.finished(_answered(shaped({"_id": "q1"}), b"{}", "application/json"), Ending.SUCCEEDED)
    more.close()
    assert json.loads(path.read_text().splitlines()[-1])["line_id"] == "q1"


# ---------------------------------------------------------------- replay and the stores


def test_an_object_body_survives_a_results_file_and_replay(tmp_path):
    from ratedeck.engine.observe.results import ResultsFile

    lines = [
        {"_id": f"q{i}", "_path": "/v1/messages", "_body": {**PROMPT, "n": i}, "tag": i, "_budget": "tok"}
        for i in range(3)
    ]
    path = tmp_path / "results.jsonl"
    out = ResultsFile(str(path), _Host())  # type: ignore[arg-type]
    for line in lines:
        req = shaped(line)
        req.last_status = 500
        out.finished(req, Ending.GRAVEYARD)
    out.close()
    again = workload_file(read_requests(path).items)
    try:
        back = list(read_jsonl(again, LineRules(budgets=("tok",))))
    finally:
        os.unlink(again)
    assert back == [{**line, "_method": "POST", "_budget": ["tok"]} for line in lines]
    assert [take_shape(dict(b)) for b in back] == [take_shape(dict(line)) for line in lines]


def test_enqueue_keeps_an_object_body_and_id_in_a_sqlite_store(tmp_path):
    import subprocess

    from ratedeck.store.open import open_store

    lines = [{"_id": f"q{i}", "_path": "/v1/chat/completions", "_body": PROMPT, "who": i} for i in range(4)]
    db = tmp_path / "jobs.db"
    proc = subprocess.run(
        [*RATEDECK, "enqueue", "--store", f"sqlite:{db}", str(write_lines(tmp_path, lines))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "enqueued 4 jobs" in proc.stdout
    with sqlite3.connect(db) as con:
        assert [json.loads(r) for (r,) in con.execute("SELECT item FROM jobs ORDER BY id")] == lines

    async def claim():
        store = open_store(f"sqlite:{db}")
        try:
            return [job.item for job in await store.claim("m1", 10)]
        finally:
            await store.close()

    assert asyncio.run(claim()) == lines
    bad = write_lines(tmp_path, [*lines, {"_id": "q0"}], "bad.jsonl")
    proc = subprocess.run(
        [*RATEDECK, "enqueue", "--store", f"sqlite:{tmp_path / 'other.db'}", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "line 5" in proc.stderr and "line 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_object_body_and_id_survive_a_redis_store(redis_server):
    from ratedeck.store.redis import RedisStore

    lines = [{"_id": i, "_body": {**PROMPT, "n": i}, "who": "x"} for i in range(3)]

    async def round_trip():
        store = RedisStore(redis_server.url, namespace="llm")
        try:
            assert await store.enqueue(lines) == 3
            return [job.item for job in await store.claim("m1", 10)]
        finally:
            await store.close()

    assert asyncio.run(round_trip()) == lines


# ---------------------------------------------------------------- end to end, through the CLI


@run_async
async def test_five_prompts_through_the_cli_to_the_openai_stub_each_answer_linked_by_id(tmp_path):
    prompts = [
        {
            "_id": f"q{i}",
            "_path": "/v1/chat/completions",
            "topic": f"t{i}",
            "_body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"prompt number {i}"}],
                "max_tokens": 10 * (i + 1),
            },
        }
        for i in range(5)
    ]
    work = write_lines(tmp_path, prompts)
    results = tmp_path / "answers.jsonl"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000) as stub:
        proc = await asyncio.create_subprocess_exec(
            *RATEDECK,
            "--no-ui",
            "--target",
            stub.url,
            "--keys",
            SECRET,
            "--limit",
            "100/1s",
            "--workload",
            str(work),
            "--results",
            str(results),
            "--results-body",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        stdout, stderr = await proc.communicate()
        book = stub.state.book
        assert proc.returncode == 0, stderr.decode()
        assert book.duplicates() == 0 and sum(book.prompts[SECRET].values()) == 5
        first = Counter(book.prompts[SECRET])
        # `ratedeck replay --all` sends every prompt of the answers file again, body as it was.
        replay = await asyncio.create_subprocess_exec(
            *RATEDECK,
            "replay",
            str(results),
            "--all",
            "--no-ui",
            "--target",
            stub.url,
            "--keys",
            SECRET,
            "--limit",
            "100/1s",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        _, replay_err = await replay.communicate()
        assert replay.returncode == 0, replay_err.decode()
        assert Counter(book.prompts[SECRET]) == first + first  # each prompt once more, none other
        assert stub.ledger.counts() == {"ok": 10}
    assert set(book.prompts[SECRET]) == {prompt_identity(p["_body"]["messages"]) for p in prompts}
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert len(lines) == 5 and Counter(x["ending"] for x in lines) == {"succeeded": 5}
    by_id = {x["line_id"]: x for x in lines}
    assert set(by_id) == {p["_id"] for p in prompts}
    for p in prompts:
        x = by_id[p["_id"]]
        assert x["params"] == {"topic": p["topic"]} and x["line"]["_body"] == p["_body"]
        # The answer is the stub's to this very prompt: its completion is half its max_tokens.
        assert x["body"]["object"] == "chat.completion"
        assert x["body"]["usage"]["completion_tokens"] == -(-p["_body"]["max_tokens"] // 2)
    assert SECRET not in results.read_text() + stdout.decode() + stderr.decode()


@run_async
async def test_prompts_enqueued_in_sqlite_are_worked_to_the_openai_stub_and_linked_by_id(tmp_path):
    prompts = [
        {
            "_id": i,
            "_path": "/v1/chat/completions",
            "_body": {**PROMPT, "messages": [{"role": "user", "content": f"p{i}"}]},
        }
        for i in range(4)
    ]
    db, results = tmp_path / "jobs.db", tmp_path / "answers.jsonl"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))

    cli = functools.partial(run_cli, tmp_path, env)

    code, err = await cli("enqueue", "--store", f"sqlite:{db}", str(write_lines(tmp_path, prompts)))
    assert code == 0, err
    async with await start_openai(keys=[SECRET], rpm=1000, tpm=1_000_000) as stub:
        code, err = await cli(
            "--no-ui", "--target", stub.url, "--keys", SECRET, "--limit", "100/1s",
            "--store", f"sqlite:{db}", "--results", str(results), "--results-body",
        )  # fmt: skip
        assert code == 0, err
        assert stub.state.book.duplicates() == 0 and sum(stub.state.book.prompts[SECRET].values()) == 4
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(x["line_id"] for x in lines) == [0, 1, 2, 3]
    assert all(x["ending"] == "succeeded" and x["body"]["object"] == "chat.completion" for x in lines)
    assert {x["line_id"]: x["line"]["_body"] for x in lines} == {p["_id"]: p["_body"] for p in prompts}
