"""Running an engine: the target (maybe the embedded simulator), the transport, the host.

Where the engine's loop runs is decided here and nowhere else:
- `Session` runs everything on the caller's loop (headless runner, tests);
- `ThreadHost` runs a `Session` on its own loop in a background thread, so the
  console's rendering never delays a send (see the console issue's note for
  the measurement behind this choice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import Future

from .commands import Command
from .config import ConfigError, RunConfig, to_toml_dict
from .engine import Engine
from .snapshot import Snapshot
from .transport import HttpTransport, Transport


def embedded_server_settings(cfg: RunConfig):
    """Simulator settings for a run with no target: the config's [server] table,
    with the run's keys and limits unless the table names its own."""
    from ratedeck.server.settings import ServerSettings

    table = dict(cfg.server) or {"mode": "seed"}
    if "keys" not in table:
        table["keys"] = [k.secret for k in cfg.keys]
    if "policies" not in table and cfg.keys:
        table["policies"] = [str(p) for p in cfg.keys[0].policies]
    try:
        return ServerSettings.from_dict(table)
    except ValueError as exc:
        raise ConfigError("config", "server", str(exc)) from None


class Session:
    """One run on the current loop: opens the target, builds and starts the engine."""

    def __init__(self, cfg: RunConfig, transport: Transport | None = None):
        self.cfg = cfg
        self._transport = transport
        self.server = None  # the embedded simulator, when there is no target
        self.server_stats: dict | None = None  # its own count, kept at stop
        self.engine: Engine | None = None
        self.target_url: str | None = cfg.target.url

    async def start(self) -> Engine:
        cfg = self.cfg
        if self._transport is None:
            url = cfg.target.url
            if url is None:
                from ratedeck.server.app import start_server

                self.server = await start_server(embedded_server_settings(cfg))
                url = f"{self.server.url}/api/request"
            self.target_url = url
            max_conn = max(1, len(cfg.keys) * cfg.engine.in_flight_per_key)
            self._transport = HttpTransport(cfg.target, url, max_conn)
        self.engine = Engine(cfg, self._transport)
        self.engine.start()
        where = "embedded simulator" if self.server else "target"
        self.engine.event("info", f"{where}: {_safe_url(self.target_url)}")
        return self.engine

    def snapshot(self) -> Snapshot:
        return self.engine.snapshot()

    def send(self, command: Command) -> None:
        try:
            self.engine.apply(command)
        except (ValueError, TypeError) as exc:
            self.engine.event("error", str(exc))

    def effective_config(self) -> dict:
        return to_toml_dict(current_config(self.cfg, self.engine))

    async def stop(self) -> Snapshot:
        snap = await self.engine.stop()
        await self._transport.close()
        if self.server is not None:
            self.server_stats = self.server.rules.stats()
            await self.server.close()
        return snap


def current_config(cfg: RunConfig, engine: Engine) -> RunConfig:
    """The run's config with the live settings (headroom, backpressure, rate) folded in."""
    h = engine.headroom
    eng = dataclasses.replace(cfg.engine, backpressure=engine.backpressure,
                              headroom="adaptive" if h.adaptive else round(h.value_ms, 1))
    wl = dataclasses.replace(cfg.workload, rate=engine.workload.rate)
    return dataclasses.replace(cfg, engine=eng, workload=wl)


def _safe_url(url: str | None) -> str:
    return (url or "").split("?")[0]


class ThreadHost:
    """A `Session` on its own event loop in a daemon thread.

    The engine publishes a snapshot every `publish_s`; `snapshot()` returns
    the latest without touching engine state from this thread. Commands are
    handed over with `call_soon_threadsafe`.
    """

    def __init__(self, cfg: RunConfig, transport: Transport | None = None, publish_s: float = 0.1):
        self.session = Session(cfg, transport)
        self.publish_s = publish_s
        self._latest = Snapshot(phase="starting", capacity_tps=cfg.capacity_tps)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started: Future = Future()
        self._final: Snapshot | None = None

    def start(self) -> None:
        """Start the thread and wait until the engine runs (raises what start raised)."""
        self._thread = threading.Thread(target=self._main, name="ratedeck-engine", daemon=True)
        self._thread.start()
        self._started.result()

    def _main(self) -> None:
        loop = new_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._boot())
        except BaseException as exc:  # report start failures to the caller
            if not self._started.done():
                self._started.set_exception(exc)
            loop.close()
            return
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _boot(self) -> None:
        await self.session.start()
        self._latest = self.session.snapshot()
        self._publisher = asyncio.get_running_loop().create_task(self._publish())
        self._started.set_result(None)

    async def _publish(self) -> None:
        while True:
            await asyncio.sleep(self.publish_s)
            self._latest = self.session.snapshot()

    def snapshot(self) -> Snapshot:
        return self._final or self._latest

    def send(self, command: Command) -> None:
        self._loop.call_soon_threadsafe(self.session.send, command)

    def effective_config(self) -> dict:
        return asyncio.run_coroutine_threadsafe(self._config(), self._loop).result(5)

    async def _config(self) -> dict:
        return self.session.effective_config()

    async def stop(self) -> Snapshot:
        """Drain on the engine's loop, then end the thread; returns the final snapshot."""
        if self._final is not None:
            return self._final
        fut = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        self._final = await asyncio.wrap_future(fut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5)
        return self._final

    def stop_blocking(self) -> Snapshot:
        """`stop()` for a caller with no running loop."""
        if self._final is None:
            self._final = asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        return self._final

    async def _stop(self) -> Snapshot:
        self._publisher.cancel()
        snap = await self.session.stop()
        self._latest = snap
        return snap


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (faster sends), else the standard loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()

