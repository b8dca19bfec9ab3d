"""Nothing lost, nothing leaked: signals, output files, bad flags, exit codes, child processes.

Most cases run the real command in a subprocess (a signal is a process's
business); the console ones run it in a pseudo-terminal, to see the
terminal restored.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ratedeck.config import load_config
from ratedeck.core.exits import ExitCode
from ratedeck.engine.queues import Graveyard
from ratedeck.engine.request import Request
from ratedeck.engine.snapshot import Snapshot
from ratedeck.host.session import RunFacts
from ratedeck.runner import headless
from ratedeck.runner.cli import main
from tests.runner.test_report_schema import accounted
from tests.support.fault_server import FaultServer

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]
KEYS = "lifecycle-key-0000000001,lifecycle-key-0000000002"


@pytest.fixture(scope="module")
def server():
    with FaultServer() as srv:
        yield srv


def _balanced(report: Path) -> dict:
    data = json.loads(report.read_text())
    req = data["requests"]
    assert data["balance_ok"], data
    assert req["generated"] == accounted(req)
    return data


def _target_args(url: str, *more: str) -> list[str]:
    return ["--no-ui", "--target", url, "--keys", KEYS, "--limit", "20/1s", "--interval", "0.5", *more]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- flags


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    assert main(["--bogus"]) == 2
    out, err = capsys.readouterr()
    assert err == "ratedeck: error: unrecognized arguments: --bogus (see ratedeck --help)\n" and out == ""
    assert main(["--method", "PUT"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'PUT'" in err and "usage:" not in err
    assert main(["serve", "--nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratedeck serve: error: ") and err.count("\n") == 1
    assert main(["--help"]) == 0 and "usage:" in capsys.readouterr().out


# ---------------------------------------------------------------- output paths


@pytest.mark.parametrize(
    "flag,where",
    [
        ("--graveyard", "dir"),
        ("--graveyard", "/nonexistent/dir/g.jsonl"),
        ("--report", "dir"),
        ("--report", "/nonexistent/dir/r.json"),
    ],
)
@pytest.mark.parametrize("ui", ["--no-ui", "console"])
def test_an_unwritable_output_path_stops_before_the_run(tmp_path, capsys, monkeypatch, flag, where, ui):
    monkeypatch.chdir(tmp_path)
    path = str(tmp_path) if where == "dir" else where
    argv = ["--duration", "5", flag, path] + (["--no-ui"] if ui == "--no-ui" else [])
    start = time.monotonic()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert time.monotonic() - start < 3  # nothing ran
    assert err.count("\n") == 1 and path in err and "final summary" not in out


def test_bench_report_path_is_checked_before_the_bench(capsys):
    start = time.monotonic()
    assert main(["bench", "--quick", "--report", "/nonexistent/dir/bench.json"]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/dir/bench.json" in err and err.count("\n") == 1
    assert time.monotonic() - start < 3


def test_graveyard_lines_reach_the_file_as_they_happen(tmp_path):
    path = tmp_path / "g.jsonl"
    grave = Graveyard(str(path))
    for i in range(3):
        req = Request(i + 1, 0.0, 1.0)
        req.last_error = "HTTP 400"
        grave.add(req, 0.5, 1000.0)
        # readable by another process right away: a kill -9 loses nothing written so far
        assert len(path.read_text().splitlines()) == i + 1
    assert grave.written == 3 and grave.flush() is None
    grave.close()


def test_a_graveyard_that_fails_mid_run_is_not_reported_as_written(tmp_path, server):
    """/dev/full accepts the open and fails every write: the run must say so and exit 4."""
    report = tmp_path / "r.json"
    args = _target_args(server.url("status/400"), "--total", "6", "--graveyard", "/dev/full")
    proc = subprocess.run(
        RATEDECK + args + ["--report", str(report)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "graveyard incomplete: 0 of 6 buried requests written" in proc.stderr
    assert "graveyard: 6 requests in" not in proc.stdout
    assert _balanced(report)["requests"]["graveyard"] == 6


def test_kill_9_loses_at_most_a_partial_graveyard_line(tmp_path, server):
    grave = tmp_path / "g.jsonl"
    args = _target_args(server.url("status/400"), "--duration", "30", "--graveyard", str(grave))
    proc = subprocess.Popen(
        RATEDECK + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if grave.exists() and grave.read_text().count("\n") >= 5:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    text = grave.read_text()
    lines = text.split("\n")
    complete, last = lines[:-1], lines[-1]
    assert len(complete) >= 5 and all(json.loads(line)["last_status"] == 400 for line in complete)
    assert last == ""  # whole lines are written at once


# ---------------------------------------------------------------- exit codes


def test_a_target_that_never_answers_is_not_waited_on_forever(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(headless, "DEAD_TARGET_S", 0.5)
    monkeypatch.setattr(headless, "DEAD_TARGET_ATTEMPTS", 5)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        overrides={
            "target": {"url": f"http://127.0.0.1:{_dead_port()}/x"},
            "keys": {"secrets": KEYS.split(","), "limits": ["20/1s"]},
        }
    )
    assert (
        cfg.runner.duration_s is None and cfg.engine_settings.workload.total is None
    )  # nothing else would stop it
    start = time.monotonic()
    code = asyncio.run(asyncio.wait_for(headless.run_headless(cfg, interval_s=1.0), 30))
    out, err = capsys.readouterr()
    assert code == ExitCode.FAILED == 1
    assert time.monotonic() - start < 15
    assert "no answer from the target" in out and "connection refused x" in out
    assert "the target never answered" in err and "connection refused x" in err


def test_accounting_that_does_not_balance_exits_3(capsys):
    snap = Snapshot(generated=5, succeeded=3, sent=3)
    code = headless.conclude(snap, RunFacts(answers=3), load_config(), out=sys.stdout)
    out, err = capsys.readouterr()
    assert code == ExitCode.UNBALANCED == 3
    assert "MISMATCH 2" in out and "the accounting does not balance: 5 generated, 3 accounted for" in err


# ---------------------------------------------------------------- signals, headless


def _wait_for_traffic(proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("requests") and "succeeded 0 " not in line:
            return


def test_sighup_drains_and_reports_like_sigterm(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        RATEDECK + ["--no-ui", "--interval", "0.5", "--report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: list[str] = []
    try:
        _wait_for_traffic(proc, lines)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopping" in out and "final summary" in out and "Traceback" not in err
    assert _balanced(report)["requests"]["succeeded"] > 0


def _long_drain_config(tmp_path: Path) -> Path:
    path = tmp_path / "long-drain.toml"
    path.write_text("[target]\ntimeout_s = 60\n[engine]\ndrain_timeout_s = 60\nttl_s = 60\n")
    return path


def test_a_second_interrupt_stops_a_long_drain_at_once(tmp_path, server):
    report = tmp_path / "report.json"
    config = _long_drain_config(tmp_path)
    args = _target_args(server.url("hang"), "--total", "4", "--config", str(config), "--report", str(report))
    proc = subprocess.Popen(
        RATEDECK + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        for line in proc.stdout:  # wait until all four hang in flight
            if "in flight 4" in line:
                break
        proc.send_signal(signal.SIGINT)
        for line in proc.stdout:
            if line.startswith("ratedeck: stopping"):
                break
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=15)
        assert time.monotonic() - start < 8
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert "stopping at once" in out and "final summary" in out and "Traceback" not in out + err
    data = _balanced(report)
    assert data["requests"]["in_flight_at_end"] == 4  # reported as what they are, not dropped


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3, 0.7])
def test_ctrl_c_while_starting_prints_no_traceback(tmp_path, delay):
    proc = subprocess.Popen(
        RATEDECK + ["--no-ui", "--duration", "3", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    # The interpreter's own start, before any ratedeck module runs, is out of our hands:
    # a SIGINT there either kills the process by the signal's default action (-SIGINT,
    # silently) or, once Python handles SIGINT but while runpy is still looking up
    # `ratedeck.runner`, prints Python's own two-frame traceback of <frozen runpy> and
    # exits 1 or by the signal (all seen at 0.05 s on a loaded machine); a SIGINT while `site` still runs
    # (the editable install's path finder) ends in Python's "Fatal Python error: init_import_site".
    # Anything from our code is a failure.
    if "Fatal Python error: init_import_site" in err:
        repo = str(Path(__file__).resolve().parents[2])
        ours = [line for line in err.splitlines() if repo in line and "/.venv/" not in line]
        assert proc.returncode != 0 and not ours, err
        return
    booting = (
        err.startswith("Traceback")
        and err.rstrip().endswith("KeyboardInterrupt")
        and all(line.strip().startswith('File "<frozen ') for line in err.splitlines() if "File " in line)
    )
    if booting:
        # Python ends on an uncaught KeyboardInterrupt by the signal itself (-SIGINT) or with 1
        assert proc.returncode in (1, -signal.SIGINT) and "ratedeck" not in err, (proc.returncode, err)
        return
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err)
    assert "Unclosed" not in err


# ---------------------------------------------------------------- signals, console


class Terminal:
    """The command in a pseudo-terminal (80x30), its output collected as bytes."""

    def __init__(self, argv: list[str], cwd: Path):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="30")
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True
        )
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output += chunk

    def wait_for(self, needle: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            assert time.monotonic() < deadline, f"{needle!r} never shown: {bytes(self.output[-500:])!r}"
            assert self.proc.poll() is None, bytes(self.output[-2000:])
            time.sleep(0.05)

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        os.close(self.master)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def _restored(output: bytes) -> bool:
    """The alternate screen left and mouse reporting off, after the last time they were turned on."""
    return output.rfind(b"\x1b[?1049l") > output.rfind(b"\x1b[?1049h") >= 0 and output.rfind(
        b"\x1b[?1000l"
    ) > output.rfind(b"\x1b[?1000h")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_console_quits_like_q_on_sigterm_and_sighup(tmp_path, sig):
    report = tmp_path / "report.json"
    term = Terminal(RATEDECK + ["--report", str(report), "--duration", "60"], tmp_path)
    try:
        term.wait_for(b"Keys")
        time.sleep(1.0)  # some traffic
        term.proc.send_signal(sig)
        code = term.finish()
    finally:
        term.kill()
    output = bytes(term.output)
    assert code == 0, output[-2000:]
    assert _restored(output)
    tail = output[output.rfind(b"\x1b[?1049l") :].decode(errors="replace")
    assert "final summary" in tail and "report written to" in tail and "Traceback" not in tail
    assert _balanced(report)["requests"]["succeeded"] > 0


@pytest.mark.slow
def test_a_second_ctrl_c_in_the_console_stops_at_once(tmp_path, server):
    report = tmp_path / "report.json"
    config = _long_drain_config(tmp_path)
    argv = RATEDECK + [
        "--target",
        server.url("hang"),
        "--keys",
        KEYS,
        "--limit",
        "20/1s",
        "--total",
        "4",
        "--config",
        str(config),
        "--report",
        str(report),
    ]
    term = Terminal(argv, tmp_path)
    try:
        term.wait_for(b"Keys")
        time.sleep(1.0)  # the four requests hang in flight
        os.write(term.master, b"\x03")  # Ctrl+C as the terminal sends it: drain
        term.wait_for(b"draining")
        time.sleep(0.3)
        start = time.monotonic()
        os.write(term.master, b"\x03")  # again: stop at once
        code = term.finish(timeout=20)
        assert time.monotonic() - start < 10
    finally:
        term.kill()
    output = bytes(term.output)
    assert code == 130, output[-2000:]
    assert _restored(output)
    assert _balanced(report)["requests"]["in_flight_at_end"] == 4


# ---------------------------------------------------------------- child processes


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_bench_leaves_no_child_behind_on_sigterm(tmp_path):
    proc = subprocess.Popen(
        RATEDECK
        + ["bench", "--scenarios", "seed", "--strategies", "ratedeck", "--duration", "30", "--micro", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        children: set[int] = set()
        while time.monotonic() < deadline and len(children) < 2:  # the simulator and the strategy
            children = _children(proc.pid)
            time.sleep(0.1)
        assert len(children) >= 2, children
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    time.sleep(0.5)
    assert not [pid for pid in children if _alive(pid)]
    assert proc.returncode == 128 + signal.SIGTERM


# ---------------------------------------------------------------- the simulator


def _serve(*extra: str) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ratedeck.server.serve",
            "--port",
            "0",
            "--keys",
            "SIMKEY-secret-0123456",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    lines = [first]
    if "--allow-reset" in extra:
        lines.append(proc.stdout.readline())
    return proc, first.split()[2], lines


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_simulator_never_logs_a_key_and_refuses_bad_bodies_and_resets(tmp_path):
    proc, base, _ = _serve()
    try:
        url = f"{base}/api/request?api_key=SIMKEY-secret-0123456"
        broken = b'--xyz\r\nContent-Disposition: form-data; name="a"\r\n\r\nbroken'
        assert _post(url, broken, {"Content-Type": "multipart/form-data; boundary=xyz"}) == 400
        assert _post(url, b"zzz", {"Content-Type": "multipart/form-data"}) == 400
        host, port = base.removeprefix("http://").split(":")
        for raw in (
            b"GET /api/request?api_key=SIMKEY-secret-0123456\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /api/request?api_key=SIMKEY-secret-0123456 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        ):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(raw)
                assert s.recv(100).startswith(b"HTTP/1.")
        assert _post(f"{base}/reset", b"", {}) == 403  # off without --allow-reset
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert "SIMKEY-secret" not in out + err and "Traceback" not in err, err
    assert "api_key=" not in err or "api_key=…" in err


def test_serve_allow_reset_prints_a_token_and_needs_it():
    proc, base, lines = _serve("--allow-reset")
    try:
        token = lines[1].split()[-1]
        assert "X-Reset-Token" in lines[1]
        assert _post(f"{base}/reset", b"", {}) == 403
        assert _post(f"{base}/reset", b"", {"X-Reset-Token": "wrong"}) == 403
        assert _post(f"{base}/reset", b"", {"X-Reset-Token": token}) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
