"""Child processes: the simulator (`ratedeck serve`) and one strategy run each.

No child outlives the bench: every child started here is tracked, and while
any runs, SIGTERM and SIGHUP to the bench terminate them all before the
bench ends (exit 128 + the signal); Ctrl-C is a KeyboardInterrupt that the
`with Simulator` blocks and `run_child` clean up after. On Linux a child is
also told to die with its parent (PR_SET_PDEATHSIG), for a bench killed
with SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from typing import Any, Self

from .child import RESULT_PREFIX
from .spec import RunSpec


class BenchError(RuntimeError):
    """A child process failed; the message says which and why, in one line."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


# ---------------------------------------------------------------- children never orphaned

_children: set[subprocess.Popen] = set()
_lock = threading.RLock()  # a signal handler may take it while the main thread holds it
_previous: dict[int, Any] = {}  # signal -> the handler before ours, while children run
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM when the bench dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _spawn(args: list[str], **kwargs: Any) -> subprocess.Popen:
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    proc = subprocess.Popen(args, env=_env(), preexec_fn=preexec, **kwargs)
    with _lock:
        _children.add(proc)
        if len(_children) == 1:
            _catch_stop_signals()
    return proc


def _forget(proc: subprocess.Popen) -> None:
    with _lock:
        _children.discard(proc)
        if not _children:
            _release_stop_signals()


def terminate_children() -> None:
    """Terminate (then kill) every child still running."""
    with _lock:
        procs = list(_children)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()


def _on_stop_signal(signum: int, frame: object) -> None:
    terminate_children()
    raise SystemExit(128 + signum)  # unwinds through every `with Simulator` and `finally`


def _catch_stop_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            _previous[sig] = signal.signal(sig, _on_stop_signal)


def _release_stop_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in list(_previous.items()):
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    _previous.clear()


class _Child:
    """A server of the bench's in a process of its own: started by `with`, ready once it printed
    its banner (`banner` then the address it serves), stopped (`stop_child`) on the way out."""

    banner = ""  # how its first line begins
    what = ""  # what it is, for the error when it does not start

    def __init__(self, args: list[str]):
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.base = ""

    def __enter__(self) -> Self:
        self.proc = _spawn(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith(self.banner):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            raise BenchError(f"the {self.what} did not start: {(line or err).strip()[:300]}")
        self.base = line.split()[2]
        return self

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        stop_child(proc)

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Simulator(_Child):
    """`ratedeck serve` on 127.0.0.1 with a free port, in its own process.

    Use as a context manager; `url` is the `/api/request` address and
    `stats()` reads the server's own counters (with `arrivals`, each key's accept stamps too).
    """

    banner, what = "ratedeck serve:", "simulator"

    def __init__(self, serve_args: tuple[str, ...] | list[str], seed: int | None = 1):
        args = [
            sys.executable,
            "-m",
            "ratedeck.server.serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *serve_args,
        ]
        if seed is not None:
            args += ["--seed", str(seed)]
        super().__init__(args)

    @property
    def url(self) -> str:
        return f"{self.base}/api/request"

    def stats(self, arrivals: bool = False) -> dict[str, Any]:
        query = "?arrivals=1" if arrivals else ""
        with urllib.request.urlopen(f"{self.base}/stats{query}", timeout=30) as resp:
            return json.load(resp)


class JitterProxyProcess(_Child):
    """`python -m ratedeck.bench.jitter` in its own process, in front of `base` (http://host:port).

    Use as a context manager; `base` is then the proxy's address. It stops by
    itself after `max_s` seconds.
    """

    banner, what = "jitter proxy:", "jitter proxy"

    def __init__(self, target_base: str, delay_ms: str, seed: int, max_s: float):
        target = target_base.split("://", 1)[-1].rstrip("/")
        super().__init__(
            [
                sys.executable,
                "-m",
                "ratedeck.bench.jitter",
                "--target",
                target,
                "--delay",
                delay_ms,
                "--seed",
                str(seed),
                "--max-s",
                f"{max_s:g}",
            ]
        )


def run_child(spec: RunSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Run `spec` in a fresh `python -m ratedeck.bench.child`; its result dict."""
    timeout_s = timeout_s if timeout_s is not None else spec.duration_s + 60.0
    proc = _spawn(
        [sys.executable, "-m", "ratedeck.bench.child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        try:
            stdout, stderr = proc.communicate(json.dumps(spec.to_json()), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{spec.strategy}: no result within {timeout_s:.0f} s") from None
    finally:
        if proc.poll() is None:  # timed out or interrupted: it does not outlive the call
            proc.kill()
            proc.communicate()
        _forget(proc)
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    raise BenchError(f"{spec.strategy}: the run failed (exit {proc.returncode}): {tail[:300]}")


def stop_child(proc: subprocess.Popen, wait_s: float = 10.0) -> None:
    """End a child the bench started: SIGTERM, then SIGKILL after `wait_s`; close its pipes."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        _forget(proc)
