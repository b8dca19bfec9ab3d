"""Running an engine: the target (maybe the embedded simulator), the transport, the host.

Where the engine's loop runs:
- `Session` runs everything on the caller's loop (headless runner, library, tests);
- the console runs a `Session` in a child process (`process_host.ProcessHost`):
  measured on 50 keys x 100/s, a thread of the console's own process lost
  about 19% of throughput to rendering (one interpreter lock), a process
  lost under 1%.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ratedeck.core.secrets import safe_url
from ratedeck.engine.commands import Command
from ratedeck.engine.config import ConfigError, RunConfig, to_toml_dict
from ratedeck.engine.engine import Engine
from ratedeck.engine.snapshot import Snapshot
from ratedeck.engine.transport import HttpTransport, Transport


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


@dataclass(frozen=True)
class RunFacts:
    """What a run's summary needs besides the snapshot: plain data, safe to print.

    It crosses the console's process pipe, so it holds only numbers and
    already-masked texts. `answers` is None when the transport does not count
    answers (a transport of the caller's own).
    """

    answers: int | None = None
    statuses: tuple[tuple[int, int], ...] = ()  # status -> answers
    no_answer: tuple[tuple[str, int], ...] = ()  # cause -> attempts ("connection refused", 57)
    redirects: tuple[tuple[str, int], ...] = ()  # 3xx not followed, by status and place
    consecutive_no_answer: int = 0
    graveyard_path: str | None = None
    graveyard_written: int = 0
    graveyard_problem: str | None = None
    problems: tuple[str, ...] = ()


class Session:
    """One run on the current loop: opens the target, builds and starts the engine."""

    def __init__(self, cfg: RunConfig, transport: Transport | None = None):
        self.cfg = cfg
        self._transport = transport
        self.server = None  # the embedded simulator, when there is no target
        self.server_stats: dict | None = None  # its own count, kept at stop
        self.engine: Engine | None = None
        self.target_url: str | None = cfg.target.url
        self._closed = False

    @property
    def shown_target(self) -> str:
        """The target as it may be printed: no credentials, no query string."""
        return safe_url(self.target_url) or "?"

    async def start(self) -> Engine:
        cfg = self.cfg
        try:
            if self._transport is None:
                url = cfg.target.url
                if url is None:
                    from ratedeck.server.app import start_server

                    self.server = await start_server(embedded_server_settings(cfg))
                    url = f"{self.server.url}/api/request"
                self.target_url = url
                max_conn = max(1, len(cfg.keys) * cfg.engine.in_flight_per_key)
                secrets = tuple(k.secret for k in cfg.keys)
                self._transport = HttpTransport(cfg.target, url, max_conn, secrets=secrets)
            self.engine = Engine(cfg, self._transport)
            self.engine.start()
        except BaseException:
            await self._close()  # nothing left open behind a failed (or interrupted) start
            raise
        where = "embedded simulator" if self.server else "target"
        self.engine.event("info", f"{where}: {self.shown_target}")
        return self.engine

    def facts(self) -> RunFacts:
        """Counts from the transport and the graveyard, for the summary and the exit code."""
        stats = getattr(self._transport, "stats", None)
        t = stats() if callable(stats) else {}
        engine = self.engine
        graveyard = engine.graveyard if engine is not None else None
        return RunFacts(
            answers=t.get("answers"),
            statuses=tuple(t.get("statuses", {}).items()),
            no_answer=tuple(t.get("no_answer", {}).items()),
            redirects=tuple(t.get("redirects", {}).items()),
            consecutive_no_answer=t.get("consecutive_no_answer", 0),
            graveyard_path=graveyard.path if graveyard is not None else None,
            graveyard_written=graveyard.written if graveyard is not None else 0,
            graveyard_problem=graveyard.problem if graveyard is not None else None,
            problems=tuple(engine.problems) if engine is not None else (),
        )

    def snapshot(self) -> Snapshot:
        return self.engine.snapshot()

    def send(self, command: Command) -> None:
        try:
            self.engine.apply(command)
        except (ValueError, TypeError) as exc:
            self.engine.event("error", str(exc))

    def effective_config(self) -> dict:
        return to_toml_dict(current_config(self.cfg, self.engine))

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Drain (bounded by `drain_timeout_s`, default the config's) and close everything.

        Cancelled during the drain, it closes nothing: call it again with
        `drain_timeout_s=0` to stop at once; what is still queued or in flight
        is then reported as such.
        """
        snap = await self.engine.stop(drain_timeout_s)
        await self._close()
        return snap

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.engine is not None:
            self.engine.graveyard.close()
        if self._transport is not None:
            await self._transport.close()
        if self.server is not None:
            self.server_stats = self.server.rules.stats()
            await self.server.close()


def current_config(cfg: RunConfig, engine: Engine) -> RunConfig:
    """The run's config with the live settings (headroom, backpressure, rate) folded in."""
    h = engine.headroom
    eng = dataclasses.replace(
        cfg.engine,
        backpressure=engine.backpressure,
        headroom="adaptive" if h.adaptive else round(h.value_ms, 1),
    )
    wl = dataclasses.replace(cfg.workload, rate=engine.source.rate)
    return dataclasses.replace(cfg, engine=eng, workload=wl)
