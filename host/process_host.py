"""The engine in a child process, for the console.

On a thread of the console's process, rendering and the engine would share one
interpreter lock; in its own process the engine keeps its core (measured on
50 keys x 100/s: docs/benchmarks.md, "console open vs headless"). The child runs a `Session` on its
own loop, publishes a `Snapshot` every `publish_s` over a pipe, and applies
commands it receives. The parent side has the same face as every host.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ratedeck.config import RunConfig
from ratedeck.core.vocab import Phase
from ratedeck.engine.commands import Command
from ratedeck.engine.settings import ConfigError
from ratedeck.engine.snapshot import Snapshot

from .protocol import RunFacts

_SNAPSHOT, _CONFIG, _FINAL, _FAILED = "snapshot", "config", "final", "failed"
#: How often the child publishes a snapshot. The console pulls every 0.25 s; publishing
#: faster only builds snapshots nobody reads (a few ms each at 50 keys x 100/s).
PUBLISH_S = 0.2
_ABORT_WAIT_S = 3.0  # a stop at once waits this long for the child's last word, then kills it


class ProcessHost:
    """A `Session` in a child process; `snapshot()` returns the latest one published."""

    def __init__(
        self,
        cfg: RunConfig,
        publish_s: float = PUBLISH_S,
        *,
        shard: bool = False,
        make_session: Callable[[RunConfig], Any] | None = None,
    ):
        """`make_session(cfg)`: what the child runs instead of a plain `Session` (the gateway's
        service, which has a session's face); a module-level function, as the child imports it."""
        self.cfg = cfg
        self.publish_s = publish_s
        self.server_stats: dict | None = None
        self.aborted = False  # stopped at once (`abort`), not drained
        self._latest = Snapshot(phase=Phase.STARTING, capacity_tps=cfg.engine_settings.capacity_tps)
        self._facts = RunFacts()
        self._final: Snapshot | None = None
        self._started: Future = Future()
        self._config: Future | None = None
        self._done: Future = Future()
        self._send_lock = threading.Lock()
        ctx = mp.get_context("spawn")  # no fork of a process that may already hold threads
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child_main,
            args=(cfg, child_conn, publish_s, shard, make_session),
            name="ratedeck-engine",
            daemon=True,
        )
        self._child_conn = child_conn
        self._reader: threading.Thread | None = None

    # -- parent side
    def start(self, timeout_s: float = 30.0) -> None:
        """Start the child and wait until its engine runs; raises what its start raised."""
        self.launch()
        self.wait_started(timeout_s)

    def launch(self) -> None:
        """Start the child without waiting for its engine (several start side by side)."""
        self._proc.start()
        self._child_conn.close()
        self._reader = threading.Thread(target=self._read, name="ratedeck-engine-pipe", daemon=True)
        self._reader.start()

    def wait_started(self, timeout_s: float = 30.0) -> None:
        """Wait until the child's engine runs; raises what its start raised."""
        self._started.result(timeout_s)

    def _read(self) -> None:
        try:
            while True:
                kind, value = self._conn.recv()
                if kind == _SNAPSHOT:
                    self._latest, self._facts = value
                    if not self._started.done():
                        self._started.set_result(None)
                elif kind == _CONFIG and self._config is not None:
                    self._config.set_result(value)
                elif kind == _FINAL:
                    final, self.server_stats, self._facts = value
                    self._final = final
                    self._done.set_result(final)
                    return
                elif kind == _FAILED:
                    exc = ConfigError(*value) if isinstance(value, tuple) else RuntimeError(value)
                    for fut in (self._started, self._done):
                        if not fut.done():
                            fut.set_exception(exc)
                    return
        except (EOFError, OSError):  # the child is gone
            problem = RuntimeError("the engine process ended unexpectedly")
            for fut in (self._started, self._done):
                if not fut.done():
                    fut.set_exception(problem)

    def _send(self, message) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, BrokenPipeError):
                pass

    def snapshot(self) -> Snapshot:
        return self._final or self._latest

    @property
    def facts(self) -> RunFacts:
        """The run's counts beyond the snapshot (answers, no-answer causes, graveyard), latest known."""
        return self._facts

    def send(self, command: Command) -> None:
        self._send(("command", command))

    def effective_config(self) -> dict:
        self._config = Future()
        self._send(("config", None))
        return self._config.result(5)

    async def stop(self) -> Snapshot:
        return await asyncio.get_running_loop().run_in_executor(None, self.stop_blocking)

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        """Drain in the child and wait for its final snapshot (at most `timeout_s`, then `abort`)."""
        if self._final is None:
            self._send(("stop", None))
            try:
                self._done.result(timeout_s)
            except Exception:
                return self.abort()
        self._reap()
        return self._final if self._final is not None else self._latest

    def abort(self) -> Snapshot:
        """Stop at once: the child cuts its drain short and reports what is left as queued or
        in flight; if it does not answer within a moment it is killed and the last published
        snapshot stands. Safe from any thread, and before or after `start`."""
        if self._final is None and self._proc.pid is not None:
            self.aborted = True
            self._send(("stop_now", None))
            try:
                self._done.result(_ABORT_WAIT_S)
            except Exception:
                pass
        if self._final is None:
            self._final = self._latest
        self._reap()
        return self._final

    def _reap(self) -> None:
        if self._proc.pid is None:
            return
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


# -- child side


def _child_main(
    cfg: RunConfig, conn, publish_s: float, shard: bool = False, make_session: Callable | None = None
) -> None:
    # The console handles Ctrl-C; a terminal's SIGINT must not kill the engine mid-drain.
    # SIGTERM and SIGHUP (the terminal closed: it goes to the whole process group)
    # drain, as they do for the console; see `_child`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ratedeck.core.loops import loop_factory

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_child(cfg, conn, publish_s, shard, make_session))


async def _child(
    cfg: RunConfig, conn, publish_s: float, shard: bool = False, make_session: Callable | None = None
) -> None:
    from .session import Session

    session: Any = Session(cfg) if make_session is None else make_session(cfg)
    try:
        await session.start()
        # One of several processes: snapshots carry whole histograms, for exact percentiles.
        session.engine.parts.snapshots.mergeable = shard
    except ConfigError as exc:
        conn.send((_FAILED, (exc.source, exc.key, exc.problem)))
        return
    except Exception as exc:  # e.g. the embedded simulator could not bind
        conn.send((_FAILED, f"cannot start: {exc}"))
        return
    loop = asyncio.get_running_loop()
    stop, now = asyncio.Event(), asyncio.Event()

    def on_message() -> None:
        try:
            while conn.poll():
                kind, value = conn.recv()
                if kind == "command":
                    session.send(value)
                elif kind == "config":
                    conn.send((_CONFIG, session.effective_config()))
                elif kind == "stop":
                    stop.set()
                elif kind == "stop_now":
                    stop.set()
                    now.set()
        except (EOFError, OSError):  # the console is gone: drain and end
            loop.remove_reader(conn.fileno())
            stop.set()

    def publish() -> bool:
        try:
            conn.send((_SNAPSHOT, (session.snapshot(), session.facts)))
        except (OSError, BrokenPipeError):
            return False
        return True

    loop.add_reader(conn.fileno(), on_message)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    publish()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), publish_s)
        if not publish():
            break
    # Drain, still publishing (the console shows the drain), until done or told to stop at once.
    drain = asyncio.ensure_future(session.stop())
    cut = asyncio.ensure_future(now.wait())
    while not drain.done() and not cut.done():
        await asyncio.wait({drain, cut}, timeout=publish_s, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            publish()
    cut.cancel()
    if drain.done() and drain.exception() is None:
        final = drain.result()
    else:
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drain
        try:
            final = await session.stop(drain_timeout_s=0)
        except Exception:
            final = session.snapshot()
    with contextlib.suppress(OSError, ValueError):
        loop.remove_reader(conn.fileno())
    try:
        conn.send((_FINAL, (final, session.server_stats, session.facts)))
    except (OSError, BrokenPipeError):
        pass
