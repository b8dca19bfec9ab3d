"""The settings of one run, per layer: the engine's, the runner's, the console's, the simulator's.

`RunConfig` combines them; the runner hands each layer its own part
(`engine_settings` to the engine, `runner`, `console`, `server`). Its
attributes also read through to the parts (`cfg.target`, `cfg.report`,
`cfg.theme`), so code that reads one setting needs no path to it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ratedeck.core.paths import run_graveyard_path
from ratedeck.core.policy import Policy
from ratedeck.core.secrets import redact
from ratedeck.engine.api_rules import BudgetSpec, PathRule
from ratedeck.engine.settings import (
    GRAVEYARD_AUTO,
    EngineConfig,
    EngineSettings,
    KeySpec,
    MessagesConfig,
    TargetConfig,
    WorkloadConfig,
)


@dataclass(frozen=True)
class RunnerSettings:
    """The runner's [run] settings, with what the store needs (`store`, `resume`)."""

    duration_s: float | None = None
    report: str | None = None
    plot: bool = False
    fail_on: tuple[str, ...] = ()  # thresholds over the report ("rejected_429>0")
    results: str | None = None
    results_body: bool = False
    results_id: str = "_id"  # the workload field that links a results line to its line
    store: str = "memory"  # memory, sqlite:PATH or redis://host:port/db (ratedeck.store)
    resume: bool = False
    preset: str | None = None
    key_sources: tuple[str, ...] = field(default=(), repr=False)  # as written: literal, env:VAR or @FILE


@dataclass(frozen=True)
class ConsoleSettings:
    """The console's [console] settings."""

    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)


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
        return redact(shown, [k.secret for k in self.keys])

    # ---- the engine's part

    @property
    def target(self) -> TargetConfig:
        return self.engine_settings.target

    @property
    def keys(self) -> tuple[KeySpec, ...]:
        return self.engine_settings.keys

    @property
    def engine(self) -> EngineConfig:
        return self.engine_settings.engine

    @property
    def workload(self) -> WorkloadConfig:
        return self.engine_settings.workload

    @property
    def messages(self) -> MessagesConfig | None:
        return self.engine_settings.messages

    @property
    def budgets(self) -> tuple[BudgetSpec, ...]:
        return self.engine_settings.budgets

    @property
    def paths(self) -> tuple[PathRule, ...]:
        return self.engine_settings.paths

    @property
    def pools(self) -> dict[str, int]:
        return self.engine_settings.pools

    @property
    def host_policies(self) -> tuple[Policy, ...]:
        return self.engine_settings.host_policies

    @property
    def key_weighted(self) -> bool:
        return self.engine_settings.key_weighted

    @property
    def seed(self) -> int | None:
        return self.engine_settings.seed

    @property
    def capacity_tps(self) -> float:
        return self.engine_settings.capacity_tps

    @property
    def arrival_rate(self) -> float:
        return self.engine_settings.arrival_rate

    @property
    def main_queue_max(self) -> int:
        return self.engine_settings.main_queue_max

    @property
    def drain_s(self) -> float:
        return self.engine_settings.drain_s

    # ---- the runner's and the store's

    @property
    def duration_s(self) -> float | None:
        return self.runner.duration_s

    @property
    def report(self) -> str | None:
        return self.runner.report

    @property
    def plot(self) -> bool:
        return self.runner.plot

    @property
    def fail_on(self) -> tuple[str, ...]:
        return self.runner.fail_on

    @property
    def results(self) -> str | None:
        return self.runner.results

    @property
    def results_body(self) -> bool:
        return self.runner.results_body

    @property
    def results_id(self) -> str:
        return self.runner.results_id

    @property
    def store(self) -> str:
        return self.runner.store

    @property
    def resume(self) -> bool:
        return self.runner.resume

    @property
    def preset(self) -> str | None:
        return self.runner.preset

    @property
    def key_sources(self) -> tuple[str, ...]:
        return self.runner.key_sources

    # ---- the console's

    @property
    def theme(self) -> str | None:
        return self.console.theme

    @property
    def keymap(self) -> dict[str, str]:
        return self.console.keymap


def with_graveyard_place(cfg: RunConfig, now: float | None = None) -> RunConfig:
    """`cfg` with its graveyard placed, when none was named (`graveyard_path = "auto"`):
    next to the report (`out.json` -> `out-graveyard.jsonl`), else a file of this run's
    own under the XDG state directory (core/paths.py); never the working directory.
    Called where a run starts, not when the config is read, so `config show` and a saved
    config keep "auto"."""
    if cfg.engine.graveyard_path != GRAVEYARD_AUTO:
        return cfg
    path = str(run_graveyard_path(cfg.report, now))
    return cfg.replace(engine=dataclasses.replace(cfg.engine, graveyard_path=path))
