"""The `ratedeck` command: console (default), headless run, simulator, bench, sweep, replay,
config, completion."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import Any

from ratedeck.config import ConfigError, RunConfig, load_config, read_toml, to_toml_dict
from ratedeck.config.flags import add_setting_flags
from ratedeck.config.flags import overrides_from_args as setting_overrides
from ratedeck.core.numbers import parse_duration, whole
from ratedeck.core.paths import user_config_path
from ratedeck.core.version import version

#: Every subcommand, with its one line for `ratedeck --help`.
COMMANDS = {
    "serve": "the simulator: a rate-limited API to play against",
    "bench": "benchmarks: ratedeck against peer limiters, on the simulator",
    "sweep": "goodput against arrival rate for messages of several calls",
    "replay": "send the requests of a graveyard or results file again (FILE [run flags])",
    "enqueue": "add a JSONL workload's lines to a store as jobs (--store URL FILE); 'ratedeck --store URL' works them",
    "config": "'config path': the user config file; 'config show [flags]': the config in force, keys masked",
    "completion": "'completion bash' or 'completion zsh': a shell completion script",
    "presets": "the built-in presets for real APIs (github, stripe, binance, kraken) and what each sets",
}
SUBCOMMANDS = tuple(COMMANDS)

EXIT_CODES = "0 ok, 1 the target never answered, 2 bad input, 3 accounting mismatch, 4 an output not written, 99 a --fail-on threshold held, 130 interrupted"


def _epilog() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    lines = ["commands:", f"  {'(none)':<{width}}run: the console, or headless with --no-ui"]
    lines += [f"  {name:<{width}}{text}" for name, text in COMMANDS.items()]
    lines += [
        "",
        "Each command takes --help. With no --config, $XDG_CONFIG_HOME/ratedeck/config.toml"
        " (~/.config/ratedeck/config.toml) is read when present.",
        f"Exit codes: {EXIT_CODES}.",
    ]
    return "\n".join(lines)


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
    add_setting_flags(p)  # one flag per setting that has one (ratedeck.config.rows)
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
    p.add_argument("--no-ui", action="store_true", help="headless: periodic metrics on stdout, no console")
    p.add_argument(
        "--procs",
        metavar="N|auto",
        help="engine processes, keys shared out among them (auto: one per core; default 1)",
    )
    p.add_argument(
        "--interval", default="5s", metavar="S", help="headless metrics every S seconds (or 500ms)"
    )
    p.add_argument("--save-config", metavar="FILE", help="write the effective config as TOML and exit")
    return p


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as a config dict that `load_config` merges over the file (ratedeck.config.flags).

    `--interval` is no config setting: it is checked too and left in `args.interval` as seconds.
    """
    args.interval = _number("--interval", args.interval)
    return setting_overrides(args)


def _number(flag: str, text: Any) -> float:
    """`--interval`'s value: the headless metrics period in seconds."""
    try:
        return parse_duration(text, low=0.05, low_open=False, high=86_400.0)
    except ValueError as exc:
        raise ConfigError("command line", flag, str(exc)) from None


def fail(message: str) -> int:
    print(f"ratedeck: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The `ratedeck` command. Exit codes: see runner/headless.py (0 ok, 1 the target never
    answered, 2 bad input, 3 accounting mismatch, 4 an output not written, 99 a threshold
    failed, 130 interrupted)."""
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
    return _run_from_args(parsed)


class RunPlan:
    """A run as the flags and config ask for it, checked before anything starts."""

    def __init__(
        self,
        cfg: RunConfig,
        source: str | None,
        thresholds: list,
        metrics: Any,
        interval_s: float,
        procs: int = 1,
    ):
        self.cfg = cfg
        self.source = source  # the config file read, if any
        self.thresholds = thresholds
        self.metrics = metrics  # headless.Metrics or None
        self.interval_s = interval_s
        self.procs = procs  # engine processes (--procs)


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Config (with the user config file when no --config is given), thresholds and metrics
    options from the flags; raises ConfigError (one line) for anything wrong."""
    from .headless import Metrics
    from .thresholds import ThresholdError, parse

    cfg, source = load_run_config(args)
    check_store(cfg)
    thresholds = []
    for i, expression in enumerate(cfg.fail_on):
        try:
            thresholds.append(parse(expression))
        except ThresholdError as exc:
            if args.fail_on:
                raise ConfigError("command line", "--fail-on", str(exc)) from None
            raise ConfigError(source or "config", f"run.fail_on[{i}]", str(exc)) from None
    metrics = None
    if args.metrics_port is not None:
        try:
            port = whole(args.metrics_port, low=0, high=65535)
        except ValueError as exc:
            raise ConfigError("command line", "--metrics-port", str(exc)) from None
        linger = 0.0
        if args.metrics_linger is not None:
            try:
                linger = parse_duration(args.metrics_linger, low=0.0, low_open=False, high=86_400.0)
            except ValueError as exc:
                raise ConfigError("command line", "--metrics-linger", str(exc)) from None
        host = (args.metrics_host or "").strip()
        if not host:
            raise ConfigError(
                "command line", "--metrics-host", "must be an address like 127.0.0.1 or 0.0.0.0"
            )
        metrics = Metrics(port, host, linger)
    elif args.metrics_linger is not None:
        raise ConfigError("command line", "--metrics-linger", "needs --metrics-port")
    procs = _procs(args, cfg, metrics)
    return RunPlan(cfg, source, thresholds, metrics, args.interval, procs)


def _procs(args: argparse.Namespace, cfg: RunConfig, metrics: Any) -> int:
    """`--procs`, checked against the run: a run that cannot be split is bad input."""
    from ratedeck.host.shards import ShardError, parse_procs, shard_configs

    try:
        procs = parse_procs(args.procs)
    except ValueError as exc:
        raise ConfigError("command line", "--procs", str(exc).removeprefix("--procs: ")) from None
    if procs > 1:
        try:
            procs = len(shard_configs(cfg, procs))
        except ShardError as exc:
            raise ConfigError("command line", "--procs", str(exc).removeprefix("--procs ")) from None
        if metrics is not None and args.no_ui:
            raise ConfigError("command line", "--procs", "above 1 does not serve --metrics-port headless yet")
    return procs


def check_store(cfg: RunConfig) -> None:
    """Open and close the run's store, so a bad one is one line (exit 2) before anything starts."""
    from ratedeck.store.work import open_for_run

    store = open_for_run(cfg)
    if store is not None:
        asyncio.run(store.close())


def _run_from_args(args: argparse.Namespace) -> int:
    try:
        plan = plan_run(args)
    except ConfigError as exc:
        return fail(str(exc))
    cfg = plan.cfg
    if args.save_config:
        return save_config(cfg, args.save_config)
    if plan.interval_s <= 0:
        return fail("--interval: must be above 0 seconds")
    if args.no_ui:
        from ratedeck.core.loops import loop_factory

        from .headless import run_headless

        out = sys.stderr if cfg.report == "-" else None  # stdout is the report's
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
    return run_console(cfg, thresholds=plan.thresholds, metrics=plan.metrics, procs=plan.procs)


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


def run_console(cfg: RunConfig, thresholds: list | tuple = (), metrics: Any = None, procs: int = 1) -> int:
    """The Textual console; the engine runs in its own process (see host/process_host.py).

    q, Ctrl-C, SIGTERM and SIGHUP all drain and leave the console (terminal
    restored); a second Ctrl-C stops at once. The summary, the report and
    the exit code are the headless run's (`headless.conclude`). With
    `metrics`, /metrics is served from this process, from the snapshots the
    console already receives: the engine's process does nothing more.
    """
    from ratedeck.console.app import RatedeckApp
    from ratedeck.host.process_host import ProcessHost

    from .headless import EXIT_INTERRUPTED, EXIT_USAGE, check_outputs, conclude

    problems = check_outputs(cfg)
    if problems:
        for problem in problems:
            fail(problem)
        return EXIT_USAGE
    if procs > 1:
        from ratedeck.host.shards import ShardedHost

        host: Any = ShardedHost(cfg, procs)
    else:
        host = ProcessHost(cfg)
    exporter = None
    if metrics is not None:
        from .prometheus import MetricsPortError, Scrape, serve_metrics

        try:
            exporter = serve_metrics(lambda: Scrape(host.snapshot()), metrics.port, metrics.host)
        except MetricsPortError as exc:
            return fail(str(exc))
    try:
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

        concluding = threading.Event()  # the ordinary quit got past the console

        def hangup() -> None:
            """SIGHUP: quit as for q; if that is stuck on a terminal that went away,
            drain, write the report and leave, printing nothing."""
            if concluding.wait(cfg.engine.drain_timeout_s + 5.0):
                return  # the ordinary path finishes the job
            code = EXIT_INTERRUPTED
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

        app = RatedeckApp(
            host, theme=cfg.theme, keymap=cfg.keymap or None, duration_s=cfg.duration_s, on_hangup=hangup
        )
        try:
            final = app.run()
        finally:
            concluding.set()
            with _signals_held():  # the drain and the report are not cut short by a late signal
                final_snap = host.stop_blocking()
        final = final or final_snap
        out = sys.stderr if cfg.report == "-" else sys.stdout
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
        if exporter is not None and metrics.linger_s > 0 and not host.aborted:
            _linger(exporter.url, metrics.linger_s, out)
        return code
    finally:
        if exporter is not None:
            exporter.close()


def _linger(url: str, seconds: float, out) -> None:
    """Keep the final metrics up for `seconds`, or until Ctrl-C, SIGTERM or SIGHUP."""
    import signal
    import threading

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
        return _bench(argv)
    if name == "replay":
        return _replay(argv)
    if name == "enqueue":
        return _enqueue(argv)
    if name == "config":
        return _config(argv)
    if name == "completion":
        return _completion(argv)
    if name == "presets":
        return _presets(argv)
    from .sweep import main as sweep_main

    return sweep_main(argv)


def _presets(argv: list[str]) -> int:
    """`ratedeck presets [NAME]`: one line per preset, or a preset's settings as TOML."""
    import tomli_w

    from ratedeck.config import PRESET_DESCRIPTIONS, PRESETS

    p = argparse.ArgumentParser(
        prog="ratedeck presets",
        description="The built-in presets for real APIs; with a NAME, what that preset sets, as TOML.",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help=f"one of {', '.join(PRESETS)}")
    parsed = _parse(p, argv)
    if isinstance(parsed, int):
        return parsed
    argv = [parsed.name] if parsed.name else []
    if not argv:
        width = max(len(name) for name in PRESETS)
        for name in PRESETS:
            print(f"{name:<{width}}  {PRESET_DESCRIPTIONS.get(name, '')}")
        print("\nUse one with --preset NAME; 'ratedeck presets NAME' prints what it sets.")
        return 0
    name = argv[0]
    if name not in PRESETS or len(argv) > 1:
        print(f"ratedeck: presets: unknown preset {name!r}; known: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    print(f"# {name}: {PRESET_DESCRIPTIONS.get(name, '')}")
    print(tomli_w.dumps(PRESETS[name]), end="")
    return 0


def _bench(argv: list[str]) -> int:
    from ratedeck.bench import main as bench_main

    from .headless import check_output_path

    report = _option_value(argv, "--report")
    problem = check_output_path(report, "report") if report else None
    if problem:
        print(f"ratedeck bench: error: {problem}", file=sys.stderr)
        return 2
    try:  # a duration with a unit ("30s", "2m") reaches the bench as seconds
        argv = _durations_as_seconds(argv, ("--duration",))
    except ValueError as exc:
        print(f"ratedeck bench: error: {exc}", file=sys.stderr)
        return 2
    return bench_main(argv)


def _durations_as_seconds(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` with each of `flags`' values ("30s", "2m", "500ms") written as plain seconds."""
    out = list(argv)
    for i, arg in enumerate(out):
        for flag in flags:
            if arg == flag and i + 1 < len(out):
                out[i + 1] = _seconds_text(flag, out[i + 1])
            elif arg.startswith(flag + "="):
                out[i] = f"{flag}={_seconds_text(flag, arg[len(flag) + 1 :])}"
    return out


def _seconds_text(flag: str, text: str) -> str:
    try:
        return repr(parse_duration(text))
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


# ---------------------------------------------------------------- replay


def _replay(argv: list[str]) -> int:
    from .replay import DEFAULT_ENDINGS, ReplayError, parse_endings, read_requests, workload_file

    p = build_parser("ratedeck replay")
    p.description = (
        "Send the requests of a graveyard file (--graveyard) or a results file (--results) again, "
        "with their original parameters, as the workload of a run. Every run flag applies."
    )
    p.add_argument("file", metavar="FILE", help="a graveyard or results JSONL file")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every request in the file, succeeded ones too")
    which.add_argument(
        "--only",
        metavar="ENDINGS",
        help="only these endings, comma-separated (succeeded, expired, graveyard, shed, queued, in_flight);"
        " default: all but succeeded",
    )
    parsed = _parse(p, argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    if args.workload:
        return fail("replay: --workload: the replayed FILE is the workload")
    try:  # the flags first: a typo costs nothing
        plan_run(args)
    except ConfigError as exc:
        return fail(str(exc))
    try:
        endings = None if args.all else parse_endings(args.only) if args.only else DEFAULT_ENDINGS
        got = read_requests(args.file, endings)
    except ReplayError as exc:
        return fail(f"replay: {exc}")
    for note in got.notes():
        print(f"ratedeck: replay: {note}", file=sys.stderr)
    if not got.items:
        print(f"ratedeck: replay: nothing to replay in {args.file}", file=sys.stderr)
        return 0
    print(f"ratedeck: replay: {len(got.items)} requests from {args.file}", file=sys.stderr)
    args.workload = workload_file(got.items)
    try:
        return _run_from_args(args)
    finally:
        try:
            os.unlink(args.workload)
        except OSError:
            pass


# ---------------------------------------------------------------- enqueue


def enqueue_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck enqueue",
        description="Check a JSONL workload (one object of parameters per line, as a workload file is read) and add"
        " every line to a store as a job, all or none. 'ratedeck --store URL' then works the store.",
    )
    p.add_argument("--store", metavar="URL", required=True, help="sqlite:PATH or redis://host:port/db")
    p.add_argument("--config", metavar="FILE", help="the run's config: the pools and budgets lines may name")
    p.add_argument("--preset", metavar="NAME", help="the run's preset (pools and budgets)")
    p.add_argument("file", metavar="FILE", help="JSONL workload file")
    return p


def _enqueue(argv: list[str]) -> int:
    from ratedeck.config import load_config
    from ratedeck.engine.workload import read_jsonl
    from ratedeck.store.work import open_for_run

    parsed = _parse(enqueue_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    try:
        cfg = load_config(args.config, args.preset, {"run": {"store": args.store}})
        items = list(read_jsonl(args.file, tuple(cfg.pools), tuple(b.name for b in cfg.budgets)))
        if cfg.store.strip() == "memory":
            raise ConfigError(
                "command line", "--store", "memory keeps nothing: use sqlite:PATH or redis://..."
            )
        store = open_for_run(cfg)
    except ConfigError as exc:
        return fail(str(exc))
    assert store is not None

    async def add() -> tuple[int, int]:
        try:
            added = await store.enqueue(items)
            return added, (await store.counts()).pending
        finally:
            await store.close()

    from ratedeck.store import StoreError

    try:
        added, pending = asyncio.run(add())
    except StoreError as exc:
        return fail(f"enqueue: nothing added: {exc}")
    print(f"ratedeck: enqueued {added} jobs from {args.file} into {store.url} ({pending} pending)")
    return 0


# ---------------------------------------------------------------- config


def _config(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: ratedeck config path [--themes] | ratedeck config show [run flags]\n\n"
            "  path   the user config file ($XDG_CONFIG_HOME/ratedeck/config.toml, read when no --config\n"
            "         is given; the console's 's' saves there); --themes: the user themes directory\n"
            "  show   the config in force for these flags, as TOML, keys masked"
        )
        return 0 if argv else 2
    what, rest = argv[0], argv[1:]
    if what == "path":
        from ratedeck.core.paths import user_themes_dir

        if rest not in ([], ["--themes"]):
            return fail(f"config path: unexpected {' '.join(rest)!r} (only --themes)")
        print(user_themes_dir() if rest else user_config_path())
        return 0
    if what == "show":
        parsed = _parse(build_parser("ratedeck config show"), rest)
        if isinstance(parsed, int):
            return parsed
        try:
            plan = plan_run(parsed)
        except ConfigError as exc:
            return fail(str(exc))
        sys.stdout.write(shown_config(plan.cfg, plan.source))
        return 0
    return fail(f"config: unknown command {what!r}; use 'config path' or 'config show'")


def shown_config(cfg: RunConfig, source: str | None) -> str:
    """The config in force as TOML, for reading: every key masked, where it came from on top."""
    import tomli_w

    from ratedeck.core.secrets import Redactor, mask_secret, safe_url

    data = to_toml_dict(cfg)
    if "store" in data.get("run", {}):  # a redis:// URL may carry a password
        data["run"]["store"] = safe_url(data["run"]["store"])
    literal = [s for s in cfg.key_sources if not s.strip().startswith(("env:", "@"))]
    if literal and "secrets" in data.get("keys", {}):
        data["keys"]["secrets"] = [
            s if s.strip().startswith(("env:", "@")) else mask_secret(s) for s in cfg.key_sources
        ]
    head = [
        f"# ratedeck {version()}: the config in force",
        f"# from: {'preset ' + cfg.preset + ' + ' if cfg.preset else ''}{source or 'no config file'} + flags",
        f"# user config file: {user_config_path()}",
        "# keys: " + (", ".join(f"{k.label} {mask_secret(k.secret)}" for k in cfg.keys) or "none"),
    ]
    text = "\n".join(head) + "\n" + tomli_w.dumps(data)
    return Redactor(k.secret for k in cfg.keys)(text)


# ---------------------------------------------------------------- completion


def _completion(argv: list[str]) -> int:
    if argv in (["bash"], ["zsh"]):
        sys.stdout.write(completion_script(argv[0]))
        return 0
    if argv and argv[0] in ("-h", "--help"):
        print(
            "usage: ratedeck completion bash|zsh\n\n"
            'bash: eval "$(ratedeck completion bash)" in ~/.bashrc; zsh: eval "$(ratedeck completion zsh)"'
        )
        return 0
    return fail("completion: say which shell: 'ratedeck completion bash' or 'ratedeck completion zsh'")


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags a parser's help names."""
    import re

    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", parser.format_help())))


def completion_script(shell: str) -> str:
    """A bash completion function for `ratedeck` (zsh loads it through bashcompinit)."""
    subflags: dict[str, list[str]] = {}
    try:
        from ratedeck.server.serve import add_serve_arguments

        serve = argparse.ArgumentParser(add_help=True)
        add_serve_arguments(serve)
        subflags["serve"] = _flags(serve)
    except Exception:
        pass
    try:
        from ratedeck.bench import build_parser as bench_parser

        subflags["bench"] = _flags(bench_parser())
    except Exception:
        pass
    from .sweep import build_parser as sweep_parser

    subflags["sweep"] = _flags(sweep_parser())
    run_flags = _flags(build_parser())
    subflags["replay"] = sorted(set(run_flags) | {"--all", "--only"})
    subflags["enqueue"] = _flags(enqueue_parser())
    cases = "\n".join(f'        {name}) words="{" ".join(flags)}" ;;' for name, flags in subflags.items())
    script = f"""# ratedeck {shell} completion: eval "$(ratedeck completion {shell})"
_ratedeck() {{
    local cur prev words
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    case "$prev" in
        --config|--report|--graveyard|--results|--workload|--save-config|--keys)
            COMPREPLY=( $(compgen -f -- "$cur") ); return ;;
        --method) COMPREPLY=( $(compgen -W "GET POST" -- "$cur") ); return ;;
        --headroom) COMPREPLY=( $(compgen -W "adaptive" -- "$cur") ); return ;;
        --preset) COMPREPLY=( $(compgen -W "seed" -- "$cur") ); return ;;
        --theme) COMPREPLY=( $(compgen -W "ratedeck-dark ratedeck-light ratedeck-high-contrast" -- "$cur") ); return ;;
    esac
    if [ "$COMP_CWORD" -eq 1 ] && [[ "$cur" != -* ]]; then
        COMPREPLY=( $(compgen -W "{" ".join(COMMANDS)}" -- "$cur") ); return
    fi
    words="{" ".join(run_flags)}"
    case "${{COMP_WORDS[1]}}" in
        config)
            if [ "$COMP_CWORD" -eq 2 ]; then COMPREPLY=( $(compgen -W "path show" -- "$cur") ); return; fi
            [ "${{COMP_WORDS[2]}}" = path ] && words="--themes" ;;
        completion) COMPREPLY=( $(compgen -W "bash zsh" -- "$cur") ); return ;;
        replay|enqueue)
            if [[ "$cur" != -* ]]; then COMPREPLY=( $(compgen -f -- "$cur") ); return; fi ;;
    esac
    case "${{COMP_WORDS[1]}}" in
{cases}
    esac
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
}}
complete -o default -F _ratedeck ratedeck
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


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
