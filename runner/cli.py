"""The `ratedeck` command: console (default), headless run, simulator, bench, sweep."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ratedeck.core.numbers import parse_duration
from ratedeck.engine.config import ConfigError, RunConfig, load_config, parse_setting, to_toml_dict

SUBCOMMANDS = ("serve", "bench", "sweep")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck",
        description="Push work through rate-limited HTTP APIs as fast as the limits allow, and never faster. "
        "With no target, ratedeck starts its simulator in-process (seed mode).",
        epilog="Other commands: 'ratedeck serve' (the simulator), 'ratedeck bench' (benchmarks), "
        "'ratedeck sweep' (goodput against arrival rate). Each takes --help.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (flags override it)")
    p.add_argument("--preset", metavar="NAME", help="built-in settings; 'seed' matches the seed server")
    p.add_argument("--target", metavar="URL", help="endpoint to call (default: the embedded simulator)")
    p.add_argument("--method", choices=("GET", "POST"), help="HTTP method (default GET)")
    p.add_argument("--keys", metavar="KEYS", help="API keys: k1,k2,...  or @FILE (one per line) or env:VAR")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--key-header", metavar="NAME", help="send the key in this header")
    g.add_argument("--key-param", metavar="NAME", help="send the key in this query/form parameter")
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
    p.add_argument("--headroom", metavar="MS|adaptive", help="fixed headroom in ms, or 'adaptive' (default)")
    p.add_argument("--no-backpressure", action="store_true", help="let the main queue grow (TTLs expire)")
    p.add_argument("--ttl", metavar="S", help="request time-to-live: seconds, or 500ms, 30s, 5m")
    p.add_argument("--duration", metavar="S", help="stop after this long: seconds, or 30s, 5m, 1h")
    p.add_argument("--report", metavar="FILE", help="write the JSON report here at the end")
    p.add_argument("--graveyard", metavar="FILE", help="JSONL file for requests that used up their attempts")
    p.add_argument("--plot", action="store_true", help="print TPS and latency charts at the end (headless)")
    p.add_argument("--no-ui", action="store_true", help="headless: periodic metrics on stdout, no console")
    p.add_argument("--interval", default=5.0, metavar="S", help="headless metrics every S seconds (or 500ms)")
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
    if args.duration is not None:
        o["run"]["duration_s"] = _number("--duration", args.duration, "run.duration_s")
    if args.report:
        o["run"]["report"] = args.report
    if args.plot:
        o["run"]["plot"] = True
    if args.seed is not None:
        o["run"]["seed"] = _number("--seed", args.seed, "run.seed")
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


def fail(message: str) -> int:
    print(f"ratedeck: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The `ratedeck` command. Exit codes: see runner/headless.py (0 ok, 1 the target never
    answered, 2 bad input, 3 accounting mismatch, 4 an output not written, 130 interrupted)."""
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
        return _subcommand(argv[0], argv[1:])
    parsed = _parse(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    try:
        cfg = load_config(args.config, args.preset, overrides_from_args(args))
    except ConfigError as exc:
        return fail(str(exc))
    if args.save_config:
        return save_config(cfg, args.save_config)
    if args.interval <= 0:
        return fail("--interval: must be above 0 seconds")
    if args.no_ui:
        from ratedeck.core.loops import loop_factory

        from .headless import run_headless

        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(run_headless(cfg, interval_s=args.interval))
    return run_console(cfg)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """Parse `argv`; a usage error is one line ("ratedeck: error: ... (see ratedeck --help)"), exit 2."""
    from typing import NoReturn

    prog = parser.prog

    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message} (see {prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2


def _end_startup_guard() -> None:
    """From here on, Ctrl-C is a KeyboardInterrupt that `main` (or a run) handles.

    runner/__init__.py makes a Ctrl-C during the imports before `main` a quiet
    exit 130 instead of a traceback; `main` takes over from that guard.
    """
    import signal
    import threading

    from . import quiet_startup_interrupt

    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is quiet_startup_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def save_config(cfg: RunConfig, path: str) -> int:
    import tomli_w

    try:
        Path(path).write_text(tomli_w.dumps(to_toml_dict(cfg)), encoding="utf-8")
    except OSError as exc:
        return fail(f"{path}: cannot write: {exc.strerror or exc}")
    print(f"ratedeck: wrote the effective config to {path} (load it with --config {path})")
    return 0


def run_console(cfg: RunConfig) -> int:
    """The Textual console; the engine runs in its own process (see host/process_host.py).

    q, Ctrl-C, SIGTERM and SIGHUP all drain and leave the console (terminal
    restored); a second Ctrl-C stops at once. The summary, the report and
    the exit code are the headless run's (`headless.conclude`).
    """
    from ratedeck.console.app import RatedeckApp
    from ratedeck.host.process_host import ProcessHost

    from .headless import EXIT_USAGE, check_outputs, conclude

    problems = check_outputs(cfg)
    if problems:
        for problem in problems:
            fail(problem)
        return EXIT_USAGE
    host = ProcessHost(cfg)
    try:
        host.start()
    except ConfigError as exc:
        return fail(str(exc))
    except (OSError, RuntimeError, TimeoutError) as exc:
        host.abort()
        return fail(f"cannot start the engine: {exc}")
    except BaseException:  # Ctrl-C while the engine starts: leave no process behind
        host.abort()
        raise
    app = RatedeckApp(host, theme=cfg.theme, keymap=cfg.keymap or None, duration_s=cfg.duration_s)
    try:
        final = app.run()
    finally:
        with _signals_held():  # the drain and the report are not cut short by a late signal
            final_snap = host.stop_blocking()
    final = final or final_snap
    with _signals_held():
        return conclude(
            final,
            host.facts,
            cfg,
            out=sys.stdout,
            server_stats=host.server_stats,
            stopped_at_once=host.aborted,
        )


class _signals_held:
    """SIGINT, SIGTERM and SIGHUP ignored for a moment (the last drain and the report)."""

    def __enter__(self) -> None:
        import signal
        import threading

        self._before: dict = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._before[sig] = signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc_info: object) -> None:
        import signal

        for sig, handler in self._before.items():
            signal.signal(sig, handler)


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "serve":
        from ratedeck.server.serve import add_serve_arguments, run_serve

        p = argparse.ArgumentParser(
            prog="ratedeck serve",
            description="Run the simulated rate-limited API.",
            epilog="POST /reset (clear all state) is off unless started with --allow-reset; then it needs "
            "the header X-Reset-Token with the token printed at start.",
        )
        add_serve_arguments(p)
        parsed = _parse(p, argv)
        return parsed if isinstance(parsed, int) else run_serve(parsed)
    if name == "bench":
        from ratedeck.bench import main as bench_main

        from .headless import check_output_path

        report = _option_value(argv, "--report")
        problem = check_output_path(report, "report") if report else None
        if problem:
            print(f"ratedeck bench: error: {problem}", file=sys.stderr)
            return 2
        return bench_main(argv)
    from .sweep import main as sweep_main

    return sweep_main(argv)


def _option_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` ("--flag X" or "--flag=X"), the last one given."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


if __name__ == "__main__":
    sys.exit(main())
