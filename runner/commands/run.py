"""The command with no name: a run, in the console or headless (--no-ui).

Also what other commands reuse: `plan_run` (the flags and config checked before
anything starts; `replay` and `config show` call it) and `run_from_args`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from ratedeck.config import (
    ConfigError,
    RunConfig,
    load_config,
    read_toml,
    to_toml_dict,
    with_graveyard_place,
)
from ratedeck.core.exits import ExitCode
from ratedeck.core.files import private_write_text
from ratedeck.core.loops import loop_factory
from ratedeck.core.paths import profile_save_path, user_config_path
from ratedeck.host.process_host import ProcessHost
from ratedeck.host.protocol import SpawnedHost
from ratedeck.host.shards import ShardedHost, ShardError, parse_procs, shard_configs
from ratedeck.store.work import open_for_run

from ..cli import overrides_from_args
from ..headless import MetricsEndpoint, check_outputs, conclude, run_headless
from ..thresholds import Threshold, ThresholdError, parse
from .common import fail

if TYPE_CHECKING:
    from ..prometheus import MetricsServer


class RunPlan:
    """A run as the flags and config ask for it, checked before anything starts."""

    def __init__(
        self,
        cfg: RunConfig,
        source: str | None,
        thresholds: list[Threshold],
        metrics: MetricsEndpoint | None,
        interval_s: float,
        procs: int = 1,
    ):
        self.cfg = cfg
        self.source = source  # the config file read, if any
        self.thresholds = thresholds
        self.metrics = metrics
        self.interval_s = interval_s
        self.procs = procs  # engine processes (--procs)


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Config (with the user config file when no --config is given), thresholds and metrics
    options from the flags; raises ConfigError (one line) for anything wrong."""
    cfg, source = load_run_config(args)
    check_store(cfg)
    if (
        cfg.runner.preset_needs_target
        and cfg.engine_settings.target.url is None
        and not cfg.server
        and not cfg.runner.dry_run
    ):
        # The simulator speaks the seed's conventions (a key parameter): a real API's preset
        # against it only ever meets refusals.
        raise ConfigError(
            "command line",
            "--target",
            f"the {cfg.runner.preset} preset is for the real API: give its URL with --target "
            f"('ratedeck presets {cfg.runner.preset}' shows the recipe)",
        )
    thresholds = []
    for i, expression in enumerate(cfg.runner.fail_on):
        try:
            thresholds.append(parse(expression))
        except ThresholdError as exc:
            if args.fail_on:
                raise ConfigError("command line", "--fail-on", str(exc)) from None
            raise ConfigError(source or "config", f"run.fail_on[{i}]", str(exc)) from None
    metrics = _metrics(cfg)
    procs = _procs(args, cfg, metrics)
    return RunPlan(cfg, source, thresholds, metrics, cfg.runner.interval_s, procs)


def _metrics(cfg: RunConfig) -> MetricsEndpoint | None:
    """Where /metrics is served (`metrics_port`), if anywhere; a host or linger without sense is bad input."""
    run = cfg.runner
    if run.metrics_port is None:
        if run.metrics_linger_s is not None:
            raise ConfigError("command line", "--metrics-linger", "needs --metrics-port")
        return None
    host = run.metrics_host.strip()
    if not host:
        raise ConfigError("command line", "--metrics-host", "must be an address like 127.0.0.1 or 0.0.0.0")
    return MetricsEndpoint(run.metrics_port, host, run.metrics_linger_s or 0.0)


def _procs(args: argparse.Namespace, cfg: RunConfig, metrics: MetricsEndpoint | None) -> int:
    """`--procs`, checked against the run: a run that cannot be split is bad input."""
    try:
        procs = parse_procs(cfg.runner.procs)
    except ValueError as exc:
        raise ConfigError("command line", "--procs", str(exc).removeprefix("--procs: ")) from None
    if procs > 1:
        try:
            procs = len(shard_configs(cfg, procs))
        except ShardError as exc:
            raise ConfigError("command line", "--procs", str(exc).removeprefix("--procs ")) from None
        if metrics is not None and args.no_ui:
            raise ConfigError("command line", "--procs", "above 1 does not serve --metrics-port headless yet")
        if cfg.engine_settings.max_cost is not None:
            raise ConfigError("command line", "--procs", "above 1 cannot share one --max-cost cap; use 1")
    return procs


def check_store(cfg: RunConfig) -> None:
    """Open and close the run's store, so a bad one is one line (exit 2) before anything starts."""
    store = open_for_run(cfg.runner, cfg.engine_settings)
    if store is not None:
        asyncio.run(store.close())


def run_from_args(args: argparse.Namespace) -> int:
    """Run what the parsed run flags ask for: the console, headless, or --save-config."""
    try:
        plan = plan_run(args)
    except ConfigError as exc:
        return fail(str(exc))
    cfg = plan.cfg
    if args.save_config:
        return save_config(cfg, args.save_config)
    if cfg.runner.dry_run:
        from ratedeck.runner.dryrun import dry_run

        return dry_run(cfg)
    if plan.interval_s <= 0:
        return fail("--interval: must be above 0 seconds")
    if args.no_ui:
        out = sys.stderr if cfg.runner.report == "-" else None  # stdout is the report's
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(
                run_headless(
                    cfg,
                    interval_s=plan.interval_s,
                    out=out,
                    thresholds=plan.thresholds,
                    metrics=plan.metrics,
                    procs=plan.procs,
                )
            )
    # A run's work is the user's: its graveyard, none named, goes next to the report, else to the
    # XDG state dir. (A gateway places none: its engine keeps no client's request by default.)
    cfg = with_graveyard_place(cfg)
    return run_console(
        cfg, thresholds=plan.thresholds, metrics=plan.metrics, procs=plan.procs, config_file=plan.source
    )


# ---------------------------------------------------------------- config files


def user_config_file() -> Path | None:
    """The user's config file when it exists ($XDG_CONFIG_HOME/ratedeck/config.toml)."""
    path = user_config_path()
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def load_run_config(args: argparse.Namespace) -> tuple[RunConfig, str | None]:
    """The run's config and the file it came from (None: flags and presets only).

    `--config FILE` is read as given. Without it, the user config file is read
    when present, as a layer under the flags: it may hold a whole setup or a
    few defaults (a theme, a keymap, in_flight_per_key), and the seed preset
    fills in the rest when it names no keys or target. A problem in it is
    reported with its path.
    """
    overrides = overrides_from_args(args)
    if args.config is not None:
        return load_config(args.config, args.preset, overrides), args.config
    path = user_config_file()
    if path is None:
        return load_config(None, args.preset, overrides), None
    data = read_toml(path)
    preset = data.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise ConfigError(str(path), "preset", f'must be a preset name like "seed", got {preset!r}')
    try:
        return load_config(None, args.preset or preset, _deep_merge(data, overrides)), str(path)
    except ConfigError as exc:
        try:
            load_config(None, args.preset, overrides)
        except ConfigError:
            raise exc from None  # the flags alone are wrong too: say so as they are
        raise ConfigError(str(path), exc.key, exc.problem) from None  # the file's doing


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def save_config(cfg: RunConfig, path: str) -> int:
    try:
        private_write_text(path, tomli_w.dumps(to_toml_dict(cfg)))
    except (OSError, ValueError) as exc:
        return fail(f"{path}: cannot write: {getattr(exc, 'strerror', None) or exc}")
    print(f"ratedeck: wrote the effective config to {path} (load it with --config {path})")
    return ExitCode.OK


# ---------------------------------------------------------------- the console


def run_console(
    cfg: RunConfig,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
    metrics: MetricsEndpoint | None = None,
    procs: int = 1,
    make_session: Callable[[RunConfig], Any] | None = None,
    config_file: str | None = None,
) -> int:
    """The Textual console; the engine runs in its own process (see host/process_host.py).
    Its `s` saves the settings to `config_file` (the --config given), else the user's config
    file (`core.paths.profile_save_path`).

    q, Ctrl-C, SIGTERM and SIGHUP all drain and leave the console (terminal
    restored); a second Ctrl-C stops at once. The summary, the report and
    the exit code are the headless run's (`headless.conclude`). With
    `metrics`, /metrics is served from this process, from the snapshots the
    console already receives: the engine's process does nothing more. A graveyard still
    "auto" is placed by the engine, from what its source is (engine/build.py).
    """
    problems = check_outputs(cfg)
    if problems:
        for problem in problems:
            fail(problem)
        return ExitCode.USAGE
    host: SpawnedHost = ShardedHost(cfg, procs) if procs > 1 else ProcessHost(cfg, make_session=make_session)
    exporter = None
    if metrics is not None:
        # prometheus_client loads only with --metrics-port
        from ..prometheus import MetricsPortError, Scrape, serve_metrics

        try:
            exporter = serve_metrics(lambda: Scrape(host.snapshot()), metrics.port, metrics.host)
        except MetricsPortError as exc:
            return fail(str(exc))
    try:
        not_started = _start(host)
        if not_started is not None:
            return fail(not_started)
        return _console(cfg, host, thresholds, metrics, exporter, str(profile_save_path(config_file)))
    finally:
        if exporter is not None:
            exporter.close()


def _start(host: SpawnedHost) -> str | None:
    """Start the engine's process; what went wrong, in one line, else None. A failed or
    interrupted start leaves no process behind."""
    try:
        host.start()
    except ConfigError as exc:
        return str(exc)
    except (OSError, RuntimeError, TimeoutError) as exc:
        host.abort()
        return f"cannot start the engine: {exc}"
    except BaseException:  # Ctrl-C while the engine starts
        host.abort()
        raise
    return None


def _console(
    cfg: RunConfig,
    host: SpawnedHost,
    thresholds: list[Threshold] | tuple[Threshold, ...],
    metrics: MetricsEndpoint | None,
    exporter: MetricsServer | None,
    profile_path: str,
) -> int:
    """The console over a started engine, then the last drain, the summary and the report."""
    # textual loads only for the console, never for a headless run
    from ratedeck.console.app import RatedeckApp

    concluding = threading.Event()  # the ordinary quit got past the console
    app = RatedeckApp(
        host,
        theme=cfg.console.theme,
        keymap=cfg.console.keymap or None,
        duration_s=cfg.runner.duration_s,
        profile_path=profile_path,
        on_hangup=_hangup(cfg, host, thresholds, exporter, concluding),
    )
    try:
        final = app.run()
    finally:
        concluding.set()
        with _signals_held():  # the drain and the report are not cut short by a late signal
            final_snap = host.stop_blocking()
    final = final or final_snap
    out = sys.stderr if cfg.runner.report == "-" else sys.stdout
    with _signals_held():
        code = conclude(
            final,
            host.facts,
            cfg,
            out=out,
            server_stats=host.server_stats,
            stopped_at_once=host.aborted,
            thresholds=thresholds,
        )
    if exporter is not None and metrics is not None and metrics.linger_s > 0 and not host.aborted:
        _linger(exporter.url, metrics.linger_s, out)
    return code


def _hangup(
    cfg: RunConfig,
    host: SpawnedHost,
    thresholds: list[Threshold] | tuple[Threshold, ...],
    exporter: MetricsServer | None,
    concluding: threading.Event,
) -> Callable[[], None]:
    """What SIGHUP does: quit as for q; if that is stuck on a terminal that went away,
    drain, write the report and leave, printing nothing."""

    def hangup() -> None:
        if concluding.wait(cfg.engine_settings.drain_s + 5.0):
            return  # the ordinary path finishes the job
        code: int = ExitCode.INTERRUPTED
        try:
            nowhere = open(os.devnull, "w")
            sys.stdout = sys.stderr = nowhere  # the terminal is gone: a write there fails or waits
            with _signals_held():
                final = host.stop_blocking()
                code = conclude(
                    final,
                    host.facts,
                    cfg,
                    out=nowhere,
                    server_stats=host.server_stats,
                    stopped_at_once=host.aborted,
                    thresholds=thresholds,
                )
            if exporter is not None:
                exporter.close()
        finally:
            os._exit(code)  # Textual's shutdown would wait on the dead terminal

    return hangup


def _linger(url: str, seconds: float, out) -> None:
    """Keep the final metrics up for `seconds`, or until Ctrl-C, SIGTERM or SIGHUP."""
    print(f"ratedeck: serving the final metrics at {url} for {seconds:g} s (Ctrl-C to end now)", file=out)
    done = threading.Event()
    before = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            before[sig] = signal.signal(sig, lambda *_: done.set())
    try:
        done.wait(seconds)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _signals_held:
    """SIGINT, SIGTERM and SIGHUP ignored for a moment (the last drain and the report)."""

    def __enter__(self) -> None:
        self._before: dict = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._before[sig] = signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
