"""Running an engine: the target (maybe the embedded simulator), the transport, the host.

Where the engine's loop runs:
- `Session` runs everything on the caller's loop (headless runner, library, tests);
- the console runs a `Session` in a child process (`process_host.ProcessHost`),
  so rendering does not share the engine's interpreter lock
  (docs/benchmarks.md, "console open vs headless").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import random
from typing import TYPE_CHECKING

from ratedeck.config import ConfigError, RunConfig, to_toml_dict
from ratedeck.core.loops import tune_gc
from ratedeck.core.secrets import safe_url
from ratedeck.core.study_server import STUDY, current_name
from ratedeck.core.vocab import EventKind, HeadroomMode, Phase
from ratedeck.engine.commands import Command
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.endpoints import run_transport
from ratedeck.engine.http.transport import Transport
from ratedeck.engine.observe.results import ResultsFile
from ratedeck.engine.ports import SharedState, Source
from ratedeck.engine.snapshot import Snapshot
from ratedeck.engine.sources.workload import Workload
from ratedeck.store.base import StoreReport
from ratedeck.store.work import StoreRun, open_for_run

from .protocol import RunFacts
from .run_view import RunView

if TYPE_CHECKING:
    from ratedeck.server.app import RunningServer

__all__ = ["RunFacts", "Session", "current_config", "embedded_server_settings"]


def embedded_server_settings(cfg: RunConfig):
    """Simulator settings for a run with no target: the config's [server] table,
    with the run's keys unless the table names its own.

    In study mode the simulator is the study's server, 20/1s per key,
    whatever the run is told (`--limit 30/1s` then meets real 429s, which is
    how a threshold like `--fail-on rejected_429>0` is tried); in standard
    mode it enforces the run's own limits unless the table names its own.
    """
    from ratedeck.server.settings import ServerSettings

    table = dict(cfg.server) or {"mode": STUDY}
    if "mode" in table:
        table["mode"] = current_name("mode", table["mode"])
    if "keys" not in table:
        table["keys"] = [k.secret for k in cfg.engine_settings.keys]
    if "policies" not in table and cfg.engine_settings.keys and table.get("mode", STUDY) != STUDY:
        table["policies"] = [str(p) for p in cfg.engine_settings.keys[0].policies]
    try:
        return ServerSettings.from_dict(table)
    except ValueError as exc:
        raise ConfigError("config", "server", str(exc)) from None


class Session:
    """One run on the current loop: opens the target, builds and starts the engine.

    An `EngineHost` (host/protocol.py): `stop_blocking` and `abort` are for another
    thread than the loop's (on the loop itself, `await stop()`).
    """

    def __init__(self, cfg: RunConfig, transport: Transport | None = None, source: Source | None = None):
        self.cfg = cfg
        self._transport = transport
        # Where the work comes from when not the config's workload (live clients: the gateway).
        self._source = source
        self.server: RunningServer | None = None  # the embedded simulator, when there is no target
        self.server_stats: dict | None = None  # its own count, kept at stop
        self.engine: Engine | None = None
        self.target_url: str | None = cfg.engine_settings.target.url
        self.results: ResultsFile | None = None  # --results: one line per finished request
        self.store_run: StoreRun | None = None  # --store: the engine's work comes from a store
        self.store_report: StoreReport | None = None  # kept at stop
        self.aborted = False  # stopped at once (`abort`), not drained
        self._closed = False

    @property
    def shown_target(self) -> str:
        """The target as it may be printed: no credentials, no query string; a pool's endpoints
        each by name and URL."""
        endpoints = self.cfg.engine_settings.endpoints
        if endpoints:
            return ", ".join(f"{e.name} {safe_url(e.target.url) or '?'}" for e in endpoints)
        return safe_url(self.target_url) or "?"

    @property
    def where(self) -> str:
        """What the requests go to, in a word or two: "embedded simulator", "target" or "pool"."""
        if self.server:
            return "embedded simulator"
        return "pool" if self.cfg.engine_settings.endpoints else "target"

    async def start(self) -> Engine:
        cfg = self.cfg
        tune_gc()  # an engine process: collect less often (core/loops.py)
        try:
            if self._transport is None:
                url = cfg.engine_settings.target.url
                if url is None:
                    from ratedeck.server.app import start_server

                    self.server = await start_server(embedded_server_settings(cfg))
                    url = f"{self.server.url}/api/request"
                self.target_url = url
                self._transport = run_transport(cfg.engine_settings, url)
            source, shared = await self._work()
            self.engine = Engine(cfg.engine_settings, self._transport, source=source, shared_state=shared)
            if self.server is not None:  # it answers on this loop: its CPU is in the process's figures
                self.engine.parts.loop.shared_with = "the embedded simulator"
            if self.store_run is not None:
                self.store_run.attach(RunView(self.engine))
            if cfg.runner.results or cfg.runner.errors:
                self.results = ResultsFile(
                    cfg.runner.results,
                    RunView(self.engine),
                    body=cfg.runner.results_body,
                    link=cfg.runner.results_id,
                    errors=cfg.runner.errors,
                    store=self.store_run is not None,
                    append=self.store_run is not None,
                    resume=cfg.runner.resume,
                    request_id_headers=cfg.engine_settings.target.request_id_headers,
                )
                self.engine.watch(self.results)
            self.engine.start()
        except BaseException:
            await self._close()  # nothing left open behind a failed (or interrupted) start
            raise
        self.engine.event(EventKind.INFO, f"{self.where}: {self.shown_target}")
        return self.engine

    async def _work(self) -> tuple[Source | None, SharedState | None]:
        """Where the engine's work comes from (the given source, a store's jobs, else the
        config's workload) and the state it shares with other processes (a store many share)."""
        cfg = self.cfg
        store = open_for_run(cfg.runner, cfg.engine_settings)
        if store is None:
            return self._source, None
        if self._source is not None:
            # The work comes from the given source; a store many processes share still shares
            # the budgets. One that only holds jobs has nothing to give such a run.
            shared = store.shared()
            await store.close()
            if shared is None:
                raise ConfigError(
                    "command line",
                    "--store",
                    "this run's work comes from its clients: only a store many processes share"
                    " (redis://host:port/db) has anything for it (the keys' budgets)",
                )
            return self._source, shared
        self.store_run = StoreRun(
            cfg.runner, cfg.engine_settings, store, random.Random(cfg.engine_settings.seed)
        )
        await self.store_run.prepare()
        # A store many processes share (Redis) also shares the keys' budgets and gates.
        return self.store_run.source, store.shared()

    @property
    def facts(self) -> RunFacts:
        """Counts from the transport and the graveyard, for the summary and the exit code."""
        t = self._transport.stats() if self._transport is not None else {}
        engine = self.engine
        graveyard = engine.parts.graveyard if engine is not None else None
        return RunFacts(
            answers=t.get("answers"),
            statuses=tuple(t.get("statuses", {}).items()),
            no_answer=tuple(t.get("no_answer", {}).items()),
            redirects=tuple(t.get("redirects", {}).items()),
            consecutive_no_answer=t.get("consecutive_no_answer", 0),
            retried=t.get("retried", 0),
            graveyard_path=graveyard.path if graveyard is not None else None,
            graveyard_written=graveyard.written if graveyard is not None else 0,
            graveyard_problem=graveyard.problem if graveyard is not None else None,
            problems=tuple(engine.parts.ends.problems) if engine is not None else (),
            results_path=self.results.shown_path if self.results is not None else None,
            results_written=self.results.written if self.results is not None else 0,
            results_problem=self.results.problem if self.results is not None else None,
            store=self.store_report,
        )

    def snapshot(self) -> Snapshot:
        if self.engine is None:
            return Snapshot(phase=Phase.STARTING, capacity_tps=self.cfg.engine_settings.capacity_tps)
        return self.engine.snapshot()

    def _started(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the session has not started")
        return self.engine

    def send(self, command: Command) -> None:
        engine = self._started()
        try:
            engine.apply(command)
        except (ValueError, TypeError) as exc:
            engine.event(EventKind.ERROR, str(exc))

    def effective_config(self) -> dict:
        return to_toml_dict(current_config(self.cfg, self._started()))

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Drain (bounded by `drain_timeout_s`, default the config's) and close everything.

        Cancelled during the drain, it closes nothing: call it again with
        `drain_timeout_s=0` to stop at once; what is still queued or in flight
        is then reported as such.
        """
        snap = await self._started().stop(drain_timeout_s)
        await self._close()
        return snap

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        """From another thread: drain on the engine's loop and wait (at most `timeout_s`, then `abort`)."""
        loop = self._other_loop()
        if loop is None:
            return self.snapshot()
        done = asyncio.run_coroutine_threadsafe(self.stop(), loop)
        try:
            return done.result(timeout_s)
        except concurrent.futures.TimeoutError:
            done.cancel()
            return self.abort()

    def abort(self) -> Snapshot:
        """From another thread: stop at once; what is left is reported as queued or in flight."""
        self.aborted = True
        loop = self._other_loop()
        if loop is None:
            return self.snapshot()
        return asyncio.run_coroutine_threadsafe(self.stop(drain_timeout_s=0), loop).result()

    def _other_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop (None: not started), refused when called on that loop itself."""
        loop = self.engine.parts.run.loop if self.engine is not None else None
        if loop is None or loop.is_closed():
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("on the engine's own loop: await stop() instead")
        return loop

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.store_run is not None:
            self.store_report = await self.store_run.finish(RunView(self.engine) if self.engine else None)
        if self.engine is not None:
            self.engine.parts.graveyard.close()
            if self.results is not None:
                if self.engine.parts.run.ended_at is not None:
                    self.results.left_over()
                    source = self.engine.parts.source
                    if self.store_run is None and isinstance(source, Workload) and source.items is not None:
                        self.results.not_read(source.items)
                self.results.close()
        if self._transport is not None:
            await self._transport.close()
        if self.server is not None:
            self.server_stats = self.server.rules.stats()
            await self.server.close()


def current_config(cfg: RunConfig, engine: Engine) -> RunConfig:
    """The run's config with the live settings (headroom, backpressure, rate) folded in."""
    h = engine.parts.headroom
    eng = dataclasses.replace(
        cfg.engine_settings.engine,
        backpressure=engine.parts.intake.backpressure,
        headroom=HeadroomMode.ADAPTIVE if h.adaptive else round(h.value_ms, 1),
    )
    source = engine.parts.source
    fed = source.fed  # a job with no arrival rate stays one when saved
    wl = dataclasses.replace(cfg.engine_settings.workload, rate=None if fed else source.rate)
    return cfg.replace(engine=eng, workload=wl)
