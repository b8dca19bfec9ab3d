"""The `ratedeck` command: a run (the console, or headless with --no-ui), or one of the
subcommands of runner/commands/, each imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from typing import Any

from ratedeck.config.flags import add_setting_flags
from ratedeck.config.flags import overrides_from_args as setting_overrides
from ratedeck.config.rows import RUN as RUN_FLAGS
from ratedeck.core.exits import ExitCode
from ratedeck.core.version import version

from . import quiet_startup_interrupt
from .commands import RUN, SUBCOMMANDS, command_module
from .commands import epilog as _epilog
from .commands.common import parse_args


def build_parser(prog: str = "ratedeck", command: str = RUN_FLAGS) -> argparse.ArgumentParser:
    """The run's parser; `command` (config.rows: RUN or GATEWAY) says whose setting flags it takes."""
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
    p.add_argument(
        "--preset", metavar="NAME", help="built-in settings to start from ('ratedeck presets' lists them)"
    )
    add_setting_flags(p, command)  # one flag per setting that has one (ratedeck.config.rows)
    p.add_argument("--no-ui", action="store_true", help="headless: periodic metrics on stdout, no console")
    if command == RUN_FLAGS:  # a run's config; the gateway's is the same flags given to `ratedeck`
        p.add_argument("--save-config", metavar="FILE", help="write the effective config as TOML and exit")
    return p


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as a config dict that `load_config` merges over the file (ratedeck.config.flags)."""
    return setting_overrides(args)


def main(argv: list[str] | None = None) -> int:
    """The `ratedeck` command; the exit codes are `commands.EXIT_CODES`."""
    try:
        _end_startup_guard()
        return _main(sys.argv[1:] if argv is None else argv)
    except (KeyboardInterrupt, RuntimeError) as exc:  # Ctrl-C outside a run's handling (starting)
        # A Ctrl-C while a module defines a dataclass reaches us as the RuntimeError Python
        # wraps an exception from `__set_name__` in: the same Ctrl-C.
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        try:
            print("ratedeck: interrupted", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        return ExitCode.INTERRUPTED


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
