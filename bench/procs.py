"""Child processes: the simulator (`ratedeck serve`) and one strategy run each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

from .child import RESULT_PREFIX
from .spec import RunSpec


class BenchError(RuntimeError):
    """A child process failed; the message says which and why, in one line."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


class Simulator:
    """`ratedeck serve` on 127.0.0.1 with a free port, in its own process.

    Use as a context manager; `url` is the `/api/request` address and
    `stats()` reads the server's own counters.
    """

    def __init__(self, serve_args: tuple[str, ...] | list[str], seed: int | None = 1):
        self.args = [
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
            self.args += ["--seed", str(seed)]
        self.proc: subprocess.Popen | None = None
        self.base = ""

    def __enter__(self) -> Simulator:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("ratedeck serve:"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            raise BenchError(f"the simulator did not start: {(line or err).strip()[:300]}")
        self.base = line.split()[2]
        return self

    @property
    def url(self) -> str:
        return f"{self.base}/api/request"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base}/stats", timeout=10) as resp:
            return json.load(resp)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.proc = None

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_child(spec: RunSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Run `spec` in a fresh `python -m ratedeck.bench.child`; its result dict."""
    timeout_s = timeout_s if timeout_s is not None else spec.duration_s + 60.0
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ratedeck.bench.child"],
            input=json.dumps(spec.to_json()),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_env(),
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{spec.strategy}: no result within {timeout_s:.0f} s") from None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise BenchError(f"{spec.strategy}: the run failed (exit {done.returncode}): {tail[:300]}")
