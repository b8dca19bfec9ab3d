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
    eng = dataclasses.replace(
        cfg.engine,
        backpressure=engine.backpressure,
        headroom="adaptive" if h.adaptive else round(h.value_ms, 1),
    )
    wl = dataclasses.replace(cfg.workload, rate=engine.source.rate)
    return dataclasses.replace(cfg, engine=eng, workload=wl)


def _safe_url(url: str | None) -> str:
    return (url or "").split("?")[0]
