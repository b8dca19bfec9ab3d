"""Issue 22, items 1, 5 and 7: honest defaults, a run that achieved nothing fails, bad input.

The runs that matter go through the real CLI in a child process against a real
loopback server (aiohttp on 127.0.0.1), as a user meets them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from ratedeck.config import load_config
from ratedeck.console.screens.key_detail import head_text
from ratedeck.console.widgets.keys_table import state_text
from ratedeck.core.vocab import KeyState, OutcomeKind
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.path.settle import SettleRules, Tally, decide
from ratedeck.engine.request import Request
from ratedeck.engine.snapshot import KeyRow
from ratedeck.runner.cli import main
from ratedeck.runner.commands.config import shown_config

# ---------------------------------------------------------------- item 7: bad input


@pytest.mark.parametrize("keys", [[], ["--keys", "k-one"]])
def test_a_bad_target_url_names_target_not_keys(keys, capsys):
    code = main(["--no-ui", "--target", "ht!tp://", *keys])
    err = capsys.readouterr().err
    assert code == 2
    assert "--target" in err and "no API keys" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_enqueue_needs_no_keys(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('[target]\nurl = "http://127.0.0.1:9/x"\n[pools]\nslow = 2\n')
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"n": 1}\n{"n": 2, "_pool": "slow"}\n')
    db = tmp_path / "work.db"
    code = main(["enqueue", "--store", f"sqlite:{db}", "--config", str(config), str(jobs)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "enqueued 2 jobs" in out and "(2 pending)" in out, out
    # the config's other settings are still checked: a pool the config lacks is refused
    jobs.write_text('{"n": 3, "_pool": "nowhere"}\n')
    assert main(["enqueue", "--store", f"sqlite:{db}", "--config", str(config), str(jobs)]) == 2


# ---------------------------------------------------------------- a loopback target


class Target:
    """An aiohttp app on 127.0.0.1 in a thread of its own. `/deny`: 401 to every key;
    `/some`: 403 to the keys in `REVOKED`, 200 to the others; `/broken`: 500; `/ok`: 200;
    `/bad`: 400 (buried at once). Every key it saw is counted in `seen`."""

    def __init__(self) -> None:
        self.port = 0
        self.seen: Counter[str] = Counter()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    async def _answer(self, request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen[key] += 1
        mode = request.match_info["mode"]
        if mode == "deny":
            return web.json_response({"message": "Bad credentials"}, status=401)
        if mode == "some" and key in REVOKED:
            return web.Response(status=403, text="key revoked")
        if mode == "broken":
            return web.Response(status=500, text="internal error")
        if mode == "bad":
            return web.Response(status=400, text="no such thing")
        return web.json_response({"ok": True})

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_get("/{mode}", self._answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Target:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


KEYS = ("sk-live-0123456789abcdefAAAA", "sk-live-0123456789abcdefBBBB", "sk-live-0123456789abcdefCCCC")
REVOKED = set(KEYS[:2])


@pytest.fixture(scope="module")
def target():
    with Target() as t:
        yield t


def _cli(args: list[str], where: Path, timeout: float = 45.0) -> tuple[int, str, str, float]:
    env = dict(os.environ, XDG_STATE_HOME=str(where / "state"))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--interval", "1", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=where,
        env=env,
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def _no_key_in(*texts: str) -> None:
    for text in texts:
        for key in KEYS:
            assert key not in text and key[:12] not in text, text


# ---------------------------------------------------------------- item 5: a run that achieved nothing fails


def test_every_key_refused_stops_at_once_and_exits_1(target, tmp_path):
    report = tmp_path / "r.json"
    code, out, err, took = _cli(
        ["--target", target.url("deny"), "--keys", ",".join(KEYS), "--limit", "20/1s"]
        + ["--duration", "60", "--report", str(report)],
        tmp_path,
    )
    assert code == 1, out + err
    assert took < 15, f"ran {took:.1f} s of a 60 s run"  # stopped at once, not after --duration
    lines = [line for line in err.splitlines() if line.startswith("ratedeck:")]
    assert len(lines) == 1, err
    assert "401" in lines[0] and "Bad credentials" in lines[0] and "refused" in lines[0], lines
    assert "Traceback" not in out + err
    _no_key_in(out, err, report.read_text())
    data = json.loads(report.read_text())
    assert [k["label"] for k in data["keys_refused"]] == ["k1", "k2", "k3"]
    assert {k["status"] for k in data["keys_refused"]} == {401}
    assert data["balance_ok"]
    assert sum(target.seen[k] for k in KEYS) < 200  # a few answers each, not 60 s of sending


def test_a_share_of_keys_refused_is_named_and_the_run_completes(target, tmp_path):
    report = tmp_path / "r.json"
    code, out, err, _ = _cli(
        ["--target", target.url("some"), "--keys", ",".join(KEYS), "--limit", "20/1s"]
        + ["--total", "30", "--duration", "30", "--report", str(report)],
        tmp_path,
    )
    assert code == 0, out + err
    refused = [line for line in out.splitlines() if line.startswith("refused")]
    assert len(refused) == 1, out
    assert "2 of 3 keys" in refused[0] and "k1" in refused[0] and "k2" in refused[0], refused
    assert "k3" not in refused[0] and "HTTP 403: key revoked" in refused[0], refused
    _no_key_in(out, err, report.read_text())
    data = json.loads(report.read_text())
    assert data["requests"]["succeeded"] == 30, data["requests"]
    assert [(k["label"], k["status"], k["message"]) for k in data["keys_refused"]] == [
        ("k1", 403, "key revoked"),
        ("k2", 403, "key revoked"),
    ]
    assert all(k["fingerprint"] and k["fingerprint"] in refused[0] for k in data["keys_refused"])


def test_no_success_and_failures_exit_1(target, tmp_path):
    code, out, err, _ = _cli(
        ["--target", target.url("broken"), "--keys", KEYS[2], "--limit", "20/1s", "--total", "4"]
        + ["--duration", "30", "--graveyard", ""],
        tmp_path,
    )
    assert code == 1, out + err
    assert "nothing succeeded" in err and "HTTP 500" in err, err


def test_fail_on_still_holds_on_a_run_that_worked(target, tmp_path):
    code, out, err, _ = _cli(
        ["--target", target.url("some"), "--keys", ",".join(KEYS), "--limit", "20/1s", "--total", "10"]
        + ["--duration", "30", "--fail-on", "rejected_other>0", "--graveyard", ""],
        tmp_path,
    )
    assert code == 99, out + err
    assert "threshold failed" in err


# ---------------------------------------------------------------- item 1: honest defaults


def test_a_named_target_gets_no_seed_defaults():
    cfg = load_config(overrides={"target": {"url": "http://127.0.0.1:9/x"}, "keys": {"secrets": ["k-1"]}})
    e = cfg.engine_settings.engine
    assert e.ttl_s is None and e.queue_max is None and e.drain_timeout_s is None
    assert cfg.engine_settings.main_queue_max == 1000
    assert cfg.engine_settings.drain_s == cfg.engine_settings.target.timeout_s + 1.0
    assert e.graveyard_path == "auto"
    many = load_config(
        overrides={
            "target": {"url": "http://127.0.0.1:9/x"},
            "keys": {"secrets": [f"key-{i}" for i in range(50)]},
            "engine": {"in_flight_per_key": 8},
        }
    )
    assert many.engine_settings.main_queue_max == 4 * 50 * 8  # every key's limiter kept busy
    seed = load_config(preset="study")
    assert (
        seed.engine_settings.engine.ttl_s,
        seed.engine_settings.main_queue_max,
        seed.engine_settings.drain_s,
    ) == (1.0, 50, 2.0)
    shown = shown_config(cfg, None)
    assert "ttl_s" not in shown and "queue_max" not in shown and "drain_timeout_s" not in shown, shown


def test_ttl_is_opt_in_and_empty_switches_it_off(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        '[target]\nurl = "http://127.0.0.1:9/x"\n[keys]\nsecrets = ["k-1"]\n[engine]\nttl_s = 30\n'
    )
    assert load_config(str(config)).engine_settings.engine.ttl_s == 30.0
    assert load_config(str(config), overrides={"engine": {"ttl_s": ""}}).engine_settings.engine.ttl_s is None
    config.write_text('[engine]\nttl_s = ""\n')
    assert load_config(str(config), preset="study").engine_settings.engine.ttl_s is None


def test_jobs_from_a_file_never_expire_by_default(target, tmp_path):
    """Arrivals far above the limit: under the study's 1 s TTL most would expire; now none do."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(f'{{"n": {i}}}\n' for i in range(40)))
    report = tmp_path / "r.json"
    code, out, err, _ = _cli(
        ["--target", target.url("ok"), "--keys", KEYS[2], "--limit", "10/1s", "--rate", "200"]
        + ["--workload", str(jobs), "--duration", "30", "--report", str(report)],
        tmp_path,
    )
    assert code == 0, out + err
    req = json.loads(report.read_text())["requests"]
    assert (req["succeeded"], req["expired"]) == (40, 0), req


def test_the_graveyard_goes_next_to_the_report(target, tmp_path):
    report = tmp_path / "out" / "run.json"
    report.parent.mkdir()
    code, out, err, _ = _cli(
        ["--target", target.url("bad"), "--keys", KEYS[2], "--limit", "20/1s", "--total", "3"]
        + ["--duration", "20", "--report", str(report)],
        tmp_path,
    )
    assert code == 1, out + err  # 0 successes
    grave = tmp_path / "out" / "run-graveyard.jsonl"
    assert len(grave.read_text().splitlines()) == 3
    assert f"graveyard: 3 requests in {grave}" in out, out
    assert not list(tmp_path.glob("*.jsonl"))  # nothing in the working directory


def test_without_a_report_the_graveyard_goes_to_the_state_dir(target, tmp_path):
    code, out, err, _ = _cli(
        ["--target", target.url("bad"), "--keys", KEYS[2], "--limit", "20/1s", "--total", "2"]
        + ["--duration", "20"],
        tmp_path,
    )
    assert code == 1, out + err
    graves = list((tmp_path / "state" / "ratedeck").glob("graveyard-*.jsonl"))
    assert len(graves) == 1 and len(graves[0].read_text().splitlines()) == 2, graves
    assert f"graveyard: 2 requests in {graves[0]}" in out, out
    assert not list(tmp_path.glob("*.jsonl"))


def test_a_403_that_asks_to_wait_is_a_rate_limit_not_a_refusal():
    rules = SettleRules(max_attempts=5, backoff_base_s=0.05, backoff_cap_s=2.0)
    request = Request(1, 0.0, math.inf, {})
    request.attempts = 1
    refused = decide(Outcome(OutcomeKind.BLOCKED, 403), request, rules, 1.0)
    assert refused.block_key and refused.tally is Tally.REJECTED_OTHER
    wait = decide(Outcome(OutcomeKind.BLOCKED, 403, retry_after_s=60.0), request, rules, 1.0)
    assert not wait.block_key and wait.tally is Tally.REJECTED_429 and wait.cooldown is not None
    spent = Outcome(OutcomeKind.BLOCKED, 403, remaining=0)
    assert not decide(spent, request, rules, 1.0).block_key
    assert decide(Outcome(OutcomeKind.BLOCKED, 401, retry_after_s=60.0), request, rules, 1.0).block_key


def test_a_refused_key_shows_its_status_in_the_keys_table():
    row = KeyRow("k2", "…BBBB", KeyState.BLOCKED, refused_status=403, refused_message="key revoked")
    assert state_text(row) == "✖ refused 403"
    assert "key revoked" in head_text(row)
    assert state_text(KeyRow("k1", "…AAAA", KeyState.BLOCKED)) == "✖ blocked"  # no status known
