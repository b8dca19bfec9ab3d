"""`ratedeck gateway`: a local HTTP server that gives any program ratedeck's pacing.

    ratedeck gateway --preset openai --target https://api.openai.com --keys env:OPENAI_KEYS \\
        --listen 127.0.0.1:8788 --gateway-token env:RATEDECK_TOKEN --no-ui

The run's flags apply (limits, in-flight, headroom, --store, --report, --metrics-port, ...)
but those that shape a run's work (--workload, --rate, --procs, ...: `Flag.commands` in
config/rows.py), which the gateway does not take: its work comes from its clients. With --no-ui the
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
from ratedeck.config.flags import flag_rows
from ratedeck.config.parsers import resolve_secrets
from ratedeck.config.rows import GATEWAY, RUN
from ratedeck.config.settings import GatewayClient, GatewaySettings
from ratedeck.core.exits import ExitCode
from ratedeck.core.loops import loop_factory

from ..cli import build_parser as run_parser
from ..headless import (
    MetricsEndpoint,
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


def build_parser() -> argparse.ArgumentParser:
    """The run's parser with the flags the gateway takes (config/rows.py `Flag.commands`)."""
    p = run_parser("ratedeck gateway", GATEWAY)
    p.description = (
        "Serve the target's own API on a local port, paced by ratedeck: point any program's base URL"
        " at it. Clients authenticate with the gateway token; keys never leave the gateway."
    )
    p.epilog = None
    return p


def refused_flag(argv: list[str]) -> str | None:
    """The first flag of a run the gateway does not take (one line, exit 2, rather than
    argparse's "unrecognized arguments"); None when there is none."""
    taken = {row.flag.name for row in flag_rows(GATEWAY) if row.flag is not None}
    runs = {row.flag.name for row in flag_rows(RUN) if row.flag is not None} - taken
    for arg in argv:
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if name == "--save-config":
            return (
                "--save-config: not for the gateway; use 'ratedeck --save-config FILE' with the run's flags"
            )
        if name in runs:
            return f"{name}: the gateway's work comes from its clients, one engine serves them (a run's flag)"
    return None


def gateway_settings(args: argparse.Namespace, cfg: RunConfig) -> GatewaySettings:
    """[gateway] (the flags already over it), the token resolved (`ConfigError` naming its place)."""
    settings = cfg.gateway
    if settings.token:
        where = "--gateway-token" if getattr(args, "gateway_token", None) else "gateway.token"
        found = resolve_secrets(settings.token, "command line", where)
        if len(found) != 1:
            raise ConfigError("command line", where, f"must hold one token, found {len(found)}")
        settings = dataclasses.replace(settings, token=found[0])
    if settings.clients:
        token_where = "--gateway-token" if getattr(args, "gateway_token", None) else "gateway.token"
        source = str(getattr(args, "config", None) or "config")
        settings = dataclasses.replace(settings, clients=_resolved(settings, source, token_where))
    return settings


def _resolved(settings: GatewaySettings, source: str, token_where: str) -> tuple[GatewayClient, ...]:
    """`[[gateway.clients]]` with each token resolved: one token each, no two alike (nor like
    `--gateway-token`'s), none named like the token's own client ("default")."""
    from ratedeck.gateway.service import DEFAULT_CLIENT

    clients = []
    seen: dict[str, str] = {settings.token: DEFAULT_CLIENT} if settings.token else {}
    for i, client in enumerate(settings.clients):
        where = f"gateway.clients[{i}].token"
        found = resolve_secrets(client.token, source, where)
        if len(found) != 1:
            raise ConfigError(source, where, f"must hold one token, found {len(found)}")
        if found[0] in seen:
            other = seen[found[0]]
            raise ConfigError(
                source,
                where,
                f"is the same token as {token_where if other == DEFAULT_CLIENT else repr(other)}'s:"
                " each client needs its own",
            )
        if settings.token and client.name == DEFAULT_CLIENT:
            raise ConfigError(
                source,
                f"gateway.clients[{i}].name",
                f"{DEFAULT_CLIENT!r} is the name of {token_where}'s client; choose another",
            )
        seen[found[0]] = client.name
        clients.append(dataclasses.replace(client, token=found[0]))
    return tuple(clients)


def main(argv: list[str]) -> int:
    if refused := refused_flag(argv):
        return fail(refused)
    parsed = parse_args(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
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
        if settings.access_log != "off" and not args.no_ui:
            raise ConfigError(
                "command line", "--access-log", "needs --no-ui (the console holds the terminal)"
            )
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
    from ratedeck.gateway.server_log import logging_to

    out = sys.stderr if cfg.runner.report == "-" else sys.stdout
    # Bad requests (one line each, or a summary), faults of the gateway's own code and the
    # access log when asked: on stderr, the periodic lines' stream kept clean.
    with asyncio.Runner(loop_factory=loop_factory()) as runner, logging_to(sys.stderr, settings.access_log):
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
    metrics: MetricsEndpoint | None = None,
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
        if service.resumed:
            _say(f"ratedeck: {service.resumed} unfinished batch(es) taken up again from the store", out)
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
    if settings.clients:
        names = [f"{c.name} ({c.flow.priority})" for c in settings.clients]
        if settings.token:
            names.append("default (standard, --gateway-token)")
        token = f"are {', '.join(names)}, each with its own token"
    else:
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
