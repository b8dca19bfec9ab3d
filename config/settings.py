"""The settings of one run, per layer: the engine's, the runner's, the console's, the simulator's.

`RunConfig` combines them; the runner hands each layer its own part
(`engine_settings` to the engine, `runner`, `console`, `server`). A setting
is read where its row puts it and nowhere else: `cfg.engine_settings.target`,
`cfg.runner.report`, `cfg.console.theme` (the row's section and layer say
which part: config/rows.py `FIELDS`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ratedeck.core.paths import run_graveyard_path
from ratedeck.core.secrets import redact
from ratedeck.core.vocab import AccessLogForm
from ratedeck.engine.settings import (
    GRAVEYARD_AUTO,
    EngineSettings,
    FlowSpec,
)


@dataclass(frozen=True)
class RunnerSettings:
    """The runner's [run] settings, with what the store needs (`store`, `resume`)."""

    duration_s: float | None = None
    report: str | None = None
    plot: bool = False
    fail_on: tuple[str, ...] = ()  # thresholds over the report ("rejected_429>0")
    results: str | None = None
    errors: str | None = None  # the results lines that did not succeed (a Batch API's error file)
    results_body: bool = False
    results_id: str = "_id"  # the workload field that links a results line to its line
    store: str = "memory"  # memory, sqlite:PATH or redis://host:port/db (ratedeck.store)
    resume: bool = False
    preset: str | None = None
    preset_needs_target: bool = False  # the preset is for a real API, not the simulator: give its URL
    procs: int | str = 1  # engine processes, or "auto": one per core (resolved when the run starts)
    interval_s: float = 5.0  # headless metrics period
    metrics_port: int | None = None  # serve /metrics here during the run (0: any free port)
    metrics_host: str = "127.0.0.1"
    metrics_linger_s: float | None = None  # keep serving the final metrics this long after the run
    dry_run: bool = False  # check the workload and print what it would cost; send nothing
    key_sources: tuple[str, ...] = field(default=(), repr=False)  # as written: literal, env:VAR or @FILE


@dataclass(frozen=True)
class ConsoleSettings:
    """The console's [console] settings."""

    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewayClient:
    """One of the gateway's clients (`[[gateway.clients]]`, config/clients.py): its name, its
    token (as written, `env:VAR`; the command resolves it) and its flow (priority, weight, quotas)."""

    name: str
    token: str = field(repr=False)
    flow: FlowSpec = field(default_factory=lambda: FlowSpec("default"))


@dataclass(frozen=True)
class GatewaySettings:
    """`ratedeck gateway`'s [gateway] settings (the gateway layer reads them)."""

    listen: str = "127.0.0.1:8788"  # host:port the gateway serves on
    token: str | None = field(default=None, repr=False)  # what clients present; env:VAR or @FILE as written
    max_wait_s: float = 120.0  # how long a request may wait queued before a 503
    max_body_mb: int = 32  # a bigger request body: 413
    header_timeout_s: float = 30.0  # a connection that has not sent its headers by then is closed
    body_timeout_s: float = 60.0  # a body not read whole by then: 408
    fail_fast: bool = False  # answer 429 at once instead of queueing (a client may ask per request)
    access_log: AccessLogForm = AccessLogForm.OFF  # a line per answered request, as text or JSON
    # [[gateway.clients]]: several clients, each with its token, priority, weight and quotas
    # (config/clients.py); empty: the one `token` (or none, on loopback).
    clients: tuple[GatewayClient, ...] = field(default=(), repr=False)


_ENGINE = {f.name for f in dataclasses.fields(EngineSettings)}
_RUNNER = {f.name for f in dataclasses.fields(RunnerSettings)}
_CONSOLE = {f.name for f in dataclasses.fields(ConsoleSettings)}


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, per layer. `keys` hold secrets: never print them."""

    engine_settings: EngineSettings = field(default_factory=EngineSettings)
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    server: dict[str, Any] = field(default_factory=dict)  # the embedded simulator's [server] table
    gateway: GatewaySettings = field(default_factory=GatewaySettings)  # `ratedeck gateway`'s [gateway]

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with settings changed by name (`target=...`, `report=...`), in whichever part holds them."""
        parts: dict[str, dict[str, Any]] = {"engine_settings": {}, "runner": {}, "console": {}}
        top: dict[str, Any] = {}
        for name, value in changes.items():
            if name in _ENGINE:
                parts["engine_settings"][name] = value
            elif name in _RUNNER:
                parts["runner"][name] = value
            elif name in _CONSOLE:
                parts["console"][name] = value
            else:
                top[name] = value
        for name, values in parts.items():
            if values:
                top[name] = dataclasses.replace(getattr(self, name), **values)
        return dataclasses.replace(self, **top)

    def __repr__(self) -> str:
        """The parts, with every form of every key masked (a key may hide in a URL or params)."""
        shown = (
            f"RunConfig({self.engine_settings!r}, {self.runner!r}, {self.console!r}, server={self.server!r})"
        )
        return redact(shown, [k.secret for k in self.engine_settings.keys])


def with_graveyard_place(cfg: RunConfig, now: float | None = None) -> RunConfig:
    """`cfg` with its graveyard placed, when none was named (`graveyard_path = "auto"`):
    next to the report (`out.json` -> `out-graveyard.jsonl`), else a file of this run's
    own under the XDG state directory (core/paths.py); never the working directory.
    Called where a run starts, not when the config is read, so `config show` and a saved
    config keep "auto"."""
    engine = cfg.engine_settings.engine
    if engine.graveyard_path != GRAVEYARD_AUTO:
        return cfg
    path = str(run_graveyard_path(cfg.runner.report, now))
    return cfg.replace(engine=dataclasses.replace(engine, graveyard_path=path))
