"""The gateway as a running thing: the engine (a `Session` fed by a `LiveSource`) and the
aiohttp server in front of it, on one loop; started together, drained together.

A drain (q, SIGTERM) stops taking new clients, answers the requests still queued
503 + Retry-After at once (none of them was sent, so the client may send it again
safely), and lets the ones in flight finish (bounded by `engine.drain_s`), answering
each with the upstream's answer.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import sqlite3
from typing import TYPE_CHECKING

from aiohttp import web

from ratedeck.config import ConfigError, RunConfig
from ratedeck.config.settings import GatewayClient, GatewaySettings
from ratedeck.core.secrets import Redactor, safe_url
from ratedeck.core.vocab import EventKind, Priority
from ratedeck.engine.commands import Command
from ratedeck.engine.settings import FlowSpec
from ratedeck.engine.snapshot import Snapshot
from ratedeck.engine.sources.live import LiveSource
from ratedeck.host.protocol import RunFacts
from ratedeck.host.session import Session
from ratedeck.store.base import StoreError
from ratedeck.store.sqlite import SqliteStore

from .app import GatewayApp
from .auth import GatewayToken
from .batches.api import BatchApi
from .batches.runner import BatchRunner
from .batches.store import BatchStore, MemoryBatchStore, RedisBatchStore, SqliteBatchStore
from .paths import target_base
from .server_log import ACCESS_LOGGER, LOGGER, AccessLog, BadRequests, ServerLog

if TYPE_CHECKING:
    from ratedeck.engine.engine import Engine

#: Connections the listening socket holds waiting to be accepted (many idle clients at once).
BACKLOG = 2048


def parse_listen(text: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as (host, port); ValueError naming the problem."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"must be HOST:PORT like 127.0.0.1:8788, got {text!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port must be a number from 0 to 65535, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port must be a number from 0 to 65535, got {port}")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_gateway(cfg: RunConfig, settings: GatewaySettings) -> tuple[str, int]:
    """The gateway's settings checked before anything starts; `ConfigError` (one line) if wrong."""
    try:
        host, port = parse_listen(settings.listen)
    except ValueError as exc:
        raise ConfigError("command line", "--listen", str(exc)) from None
    if not settings.token and not settings.clients and not is_loopback(host):
        raise ConfigError(
            "command line",
            "--listen",
            f"{host} is reachable beyond this machine: give clients a token with --gateway-token env:VAR",
        )
    if cfg.engine_settings.target.url is None:
        raise ConfigError("command line", "--target", "the gateway needs the API's base URL (--target URL)")
    if not cfg.engine_settings.keys:
        raise ConfigError("command line", "--keys", "the gateway needs at least one key (--keys env:VAR)")
    if cfg.engine_settings.target.signing:
        raise ConfigError(
            "command line", "--preset", "this target signs its requests; the gateway sends bodies as they are"
        )
    for name, value, low in (
        ("--max-wait", settings.max_wait_s, 0.0),
        ("--max-body-mb", settings.max_body_mb, 0.0),
        ("--header-timeout", settings.header_timeout_s, 0.0),
        ("--body-timeout", settings.body_timeout_s, 0.0),
    ):
        if not value > low:
            raise ConfigError("command line", name, f"must be above {low:g}, got {value:g}")
    return host, port


#: The client `--gateway-token` names beside `[[gateway.clients]]`.
DEFAULT_CLIENT = "default"
#: The flow of Batch API lines whose client has no `[[gateway.clients]]` entry (priority batch).
BATCH_FLOW = "batches"


def gateway_clients(settings: GatewaySettings) -> tuple[GatewayClient, ...]:
    """The gateway's clients, their tokens resolved: `[[gateway.clients]]`, then the one
    `--gateway-token` names ("default", standard priority); () with no token (loopback)."""
    clients = list(settings.clients)
    if settings.token:
        clients.append(GatewayClient(DEFAULT_CLIENT, settings.token, FlowSpec(DEFAULT_CLIENT)))
    return tuple(clients)


class GatewayService:
    """Start with `await start()` (the URL it serves), end with `await stop()` (the run's snapshot)."""

    def __init__(
        self, cfg: RunConfig, settings: GatewaySettings | None = None, *, transport=None, events: bool = False
    ):
        """`events`: bad requests are lines of the engine's event log (the console's), not of
        the `ratedeck.gateway` logger (stderr, headless)."""
        self.events = events
        self.settings = settings or cfg.gateway
        self.host, self.port = check_gateway(cfg, self.settings)
        # Each client a flow of the engine's queue: its priority, weight and quotas (engine/flows.py);
        # with one token (or none) one standard flow; and one `batch` flow for the Batch APIs'
        # lines of a client with no flow of its own.
        self.clients = gateway_clients(self.settings)
        if not cfg.engine_settings.flows:
            own = [c.flow for c in self.clients] if self.settings.clients else [FlowSpec(DEFAULT_CLIENT)]
            cfg = cfg.replace(flows=(*own, FlowSpec(BATCH_FLOW, Priority.BATCH)))
        self.batch_store_url = cfg.runner.store
        if self.batch_store_url.startswith("sqlite:"):
            # SQLite keeps the gateway's batches; the engine shares nothing through it (its work
            # comes from the clients), so the session runs on memory.
            cfg = cfg.replace(store="memory")
        self.cfg = cfg
        self.batches: BatchRunner | None = None
        self.resumed = 0  # batches a started gateway took up again from its store
        self.source = LiveSource()
        self.session = Session(cfg, transport=transport, source=self.source)
        self.app: GatewayApp | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.bad: BadRequests | None = None
        self.url = ""

    @property
    def engine(self) -> Engine:
        engine = self.session.engine
        if engine is None:
            raise RuntimeError("the gateway has not started")
        return engine

    async def start(self) -> str:
        engine = await self.session.start()
        try:
            await self.source.ready()
            s = self.settings
            self.batches = self._batch_runner(engine.parts.redact)
            key_header = self.cfg.engine_settings.target.key_header
            assert self.cfg.engine_settings.target.url is not None  # check_gateway
            self.bad = BadRequests(self._say)
            self.app = GatewayApp(
                self.source,
                s,
                GatewayToken([c.token for c in self.clients], key_header),
                target_base(self.cfg.engine_settings.target.url),
                engine.parts.redact,
                usage_streams=self.cfg.engine_settings.target.stream_usage,
                bad=self.bad,
                clients=tuple(c.name for c in self.clients) if s.clients else (),
                batches=BatchApi(self.batches),
            )
            # Every key and the gateway token masked in what the access log shows.
            redact = Redactor(
                [*(k.secret for k in self.cfg.engine_settings.keys), *(c.token for c in self.clients)]
            )
            if s.access_log != "off" and not ACCESS_LOGGER.isEnabledFor(logging.INFO):
                ACCESS_LOGGER.setLevel(logging.INFO)  # asked for: shown wherever the log goes
            self._runner = web.AppRunner(
                self.app.application(),
                handler_cancellation=True,  # a client that leaves cancels its handler: its request is withdrawn
                logger=ServerLog(
                    self.bad
                ),  # a bad request is one line, never aiohttp's stack (server_log.py)
                # Off by default: the periodic lines say what clients got (--access-log: a line per call).
                access_log=ACCESS_LOGGER if s.access_log != "off" else None,
                access_log_class=AccessLog.bound(redact),
                access_log_format=s.access_log,
                keepalive_timeout=s.header_timeout_s,  # also closes a connection that never sends its headers
                shutdown_timeout=self.cfg.engine_settings.drain_s,
            )
            await self._runner.setup()
            self._site = web.TCPSite(self._runner, self.host, self.port, backlog=BACKLOG, reuse_address=True)
            await self._site.start()
        except BaseException:
            await self._close_server()
            await self.session.stop(drain_timeout_s=0)
            raise
        port = self._bound_port()
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}"
        engine.event(EventKind.INFO, f"gateway at {self.url}: clients' requests are paced here")
        self.resumed = resumed = self.batches.resume()
        if resumed:
            engine.event(EventKind.INFO, f"{resumed} unfinished batch(es) taken up again from the store")
        return self.url

    def _batch_runner(self, redact) -> BatchRunner:
        """The Batch APIs' runner over the store `--store` names (SQLite; Redis, where every
        gateway on it serves the same batches), else memory."""
        url = self.batch_store_url
        store: BatchStore
        if url.startswith("sqlite:"):
            path = url.removeprefix("sqlite:")
            try:
                SqliteStore.open(path).close_now()  # made (0600) and checked as a ratedeck store
                store = SqliteBatchStore(path)
            except (StoreError, sqlite3.Error) as exc:
                raise ConfigError("command line", "--store", f"{url}: {exc}") from None
        elif url.strip().lower().startswith(("redis", "unix://")):  # redis://, rediss://, redis+cluster://
            try:
                store = RedisBatchStore(url.strip())
            except StoreError as exc:
                raise ConfigError("command line", "--store", f"{safe_url(url) or 'redis'}: {exc}") from None
        else:
            store = MemoryBatchStore()
        flows = {c.name: i for i, c in enumerate(self.clients)} if self.settings.clients else {}
        return BatchRunner(
            store, self.source, redact, flows, batch_flow=len(self.cfg.engine_settings.flows) - 1
        )

    def _say(self, line: str) -> None:
        """A bad request's line (server_log.BadRequests): the event log's in the console, else a warning."""
        engine = self.session.engine
        if self.events and engine is not None:
            engine.event(EventKind.INFO, line)
        else:
            LOGGER.warning("ratedeck: %s", line)

    def _bound_port(self) -> int:
        server = self._site._server if self._site is not None else None  # aiohttp keeps the socket there
        for sock in getattr(server, "sockets", None) or ():
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                return int(sock.getsockname()[1])
        return self.port

    # ---- a session's face, for the console's engine process (host/process_host.py)
    @property
    def facts(self) -> RunFacts:
        return self.session.facts

    @property
    def server_stats(self) -> dict | None:
        return None  # never the embedded simulator: the gateway needs a target

    def send(self, command: Command) -> None:
        self.session.send(command)

    def effective_config(self) -> dict:
        return self.session.effective_config()

    @property
    def connections(self) -> int:
        """Client connections open now."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    def snapshot(self) -> Snapshot:
        """The engine's snapshot with the clients' view (the engine knows no clients)."""
        snap = self.session.snapshot()
        if self.session.engine is None:
            return snap
        view = self.source.view()
        if self.batches is not None:
            view = dataclasses.replace(view, batches=self.batches.view())
        return dataclasses.replace(snap, clients=view)

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Drain: no new clients, queued requests answered 503 now, in-flight ones finished."""
        if self.app is not None:
            self.app.draining = True
        if self._site is not None:
            await self._site.stop()  # no new connections
            self._site = None
        if self.batches is not None:
            await self.batches.stop()  # batches stay unfinished in the store; their lines in flight end
        self.source.close()
        self.source.withdraw_all()
        await self.session.stop(drain_timeout_s)
        if self.batches is not None:
            await self.batches.close()
        self.source.withdraw_all(retries=True)  # retries left queued when the sending stopped
        await self._close_server()
        if self.bad is not None:
            self.bad.flush()  # what was counted and not said yet
        return self.snapshot()

    async def _close_server(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # waits for handlers still writing their answers


def gateway_session(cfg: RunConfig) -> GatewayService:
    """The console's engine process runs this instead of a plain session (its [gateway] settings
    already checked and the token resolved by the command)."""
    return GatewayService(cfg, events=True)
