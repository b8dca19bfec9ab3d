"""What every subcommand shares: one line for a mistake, exit 2, never a usage dump or a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from ratedeck.config import ConfigError
from ratedeck.core.exits import ExitCode
from ratedeck.core.numbers import parse_duration

T = TypeVar("T")


def fail(message: str) -> int:
    """Print "ratedeck: MESSAGE" on stderr; the exit code for bad input."""
    print(f"ratedeck: {message}", file=sys.stderr)
    return ExitCode.USAGE


def flag_value(flag: str, text: object, parse: Callable[[object], T]) -> T:
    """`parse(text)`, or a `ConfigError` naming the flag ("command line: --flag: why"): one line, exit 2."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigError("command line", flag, str(exc)) from None


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """Parse `argv`; a usage error is one line ("ratedeck: error: ... (see ratedeck --help)"), exit 2."""
    prog = parser.prog

    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message} (see {prog} --help)", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)

    parser.error = error  # type: ignore[method-assign]
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE


def option_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` ("--flag X" or "--flag=X"), the last one given."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def durations_as_seconds(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` with each of `flags`' values ("30s", "2m", "500ms") written as plain seconds,
    for a parser that takes seconds only; a bad one is a `ConfigError` naming its flag."""
    out = list(argv)
    for i, arg in enumerate(out):
        for flag in flags:
            if arg == flag and i + 1 < len(out):
                out[i + 1] = repr(flag_value(flag, out[i + 1], parse_duration))
            elif arg.startswith(flag + "="):
                out[i] = f"{flag}={flag_value(flag, arg[len(flag) + 1 :], parse_duration)!r}"
    return out
