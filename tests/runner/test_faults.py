"""The fault matrix: the real CLI, headless, against a hostile target (tests/support/fault_server.py).

For every mode the run must: end within a bound, exit with the documented
code (0 when something worked, 1 when nothing did: no answer, every
key refused, or no success at all), print no
traceback, balance its accounting in the report, and never show a key in
any form (raw, URL-encoded, base64, or a prefix cut short) in stdout,
stderr, the report or the graveyard.

The runs are independent processes, so the module starts all selected ones
at once (a few at a time) and each test reads its own result.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.runner.test_report_schema import accounted
from tests.support.fault_server import STATUSES, FaultServer, key_forms

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEYS = ("sk-LIVE/fault+key=0123456789abcdef", "sk-TEST/other+key=fedcba9876543210")
URL_PASSWORD = "pa55word-in-the-url"
BOUND_S = 25.0  # generous: several runs share a small box
PARALLEL = 5


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str
    code: int = 0  # 0: something worked; 1: nothing did (no answer, every key refused, no success)
    args: tuple[str, ...] = ()
    config: str = ""  # TOML written to a file and passed with --config
    total: int = 8
    url: str = ""  # a format string with {base} and {port} instead of the mode's URL
    check: str = ""  # the name of an extra check below
    marks: tuple = field(default=())

    def param(self):
        return pytest.param(self, id=self.name, marks=self.marks)


FOLLOW = "[target]\nfollow_redirects = true\n"

SCENARIOS = [
    Scenario("ok", "ok", check="all_succeeded"),
    *(Scenario(f"status-{code}", f"status/{code}", code=1, check="names_status") for code in STATUSES),
    Scenario("hang", "hang", code=1, total=4, check="timed_out", marks=(pytest.mark.slow,)),
    Scenario("slow", "slow", total=4),
    Scenario("trickle", "trickle", code=1, total=4, marks=(pytest.mark.slow,)),
    Scenario("garbage-200", "garbage", check="all_succeeded"),
    Scenario("garbage-500", "garbage500", code=1),
    Scenario("huge-500", "huge", code=1),
    Scenario("huge-200", "huge200", total=4, check="all_succeeded"),
    Scenario("echo-param", "echo", code=1),
    Scenario("echo-header", "echo500", code=1, args=("--key-header", "X-Api-Key")),
    Scenario("echo-post", "echo", code=1, args=("--method", "POST")),
    Scenario(
        "post-redirect-same-follow",
        "redirect-same",
        args=("--method", "POST"),
        config=FOLLOW,
        check="all_succeeded",
    ),
    Scenario("redirect-other", "redirect-other", code=1, check="redirect_not_followed"),
    Scenario("redirect-other-follow", "redirect-other", code=1, config=FOLLOW, check="redirect_not_followed"),
    Scenario("redirect-same", "redirect-same", code=1, check="redirect_not_followed"),
    Scenario("redirect-same-follow", "redirect-same", config=FOLLOW, check="all_succeeded"),
    Scenario("redirect-loop-follow", "redirect-loop", code=1, config=FOLLOW),
    Scenario("bad-policy-header", "badpolicy", check="all_succeeded"),
    Scenario("bad-ratelimit-header", "badratelimit", code=1),
    Scenario("bad-retry-after", "badretry", code=1),
    Scenario("malformed-http", "malformed", code=1),
    Scenario("junk-bytes", "junk", code=1),
    Scenario("connection-reset", "reset", code=1),
    Scenario("close-without-answer", "close", code=1),
    Scenario("short-body", "short", code=1),
    Scenario("mixed", "mixed", total=20, marks=(pytest.mark.slow,)),
    Scenario("query-in-target-url", "strictquery", url="{base}?a=1", check="all_succeeded"),
    Scenario(
        "credentials-in-target-url",
        "echo",
        code=1,
        args=("--key-header", "X-Api-Key"),  # Authorization holds the URL's user:password
        url="http://someone:" + URL_PASSWORD + "@127.0.0.1:{port}/echo",
    ),
    Scenario("dead-target", "", code=1, url="http://127.0.0.1:{dead}/x", check="connection_refused"),
]


@dataclass
class Result:
    scenario: Scenario
    code: int | None
    out: str
    err: str
    seconds: float
    report: Path
    graveyard: Path


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _run(scenario: Scenario, server: FaultServer, where: Path) -> Result:
    where.mkdir(parents=True, exist_ok=True)
    report, graveyard = where / "report.json", where / "graveyard.jsonl"
    if scenario.url:
        base = server.url(scenario.mode)
        url = scenario.url.format(base=base, port=server.port, dead=_dead_port())
    else:
        url = server.url(scenario.mode)
    argv = RATEDECK + [
        "--no-ui",
        "--target",
        url,
        "--keys",
        ",".join(KEYS),
        "--limit",
        "20/1s",
        "--timeout",
        "1s",
        "--total",
        str(scenario.total),
        "--duration",
        "8",
        "--interval",
        "1",
        "--report",
        str(report),
        "--graveyard",
        str(graveyard),
        *scenario.args,
    ]
    if scenario.config:
        (where / "run.toml").write_text(scenario.config)
        argv += ["--config", str(where / "run.toml")]
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=BOUND_S, cwd=where)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    return Result(scenario, code, out, err, time.monotonic() - start, report, graveyard)


@pytest.fixture(scope="module")
def server():
    with FaultServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def runs(request, server, tmp_path_factory):
    """Start every selected scenario's run now, a few at a time; tests wait on their own."""
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "scenario" in callspec.params:
            selected.append(callspec.params["scenario"])
    root = tmp_path_factory.mktemp("faults")
    pool = ThreadPoolExecutor(PARALLEL)
    futures: dict[str, Future] = {
        s.name: pool.submit(_run, s, server, root / s.name) for s in {s.name: s for s in selected}.values()
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _forbidden() -> list[str]:
    forms: set[str] = set()
    for secret in (*KEYS, URL_PASSWORD):
        for form in key_forms(secret):
            forms.add(form)
            forms.add(form[:8])  # a prefix left by cutting before masking
    return sorted(forms)


def _texts(result: Result) -> dict[str, str]:
    texts = {"stdout": result.out, "stderr": result.err}
    for path in (result.report, result.graveyard):
        if path.exists():
            texts[path.name] = path.read_text(errors="replace")
    return texts


@pytest.mark.parametrize("scenario", [s.param() for s in SCENARIOS])
def test_fault(scenario: Scenario, runs, server):
    result: Result = runs[scenario.name].result()
    where = f"\n--- stdout\n{result.out[-3000:]}\n--- stderr\n{result.err[-3000:]}"
    assert result.code is not None, f"still running after {BOUND_S} s" + where
    assert "Traceback" not in result.out + result.err, where
    assert result.code == scenario.code, where
    for name, text in _texts(result).items():
        for form in _forbidden():
            assert form not in text, f"{form!r} in {name}" + where
    data = json.loads(result.report.read_text())
    req = data["requests"]
    assert data["balance_ok"], data
    if len(data["keys_refused"]) == len(KEYS):  # every key refused: the run stopped at once
        assert 0 < req["generated"] <= scenario.total and scenario.mode in ("status/401", "status/403"), data
    else:
        assert req["generated"] == scenario.total, data
    assert req["generated"] == accounted(req)
    if result.graveyard.exists():
        lines = result.graveyard.read_text().splitlines()
        assert len(lines) == req["graveyard"] and all(json.loads(line) for line in lines)
    else:
        assert req["graveyard"] == 0
    if scenario.check:
        CHECKS[scenario.check](result, data, server)


# -------------------------------------------------------------- extra checks


def _all_succeeded(result: Result, data: dict, server: FaultServer) -> None:
    assert data["requests"]["succeeded"] == result.scenario.total, result.out


def _names_status(result: Result, data: dict, server: FaultServer) -> None:
    code = result.scenario.mode.split("/")[1]
    assert code in result.out, result.out  # the summary says which answers failed


def _redirect_not_followed(result: Result, data: dict, server: FaultServer) -> None:
    assert not server.other_seen, server.other_seen  # the key never went to another origin
    assert data["requests"]["succeeded"] == 0
    assert "302" in result.out and "redirect" in result.out, result.out
    if "other" in result.scenario.mode:
        assert f"127.0.0.1:{server.other_port}/steal" in result.out  # the Location, redacted


def _timed_out(result: Result, data: dict, server: FaultServer) -> None:
    assert "timed out" in result.out + result.err


def _connection_refused(result: Result, data: dict, server: FaultServer) -> None:
    text = result.out + result.err
    assert "connection refused" in text and "never answered" in text, text


CHECKS = {
    "all_succeeded": _all_succeeded,
    "names_status": _names_status,
    "redirect_not_followed": _redirect_not_followed,
    "timed_out": _timed_out,
    "connection_refused": _connection_refused,
}


def test_library_errors_never_carry_a_key(server):
    """`RateDeck.call` against an echoing target: the error and the response text are clean."""
    import asyncio

    from ratedeck.config import load_config
    from ratedeck.engine import CallFailed, RateDeck

    cfg = load_config(
        overrides={
            "target": {"url": server.url("echo"), "nonce_param": ""},
            "keys": {"secrets": list(KEYS), "limits": ["20/1s"]},
        }
    )

    async def main() -> str:
        async with RateDeck(cfg) as deck:
            try:
                await deck.call({"x": "1"})
            except CallFailed as exc:
                return f"{exc} | {exc.outcome.error}"
        return "no error"

    text = asyncio.run(main())
    assert "400" in text
    for form in _forbidden():
        assert form not in text, form


def test_the_fault_server_itself_works(server):
    """A sanity check of the harness: modes answer as described."""
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(server.url("ok"), timeout=5) as resp:
        assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.url("status/418"), timeout=5)
    assert info.value.code == 418
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(_raw_status(server)))
    t.start()
    t.join(10)
    assert got == [-1]


def _raw_status(server: FaultServer) -> int:
    with socket.create_connection(("127.0.0.1", server.raw_port), timeout=5) as s:
        s.sendall(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        return -1 if s.recv(100) == b"" else 0
