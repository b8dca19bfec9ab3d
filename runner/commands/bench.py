"""`ratedeck bench`: ratedeck against peer limiters, on the simulator (bench/ does the work)."""

from __future__ import annotations

import argparse
import sys

from ratedeck.bench import build_parser as bench_parser
from ratedeck.bench import main as bench_main
from ratedeck.config import ConfigError
from ratedeck.core.exits import ExitCode

from ..headless import check_output_path
from .common import durations_as_seconds, option_value


def build_parser() -> argparse.ArgumentParser:
    return bench_parser()


def main(argv: list[str]) -> int:
    report = option_value(argv, "--report")
    problem = check_output_path(report, "report") if report else None
    if problem:
        print(f"ratedeck bench: error: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    try:  # a duration with a unit ("30s", "2m") reaches the bench as seconds
        argv = durations_as_seconds(argv, ("--duration",))
    except ConfigError as exc:
        print(f"ratedeck bench: error: {exc.key}: {exc.problem}", file=sys.stderr)
        return ExitCode.USAGE
    return bench_main(argv)
