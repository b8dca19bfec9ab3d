"""A real `redis-server` for tests: a free loopback port, a temporary directory, no persistence.

    with RedisServer() as server:       # started, answering PING
        server.url                       # redis://127.0.0.1:PORT/0
        server.stop(); server.start()    # the same port again (a restart)

Stopped by its PID (never by name). `.ci/run` installs redis-server when it is
missing; a machine without it fails these tests rather than skipping them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

READY_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process on 127.0.0.1 (`port` kept across `stop`/`start`)."""

    def __init__(self, port: int | None = None, *, persist: bool = False):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed (.ci/run installs it: apt-get install redis-server)"
            )
        self.binary = binary
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="ratedeck-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.persist = persist  # appendonly yes (a restart keeps the state), else no persistence at all

    def args(self) -> list[str]:
        """More arguments for redis-server (a cluster node's)."""
        return []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
        ]
        args += ["--dir", self.dir, "--protected-mode", "yes", *self.args()]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + READY_S
        while not _ping(self.port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {err.strip()[:300]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port} within {READY_S}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # by PID; a kill, as a crash would be
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def redis_server():
    """A fresh redis-server for one test."""
    with RedisServer() as server:
        yield server


def shared_state(url: str, namespace: str):
    """A `RedisShared` on `url`, in `namespace`, on the monotonic clock (a member's view of the store)."""
    from ratedeck.store.redis_shared import RedisShared

    shared = RedisShared(url, namespace=namespace)
    shared.bind(time.monotonic)
    return shared


async def pause_between_grants(grant, rng) -> None:
    """A test member's pause before asking again: until the store said the budget has room
    (at most 50 ms), else 0-10 ms (members asking about as fast as they can)."""
    import asyncio

    if not grant.times and grant.retry_at is not None:
        await asyncio.sleep(max(0.0, min(0.05, grant.retry_at - time.monotonic())))
    else:
        await asyncio.sleep(rng.uniform(0, 0.01))
