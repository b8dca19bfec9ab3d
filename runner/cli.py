"""The `ratedeck` command: a run (the console, or headless with --no-ui), or one of the
subcommands of runner/commands/, each imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import Any

from ratedeck.core.numbers import parse_duration
from ratedeck.core.version import version
from ratedeck.engine.config import ConfigError, header_line, parse_setting

from . import quiet_startup_interrupt
from .commands import RUN, SUBCOMMANDS, command_module
from .commands import epilog as _epilog
from .commands.common import parse_args


def build_parser(prog: str = "ratedeck") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Push work through rate-limited HTTP APIs as fast as the limits allow, and never faster. "
        "With no target, ratedeck starts its simulator in-process (seed mode).",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"ratedeck {version()}")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (flags override it); default: the user config file when present",
    )
    p.add_argument("--preset", metavar="NAME", help="built-in settings; 'seed' matches the seed server")
    p.add_argument("--target", metavar="URL", help="endpoint to call (default: the embedded simulator)")
    p.add_argument("--method", choices=("GET", "POST"), help="HTTP method (default GET)")
    p.add_argument("--keys", metavar="KEYS", help="API keys: k1,k2,...  or @FILE (one per line) or env:VAR")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--key-header", metavar="NAME", help="send the key in this header")
    g.add_argument("--key-param", metavar="NAME", help="send the key in this query/form parameter")
    p.add_argument(
        "--key-format",
        metavar="TEXT",
        help='how the key is written in its header, like "Bearer {key}" (default: Bearer in Authorization)',
    )
    p.add_argument(
        "--header",
        metavar='"NAME: VALUE"',
        action="append",
        help="a header to send with every request; repeat for several",
    )
    p.add_argument(
        "--timeout", metavar="S", help="seconds to wait for an answer (default 10s; 1s with --preset seed)"
    )
    p.add_argument(
        "--nonce-param",
        metavar="NAME",
        help="parameter for a strictly increasing nonce; 'none' for targets without one",
    )
    p.add_argument(
        "--limit",
        metavar="N/W",
        action="append",
        help="per-key limit like 20/1s; repeat for several (all must hold)",
    )
    p.add_argument("--in-flight", metavar="N", help="requests in flight per key")
    p.add_argument(
        "--rate", metavar="R", help="arrival rate: requests/s, or N/W like 20/1s (default: capacity)"
    )
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals instead of evenly spaced")
    p.add_argument(
        "--workload", metavar="FILE", help="JSONL file of requests (one object of parameters per line)"
    )
    p.add_argument("--total", metavar="N", help="stop generating after N requests")
    p.add_argument(
        "--store",
        metavar="URL",
        help="where the work lives: memory (default), sqlite:PATH (durable), redis://host:port/db (shared);"
        " fill it with 'ratedeck enqueue'",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with a durable --store: take back the jobs a killed run held (uncertain ones are sent again"
        " only with an Idempotency-Key)",
    )
    p.add_argument("--headroom", metavar="MS|adaptive", help="fixed headroom in ms, or 'adaptive' (default)")
    p.add_argument(
        "--probe-url",
        metavar="URL",
        help="a cheap endpoint of the target's host (time, health) polled to measure the network alone",
    )
    p.add_argument("--probe-rate", metavar="N", help="probes per second with --probe-url (default 10)")
    p.add_argument(
        "--rejection-budget",
        metavar="N",
        help="429s the run may spend narrowing its headroom (default 0: never probe; keep 0 where a server bans)",
    )
    p.add_argument("--no-backpressure", action="store_true", help="let the main queue grow (TTLs expire)")
    p.add_argument("--ttl", metavar="S", help="request time-to-live: seconds, or 500ms, 30s, 5m")
    p.add_argument("--duration", metavar="S", help="stop after this long: seconds, or 30s, 5m, 1h")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="write the JSON report here at the end; '-' writes it to stdout (other output goes to stderr)",
    )
    p.add_argument("--graveyard", metavar="FILE", help="JSONL file for requests that used up their attempts")
    p.add_argument(
        "--results",
        metavar="FILE",
        help="JSONL file: one line per request (ending, key, status, timings, params), flushed as they end",
    )
    p.add_argument("--results-body", action="store_true", help="with the response body in each results line")
    p.add_argument(
        "--fail-on",
        metavar="EXPR",
        action="append",
        help="exit 99 when EXPR holds over the report, like rejected_429>0, latency_ms.p99>500, "
        "throughput_tps<90 (repeatable; operators > >= < <= == !=)",
    )
    p.add_argument(
        "--metrics-port",
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics during the run (0: any free port)",
    )
    p.add_argument(
        "--metrics-host",
        metavar="HOST",
        default="127.0.0.1",
        help="address for --metrics-port (default 127.0.0.1)",
    )
    p.add_argument(
        "--metrics-linger",
        metavar="S",
        help="after the run, keep serving the final metrics this long (30s, 2m) or until Ctrl-C",
    )
    p.add_argument("--plot", action="store_true", help="print TPS and latency charts at the end (headless)")
    p.add_argument("--no-ui", action="store_true", help="headless: periodic metrics on stdout, no console")
    p.add_argument(
        "--procs",
        metavar="N|auto",
        help="engine processes, keys shared out among them (auto: one per core; default 1)",
    )
    p.add_argument(
        "--interval", default="5s", metavar="S", help="headless metrics every S seconds (or 500ms)"
    )
    p.add_argument(
        "--theme",
        metavar="NAME",
        help="console theme (ratedeck-dark, ratedeck-light, ratedeck-high-contrast)",
    )
    p.add_argument("--seed", metavar="N", help="random seed for jitter and arrivals")
    p.add_argument("--save-config", metavar="FILE", help="write the effective config as TOML and exit")
    return p


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as a config dict that `load_config` merges over the file.

    Every number is checked here as the config file checks it (core/numbers), so
    a bad one is a `ConfigError` naming the flag. `--interval` is no config
    setting: it is checked too and left in `args.interval` as seconds.
    """
    args.interval = _number("--interval", args.interval, "interval")
    o: dict[str, dict[str, Any]] = {
        "target": {},
        "keys": {},
        "engine": {},
        "workload": {},
        "run": {},
        "console": {},
    }
    if args.target:
        o["target"]["url"] = args.target
    if args.method:
        o["target"]["method"] = args.method
    if args.key_header:
        o["target"]["key_header"] = args.key_header
        o["target"]["key_param"] = ""
    if args.key_param:
        o["target"]["key_param"] = args.key_param
        o["target"]["key_header"] = ""
    if args.key_format:
        o["target"]["key_format"] = args.key_format
    if args.header:
        headers = {}
        for line in args.header:
            try:
                name, value = header_line(line)
            except ValueError as exc:
                raise ConfigError("command line", "--header", str(exc)) from None
            headers[name] = value
        o["target"]["headers"] = headers
    if args.timeout is not None:
        o["target"]["timeout_s"] = args.timeout
    if args.nonce_param:
        o["target"]["nonce_param"] = "" if args.nonce_param.lower() == "none" else args.nonce_param
    if args.keys is not None:  # --keys "" is no keys, never the demo keys
        o["keys"]["secrets"] = (
            [args.keys]
            if args.keys.startswith(("@", "env:"))
            else [k for k in args.keys.split(",") if k.strip()]
        )
    if args.limit:
        o["keys"]["limits"] = args.limit
    if args.in_flight is not None:
        o["engine"]["in_flight_per_key"] = _number("--in-flight", args.in_flight, "engine.in_flight_per_key")
    if args.headroom is not None:
        o["engine"]["headroom"] = _number("--headroom", args.headroom, "engine.headroom")
    if args.probe_url is not None:
        o["target"]["probe_url"] = _number("--probe-url", args.probe_url, "target.probe_url")
    if args.probe_rate is not None:
        o["target"]["probe_rate"] = _number("--probe-rate", args.probe_rate, "target.probe_rate")
    if args.rejection_budget is not None:
        o["engine"]["rejection_budget"] = _number(
            "--rejection-budget", args.rejection_budget, "engine.rejection_budget"
        )
    if args.no_backpressure:
        o["engine"]["backpressure"] = False
    if args.ttl is not None:
        o["engine"]["ttl_s"] = _number("--ttl", args.ttl, "engine.ttl_s")
    if args.graveyard is not None:
        o["engine"]["graveyard_path"] = args.graveyard
    if args.rate is not None:
        o["workload"]["rate"] = _number("--rate", args.rate, "workload.rate")
    if args.poisson:
        o["workload"]["arrival"] = "poisson"
    if args.workload:
        o["workload"]["file"] = args.workload
    if args.total is not None:
        o["workload"]["total"] = _number("--total", args.total, "workload.total")
    if args.store is not None:
        o["run"]["store"] = args.store
    if args.resume:
        o["run"]["resume"] = True
    if args.duration is not None:
        o["run"]["duration_s"] = _number("--duration", args.duration, "run.duration_s")
    if args.report:
        o["run"]["report"] = args.report
    if args.plot:
        o["run"]["plot"] = True
    if args.seed is not None:
        o["run"]["seed"] = _number("--seed", args.seed, "run.seed")
    if args.fail_on:
        o["run"]["fail_on"] = list(args.fail_on)
    if args.results:
        o["run"]["results"] = args.results
    if args.results_body:
        o["run"]["results_body"] = True
    if args.theme:
        o["console"]["theme"] = args.theme
    return {k: v for k, v in o.items() if v}


def _number(flag: str, text: Any, key: str) -> Any:
    """A flag's value checked by the config setting `key` ("interval": the metrics period)."""
    try:
        if key == "interval":
            return parse_duration(text, low=0.05, low_open=False, high=86_400.0)
        return parse_setting(key, text)
    except ValueError as exc:
        raise ConfigError("command line", flag, str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """The `ratedeck` command; the exit codes are `commands.EXIT_CODES`."""
    try:
        _end_startup_guard()
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # Ctrl-C outside any run's own handling (while starting, say)
        try:
            print("ratedeck: interrupted", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        return 130


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(command_module(argv[0])).main(argv[1:])
    parsed = parse_args(build_parser(), argv)  # --help and a bad flag load no more than this module
    if isinstance(parsed, int):
        return parsed
    return importlib.import_module(command_module(RUN)).run_from_args(parsed)


def _end_startup_guard() -> None:
    """From here on, Ctrl-C is a KeyboardInterrupt that `main` (or a run) handles: runner/__init__.py
    makes one during the imports before `main` a quiet exit 130, and `main` takes over from it."""
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is quiet_startup_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    sys.exit(main())
