"""Durable runs as a user meets them: `ratedeck enqueue`, `--store sqlite:PATH`, kill -9, `--resume`.

The target is a small aiohttp app on loopback that records every request it
receives (the job number and the Idempotency-Key) the moment it arrives, so
"delivered" means the server got it, whether or not the client lived to read
the answer. The real CLI runs in a child process.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from pathlib import Path

import pytest
from aiohttp import web

from ratedeck.runner.cli import main
from tests.runner.test_report_schema import validate

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
JOBS = 120
IN_FLIGHT = 8  # 2 keys x 4
QUEUE_MAX = 4


class JobTarget:
    """Records (job, Idempotency-Key) of every request on arrival; answers after `delay_s`.

    Jobs divisible by 10 are refused with a 400 (retrying cannot help: they are buried),
    unless `refuse_tens` is off. With `limit`, each API key (the Authorization header)
    may send at most `limit` requests in any `window_s`; one more is a 429, counted in
    `rejected` and not recorded as delivered (the server did nothing with it). With
    `refuse_keys`, every request is a 401 (every key refused), counted in `refused`.
    """

    def __init__(
        self,
        delay_s: float = 0.3,
        limit: int | None = None,
        window_s: float = 1.0,
        refuse_tens: bool = True,
        refuse_keys: bool = False,
    ):
        self.delay_s = delay_s
        self.refuse_keys, self.refused = refuse_keys, 0
        self.limit, self.window_s, self.refuse_tens = limit, window_s, refuse_tens
        self.windows: dict[str, deque[float]] = defaultdict(deque)
        self.rejected = 0
        self.port = 0
        self.seen: list[tuple[int, str | None]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/job"

    def received(self) -> int:
        with self._lock:
            return len(self.seen)

    def by_job(self) -> dict[int, list[str | None]]:
        out: dict[int, list[str | None]] = defaultdict(list)
        with self._lock:
            for job, key in self.seen:
                out[job].append(key)
        return out

    def __enter__(self) -> JobTarget:
        self._thread.start()
        assert self._ready.wait(10), "the job target did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/job", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        fields = dict(request.query)
        if request.method == "POST":
            fields.update(await request.post())
        job = int(fields["job"])
        if self.refuse_keys:
            with self._lock:
                self.refused += 1
            return web.json_response({"error": "invalid api key"}, status=401)
        if self.limit is not None:
            now, sent = time.monotonic(), self.windows[request.headers.get("Authorization", "")]
            while sent and sent[0] <= now - self.window_s:
                sent.popleft()
            if len(sent) >= self.limit:
                with self._lock:
                    self.rejected += 1
                return web.json_response({"error": "rate limited"}, status=429)
            sent.append(now)
        with self._lock:
            self.seen.append((job, request.headers.get("Idempotency-Key")))
        await asyncio.sleep(self.delay_s)
        if job % 10 == 0 and self.refuse_tens:
            return web.json_response({"error": "bad job"}, status=400)
        return web.json_response({"ok": job})


def _config(tmp_path: Path, target: JobTarget, idempotent: bool) -> Path:
    path = tmp_path / "run.toml"
    method = "POST" if idempotent else "GET"
    path.write_text(
        f'[target]\nurl = "{target.url}"\nmethod = "{method}"\nnonce_param = ""\n'
        f"idempotency = {'true' if idempotent else 'false'}\n"
        '[keys]\nsecrets = ["kA-secret-1234567", "kB-secret-1234567"]\nlimits = ["40/1s"]\n'
        f"[engine]\nin_flight_per_key = 4\nqueue_max = {QUEUE_MAX}\nttl_s = 60\n"
    )
    return path


def _enqueue(tmp_path: Path, db: Path, n: int = JOBS) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"job": i}) + "\n" for i in range(1, n + 1)))
    proc = subprocess.run(
        RATEDECK + ["enqueue", "--store", f"sqlite:{db}", str(jobs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"enqueued {n} jobs" in proc.stdout


def _states(db: Path) -> dict[int, tuple[str, str | None]]:
    """job number -> (state, ending), read straight from the file."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT item, state, ending FROM jobs").fetchall()
    return {json.loads(item)["job"]: (state, ending) for item, state, ending in rows}


def _run(cfg: Path, db: Path, report: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        RATEDECK
        + ["--no-ui", "--config", str(cfg), "--store", f"sqlite:{db}", "--report", str(report), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _kill_mid_run(cfg: Path, db: Path, target: JobTarget, at: int = JOBS // 3) -> None:
    """Start a store run and kill -9 it once the target has received `at` jobs (a third)."""
    proc = subprocess.Popen(
        RATEDECK + ["--no-ui", "--config", str(cfg), "--store", f"sqlite:{db}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while target.received() < at:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, f"only {target.received()} requests arrived"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_a_run_every_key_refused_fails_and_leaves_every_job_pending(tmp_path):
    """Every key refused (401): the run fails, and the jobs it sent go back to pending, not
    "in flight": a 401 says the server did nothing, so the next run (no --resume) sends them."""
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget(refuse_keys=True) as target:
        cfg = _config(tmp_path, target, idempotent=False)
        _enqueue(tmp_path, db, 20)
        proc = _run(cfg, db, report)
        refused = target.refused
    assert proc.returncode == 1 and "every key was refused" in proc.stderr, proc.stderr
    assert refused >= 1
    assert {state for state, _ in _states(db).values()} == {"pending"}


def _killed(tmp_path: Path, db: Path, target: JobTarget, *, idempotent: bool) -> Path:
    """A config for `target`, the jobs enqueued into `db`, and a run on them killed with -9 a
    third of the way through (`_kill_mid_run`); returns the config."""
    cfg = _config(tmp_path, target, idempotent=idempotent)
    _enqueue(tmp_path, db)
    _kill_mid_run(cfg, db, target)
    return cfg


@pytest.mark.slow
def test_kill_9_then_resume_without_idempotency_sends_nothing_twice_and_reports_uncertain(tmp_path):
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget() as target:
        cfg = _killed(tmp_path, db, target, idempotent=False)
        at_kill = _states(db)
        # marked sending: may have reached the server (claimed and never marked go back to pending)
        held = {job for job, (state, _) in at_kill.items() if state == "sending"}
        # in flight, plus what was queued or claimed for the queue, plus the last tick's endings
        assert 0 < len(held) <= IN_FLIGHT + 2 * QUEUE_MAX + 10
        proc = _run(cfg, db, report, "--resume")
        seen = target.by_job()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and f"{len(held)} jobs are uncertain" in proc.stderr
    data = json.loads(report.read_text())
    assert validate(data) == []
    store = data["store"]
    assert store["balance_ok"] and store["jobs"] == JOBS and store["resumed"] == len(held)
    assert store["uncertain"] == len(held) and store["pending"] == store["in_flight"] == 0
    states = _states(db)
    for job in range(1, JOBS + 1):
        state, ending = states[job]
        if job in held:  # maybe delivered by the killed run; never sent again
            assert state == "uncertain" and len(seen.get(job, [])) <= 1, job
        else:  # delivered exactly once, by one run or the other
            assert state == "done" and len(seen[job]) == 1, (job, state, seen.get(job))
            assert ending == ("graveyard" if job % 10 == 0 else "succeeded")
    assert store["succeeded"] + store["graveyard"] + store["uncertain"] == JOBS


def test_a_run_after_a_kill_9_without_resume_says_what_it_left_and_how_to_take_it_back(tmp_path):
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget() as target:
        cfg = _killed(tmp_path, db, target, idempotent=False)
        held = sum(1 for state, _ in _states(db).values() if state in ("claimed", "sending"))
        assert held > 0
        proc = _run(cfg, db, report)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # The summary (stdout with --no-ui) says it, not only the console's event log.
    assert f"{held} jobs were held by a run that did not end (killed?)" in proc.stdout
    assert "--resume takes them back" in proc.stdout
    data = json.loads(report.read_text())
    assert validate(data) == [] and data["store"]["left_claimed"] == held
    assert data["store"]["in_flight"] == held and data["store"]["resumed"] == 0


@pytest.mark.slow
def test_kill_9_then_resume_with_idempotency_key_finishes_every_job_under_one_key(tmp_path):
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget() as target:
        cfg = _killed(tmp_path, db, target, idempotent=True)
        held = {job for job, (state, _) in _states(db).items() if state == "sending"}
        assert 0 < len(held) <= IN_FLIGHT + 2 * QUEUE_MAX + 10
        proc = _run(cfg, db, report, "--resume")
        seen = target.by_job()
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    assert validate(data) == []
    store = data["store"]
    assert store["balance_ok"] and store["resumed"] == len(held) and store["resumed_retried"]
    assert store["uncertain"] == store["pending"] == store["in_flight"] == 0
    assert store["succeeded"] == JOBS - JOBS // 10 and store["graveyard"] == JOBS // 10
    assert set(seen) == set(range(1, JOBS + 1))  # every job reached the server
    for job, keys in seen.items():
        assert len(set(keys)) == 1 and keys[0], (job, keys)  # one Idempotency-Key per job, in every run
        if len(keys) > 1:
            assert job in held, job  # only a job the killed run held is sent again
    assert len({keys[0] for keys in seen.values()}) == JOBS
    # The buried jobs' graveyard lines are in the store, one per job, none lost to the kill.
    with sqlite3.connect(db) as con:
        records = [json.loads(r) for (r,) in con.execute("SELECT record FROM graveyard")]
    assert sorted(int(r["params"]["job"]) for r in records) == list(range(10, JOBS + 1, 10))


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, limit, window_s, jobs, most_uncertain",
    [
        # The case: even pacing, 20/1s per key, 50 ms answers: few on the wire at once.
        ("even", 20, 1.0, 600, 40),
        # Bursts fed as fast as the limits allow, in a 3 s window (60/3s): the resume starts well
        # inside the window the server still counts for the dead run, and would burst into it
        # (6 to 8 429s, measured) without that run's last sends. All 40 may be on the wire at
        # once, and the last tick's unjournaled endings with them.
        ("burst", 60, 3.0, 900, 100),
    ],
)
def test_kill_9_at_full_rate_strands_nothing_and_the_resume_draws_no_429(
    tmp_path, mode, limit, window_s, jobs, most_uncertain
):
    """5 keys on a server that refuses a request over its limit in any window, 8 in flight
    per key, killed after 350 jobs arrived: only jobs marked sending (what may have reached
    the server) end uncertain; every other job is delivered exactly once, across the kill and
    the resume, with no 429: the resumed run starts each key from the dead run's last window,
    kept in the store."""
    keys = [f"key-{i}-secret-0123456789" for i in range(5)]
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget(delay_s=0.05, limit=limit, window_s=window_s, refuse_tens=False) as target:
        cfg = tmp_path / "run.toml"
        policy = f"{limit}/{window_s:g}s"
        feed = "[workload]\nrate = 1000\n" if mode == "burst" else ""
        cfg.write_text(
            f'[target]\nurl = "{target.url}"\n'
            f"[keys]\nsecrets = {json.dumps(keys)}\nlimits = [{json.dumps(policy)}]\n"
            f'[engine]\nin_flight_per_key = 8\nttl_s = 600\npacing = "{mode}"\n{feed}'
        )
        _enqueue(tmp_path, db, jobs)
        _kill_mid_run(cfg, db, target, at=350)
        held = {job for job, (state, _) in _states(db).items() if state == "sending"}
        started = time.monotonic()
        proc = _run(cfg, db, report, "--resume")
        took = time.monotonic() - started
        seen, rejected = target.by_job(), target.rejected
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    store = data["store"]
    delivered_twice = {job: len(k) for job, k in seen.items() if len(k) > 1}
    print(
        f"{mode}: kill -9 at 350 delivered: uncertain {len(held)}, duplicates {len(delivered_twice)},"
        f" 429s {rejected}, resume {took:.1f} s"
    )
    assert 0 < len(held) <= most_uncertain and store["uncertain"] == store["resumed"] == len(held)
    assert delivered_twice == {} and rejected == 0 and data["requests"]["rejected_429"] == 0
    for job in range(1, jobs + 1):
        if job not in held:
            assert len(seen.get(job, [])) == 1, job  # delivered exactly once
    assert store["succeeded"] == jobs - len(held) and store["pending"] == store["in_flight"] == 0


@pytest.mark.slow
def test_a_resume_while_the_first_run_is_still_at_work_leaves_it_its_jobs(tmp_path):
    """--resume while the run it would resume is still at work took that run's claimed jobs,
    and both sent them. The first run says it is at work (its beats), so the second leaves its
    jobs to it and works the rest of the queue beside it: every job reaches the target once."""
    jobs = 600
    db, first_report, second_report = tmp_path / "work.db", tmp_path / "1.json", tmp_path / "2.json"
    with JobTarget(delay_s=0.05, refuse_tens=False) as target:
        cfg = _config(tmp_path, target, idempotent=True)
        _enqueue(tmp_path, db, jobs)
        first = subprocess.Popen(
            RATEDECK
            + ["--no-ui", "--config", str(cfg), "--store", f"sqlite:{db}", "--report", str(first_report)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while target.received() < 40:  # at work, holding claims
                assert first.poll() is None, "the first run ended before the second started"
                assert time.monotonic() < deadline, f"only {target.received()} requests arrived"
                time.sleep(0.01)
            second = _run(cfg, db, second_report, "--resume")
            first_err = first.communicate(timeout=60)[1]
        finally:
            first.kill()
            first.wait(10)
        seen = target.by_job()
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second.stderr
    store = json.loads(second_report.read_text())["store"]
    assert store["resumed"] == 0 and len(store["at_work"]) == 1 and store["left_claimed"] > 0
    assert "held by a run still at work" in second.stdout
    assert Counter(len(keys) for keys in seen.values()) == {1: jobs}  # each job once, none twice
    # Whichever ended first reported the other's jobs still in flight: the file has the end.
    assert Counter(_states(db).values()) == {("done", "succeeded"): jobs}


@pytest.mark.slow
def test_a_clean_stop_gives_back_unsent_jobs_and_the_next_run_finishes_them(tmp_path):
    db, report = tmp_path / "work.db", tmp_path / "report.json"
    with JobTarget(delay_s=0.05) as target:
        cfg = _config(tmp_path, target, idempotent=False)
        _enqueue(tmp_path, db)
        first = _run(cfg, db, report, "--duration", "1")
        assert first.returncode == 0, first.stderr
        part = json.loads(report.read_text())["store"]
        assert 0 < part["pending"] < JOBS and part["in_flight"] == part["uncertain"] == 0
        assert "store        sqlite:" in first.stdout
        second = _run(cfg, db, report)  # no --resume needed: nothing was left in flight
        seen = target.by_job()
    assert second.returncode == 0, second.stderr
    store = json.loads(report.read_text())["store"]
    assert store["pending"] == store["in_flight"] == store["uncertain"] == 0
    assert store["succeeded"] + store["graveyard"] == JOBS
    assert Counter(len(keys) for keys in seen.values()) == {1: JOBS}  # each job exactly once


# ---------------------------------------------------------------- bad input: one line, exit 2


def _one_line(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_enqueue_refuses_a_bad_line_by_file_and_line_and_adds_nothing(tmp_path, capsys):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"job": 1}\n{"job": 2}\n[3]\n')
    db = tmp_path / "work.db"
    err = _one_line(capsys, "enqueue", "--store", f"sqlite:{db}", str(jobs))
    assert f"{jobs}: line 3" in err and "JSON object" in err
    assert not db.exists()  # nothing half-enqueued: the store was never opened


def test_enqueue_checks_pools_like_a_workload_file(tmp_path, capsys):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"job": 1, "_pool": "slow"}\n')
    err = _one_line(capsys, "enqueue", "--store", f"sqlite:{tmp_path / 'w.db'}", str(jobs))
    assert "line 1" in err and "_pool 'slow'" in err


def test_enqueue_checks_a_line_s_key_by_its_form_or_against_the_config_s_keys(tmp_path, capsys):
    jobs, db = tmp_path / "jobs.jsonl", f"sqlite:{tmp_path / 'w.db'}"
    jobs.write_text('{"job": 1, "_key": "k2"}\n{"job": 2, "_key": "sk_live_0123456789abcdef"}\n')
    err = _one_line(capsys, "enqueue", "--store", db, str(jobs))
    assert "line 2" in err and "_key must be" in err and "sk_live" not in err
    with JobTarget() as target:
        cfg = _config(tmp_path, target, idempotent=False)  # two keys: k1, k2
        jobs.write_text('{"job": 1, "_key": "k2"}\n{"job": 2, "_key": 3}\n')
        err = _one_line(capsys, "enqueue", "--config", str(cfg), "--store", db, str(jobs))
        assert "line 2" in err and "_key 3 names none of the keys k1, k2" in err
        jobs.write_text('{"job": 1, "_key": "k2"}\n{"job": 2, "_key": 1}\n')
        assert main(["enqueue", "--config", str(cfg), "--store", db, str(jobs)]) == 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--no-ui", "--resume"], "--resume: needs a durable store"),
        (["--no-ui", "--resume", "--store", "memory"], "--resume: needs a durable store"),
        (["--no-ui", "--store", "sqlite:/no/such/dir/w.db"], "no such directory /no/such/dir"),
        (["--no-ui", "--store", "sqlite:/proc/ratedeck-test.db"], "sqlite:/proc/ratedeck-test.db: cannot"),
        (["--no-ui", "--store", "postgres://db/1"], "not a store; use memory, sqlite:PATH or redis://"),
        (["--no-ui", "--store", "sqlite:"], "needs a file path"),
    ],
)
def test_a_bad_store_or_resume_is_one_line_and_exit_2(capsys, argv, needle):
    assert needle in _one_line(capsys, *argv)


@pytest.mark.parametrize("kind", ["random bytes", "another program's database"])
def test_a_file_that_is_not_our_store_is_refused_and_left_as_it_is(tmp_path, capsys, kind):
    path = tmp_path / "x.db"
    if kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 16)
    else:
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
            con.execute("INSERT INTO invoices (total) VALUES (12.5)")
        con.close()
    before = path.read_bytes()
    err = _one_line(capsys, "--no-ui", "--store", f"sqlite:{path}")
    assert "not a SQLite database" in err or "not a ratedeck store (tables: invoices)" in err
    err = _one_line(capsys, "enqueue", "--store", f"sqlite:{path}", str(_jobs_file(tmp_path)))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "jobs.jsonl",
        "x.db",
    ]


def _jobs_file(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"job": 1}\n')
    return jobs


def test_a_workload_file_with_a_store_says_to_enqueue_it(tmp_path, capsys):
    err = _one_line(
        capsys, "--no-ui", "--store", f"sqlite:{tmp_path / 'w.db'}", "--workload", str(_jobs_file(tmp_path))
    )
    assert "ratedeck enqueue --store sqlite:" in err


def test_the_docs_durable_run_commands_parse_as_written(tmp_path, monkeypatch):
    import re
    import shlex

    from ratedeck.runner.cli import build_parser

    page = (Path(__file__).parents[2] / "docs" / "durability.md").read_text()
    section = page[page.index("# Durable runs") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line.split("#")[0].rstrip(" &")) for line in block.splitlines()]
    runs = [c[1:] for c in commands if c[:1] == ["ratedeck"] and c[1] != "enqueue"]
    assert [c[:2] for c in commands] == [
        ["ratedeck", "enqueue"],
        ["ratedeck", "--no-ui"],
        ["kill", "-9"],
        ["ratedeck", "--no-ui"],
    ]
    for argv in runs:
        args = build_parser().parse_args(argv)
        assert args.store == "sqlite:work.db"
    assert "--resume" not in runs[0] and "--resume" in runs[1]


@pytest.mark.slow
def test_the_console_s_engine_process_works_the_store_too(tmp_path, monkeypatch):
    """The console runs the engine in a child process (ProcessHost): the store goes with it."""

    from ratedeck.config import load_config
    from ratedeck.host.process_host import ProcessHost

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "work.db"
    _enqueue(tmp_path, db, n=40)
    host = ProcessHost(load_config().replace(store=f"sqlite:{db}"))
    host.start()
    try:
        deadline = time.monotonic() + 30
        while host.snapshot().phase != "stopped" and host.snapshot().succeeded + host.snapshot().expired < 40:
            assert time.monotonic() < deadline, "the store's 40 jobs did not end"
            time.sleep(0.05)
    finally:
        final = host.stop_blocking()
    store = host.facts.store
    assert store is not None, (final, host.facts)
    assert final.balance() == 0
    assert store.journaled == final.succeeded + final.expired + final.graveyard + final.shed
    assert dict(store.counts.done).get("succeeded", 0) + dict(store.counts.done).get("expired", 0) == 40
    assert store.counts.total == 40 and store.counts.pending == store.counts.claimed == 0


def test_config_show_never_prints_a_store_password():

    from ratedeck.config import load_config
    from ratedeck.runner.commands.config import shown_config

    cfg = load_config().replace(store="redis://:hunter2@127.0.0.1:6379/0")
    text = shown_config(cfg, None)
    assert 'store = "redis://127.0.0.1:6379/0"' in text and "hunter2" not in text
