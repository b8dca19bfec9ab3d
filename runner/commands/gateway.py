"""`ratedeck gateway`: a local HTTP server that gives any program ratedeck's pacing.

    ratedeck gateway --preset openai --target https://api.openai.com --keys env:OPENAI_KEYS \\
        --listen 127.0.0.1:8788 --gateway-token env:RATEDECK_TOKEN --no-ui

Every run flag applies (limits, in-flight, headroom, --store, --report, --metrics-port, ...);
the work comes from the clients, so --workload, --rate and --procs do not. With --no-ui the
periodic lines go to stdout; without it the console opens as for a run. Ctrl-C, SIGTERM
(or q) drain: no new clients, queued requests answered 503 + Retry-After at once (none of
them was sent: a client may send it again), in-flight ones finished and answered.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import TextIO

from ratedeck.config import ConfigError, RunConfig
from ratedeck.config.load import parse_setting
from ratedeck.config.parsers import resolve_secrets
from ratedeck.config.settings import GatewaySettings
from ratedeck.core.exits import ExitCode
from ratedeck.core.loops import loop_factory

from ..cli import build_parser as run_parser
from ..headless import (
    Metrics,
    StopSignals,
    _capacity,
    _keys,
    _say,
    _watch,
    check_outputs,
    conclude,
)
from ..thresholds import Threshold
from .common import fail, parse_args
from .run import plan_run

#: The gateway's own flags: (flag, metavar, the [gateway] setting it sets, help).
FLAGS = (
    ("--listen", "HOST:PORT", "listen", "where the gateway serves (default 127.0.0.1:8788)"),
    (
        "--gateway-token",
        "env:VAR|@FILE",
        "token",
        "the token clients present (Authorization: Bearer, x-api-key or the preset's key header);"
        " needed to listen beyond loopback",
    ),
    (
        "--max-wait",
        "S",
        "max_wait_s",
        "longest a request waits for the limits, then 503 + Retry-After (120s)",
    ),
    ("--max-body-mb", "N", "max_body_mb", "a request body over N MiB is answered 413 (32)"),
    (
        "--header-timeout",
        "S",
        "header_timeout_s",
        "close a connection whose request head has not come in S (30s)",
    ),
    ("--body-timeout", "S", "body_timeout_s", "answer 408 to a body not received in S (60s)"),
)


def build_parser() -> argparse.ArgumentParser:
    p = run_parser("ratedeck gateway")
    p.description = (
        "Serve the target's own API on a local port, paced by ratedeck: point any program's base URL"
        " at it. Clients authenticate with the gateway token; keys never leave the gateway."
    )
    p.epilog = None
    group = p.add_argument_group("gateway")
    for flag, metavar, _setting, text in FLAGS:
        group.add_argument(flag, metavar=metavar, help=text)
    group.add_argument(
        "--fail-fast",
        action="store_true",
        help="answer 429 + Retry-After at once instead of queueing (a client may ask: ratedeck-fail-fast: 1)",
    )
    return p


def gateway_settings(args: argparse.Namespace, cfg: RunConfig) -> GatewaySettings:
    """[gateway] with the flags over it, checked; the token resolved (`ConfigError` naming the flag)."""
    values = {}
    for flag, _metavar, setting, _text in FLAGS:
        given = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if given is None:
            continue
        try:
            values[setting] = parse_setting(f"gateway.{setting}", given)
        except ValueError as exc:
            raise ConfigError("command line", flag, str(exc)) from None
    if args.fail_fast:
        values["fail_fast"] = True
    settings = dataclasses.replace(cfg.gateway, **values)
    if settings.token:
        where = "--gateway-token" if "token" in values else "gateway.token"
        found = resolve_secrets(settings.token, "command line", where)
        if len(found) != 1:
            raise ConfigError("command line", where, f"must hold one token, found {len(found)}")
        settings = dataclasses.replace(settings, token=found[0])
    return settings


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    if args.save_config:
        return fail(
            "--save-config: not for the gateway; use 'ratedeck --save-config FILE' with the same flags"
        )
    for flag, given in (("--workload", args.workload), ("--procs", args.procs), ("--rate", args.rate)):
        if given is not None:
            return fail(f"{flag}: the gateway's work comes from its clients, one engine serves them")
    try:
        plan = plan_run(args)
        cfg = plan.cfg
        if cfg.engine_settings.messages is not None:
            raise ConfigError(
                "config", "messages", "the gateway's work comes from its clients, not [messages]"
            )
        settings = gateway_settings(args, cfg)
        from ratedeck.gateway.service import check_gateway

        check_gateway(cfg, settings)
    except ConfigError as exc:
        return fail(str(exc))
    if not args.no_ui:
        from ratedeck.gateway.service import gateway_session

        from .run import run_console

        # The console's engine process runs the gateway; q drains it as it drains a run.
        return run_console(
            cfg.replace(gateway=settings),
            thresholds=plan.thresholds,
            metrics=plan.metrics,
            make_session=gateway_session,
        )
    out = sys.stderr if cfg.runner.report == "-" else sys.stdout
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(
            run_gateway(cfg, settings, plan.interval_s, out, thresholds=plan.thresholds, metrics=plan.metrics)
        )


async def run_gateway(
    cfg: RunConfig,
    settings: GatewaySettings,
    interval_s: float,
    out: TextIO,
    *,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
    metrics: Metrics | None = None,
) -> int:
    """Serve until a signal (or the duration, or every key refused), drain, conclude as a run does."""
    from ratedeck.gateway.service import GatewayService

    # No graveyard is placed here: the engine writes one for live clients only where one was
    # named (--graveyard FILE); what a client sends is its own (docs/files.md).
    problems = check_outputs(cfg)
    if problems:
        for problem in problems:
            _say(f"ratedeck: {problem}", sys.stderr)
        return ExitCode.USAGE
    loop = asyncio.get_running_loop()
    service = GatewayService(cfg, settings)
    exporter = None
    scrapes = None
    if metrics is not None:
        from ..prometheus import LoopSource, MetricsPortError, serve_metrics

        scrapes = LoopSource(loop, cfg.engine_settings.capacity_tps)  # each scrape taken on this loop
        try:
            exporter = serve_metrics(scrapes, metrics.port, metrics.host)
        except MetricsPortError as exc:
            _say(f"ratedeck: {exc}", sys.stderr)
            return ExitCode.USAGE
    signals = StopSignals(loop).install()
    try:
        try:
            url = await service.start()
        except ConfigError as exc:
            _say(f"ratedeck: {exc}", sys.stderr)
            return ExitCode.USAGE
        except OSError as exc:
            _say(f"ratedeck: --listen {settings.listen}: cannot listen: {exc.strerror or exc}", sys.stderr)
            return ExitCode.USAGE
        if scrapes is not None:
            scrapes.engine = service  # its snapshot carries the clients' view
        finished = service.engine.finished
        assert finished is not None
        _say(_start_line(url, service.session.shown_target, cfg, settings), out)
        if exporter is not None:
            _say(f"ratedeck: metrics at {exporter.url}", out)
        await _watch(
            cfg,
            interval_s,
            out,
            signals,
            waiters=[asyncio.ensure_future(finished.wait())],
            facts=lambda: service.session.facts,
            snapshot=service.snapshot,
            done=finished.is_set,
        )
        snap, at_once = await _drain(service, signals, out)
        if scrapes is not None:
            from ..prometheus import Scrape

            scrapes.finish(Scrape(snap))
        return conclude(
            snap,
            service.session.facts,
            cfg,
            out=out,
            server_stats=None,
            stopped_at_once=at_once,
            thresholds=thresholds,
        )
    finally:
        signals.remove()
        if exporter is not None:
            exporter.close()


def _start_line(url: str, target: str, cfg: RunConfig, settings: GatewaySettings) -> str:
    token = "present the gateway token" if settings.token else "need no token (loopback only)"
    return (
        f"ratedeck: gateway at {url} for {target}, {_keys(len(cfg.engine_settings.keys))}, {_capacity(cfg.engine_settings.capacity_tps)};"
        f" clients {token}; Ctrl-C or SIGTERM drains"
    )


async def _drain(service, signals: StopSignals, out: TextIO):
    """Drain the gateway; a second signal cuts it short. (snapshot, stopped at once)."""
    drain = asyncio.ensure_future(service.stop())
    cut = asyncio.ensure_future(signals.now.wait())
    try:
        await asyncio.wait({drain, cut}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cut.cancel()
    if drain.done():
        return drain.result(), False
    _say("ratedeck: stopping at once: what is left is reported as queued or in flight", out)
    drain.cancel()
    try:
        await drain
    except (asyncio.CancelledError, Exception):
        pass
    return await service.stop(drain_timeout_s=0), True
