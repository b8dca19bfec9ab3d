"""`ratedeck replay FILE [run flags]`: the requests of a graveyard or results file, sent again
(runner/replay.py reads the file)."""

from __future__ import annotations

import argparse
import os
import sys

from ratedeck.config import ConfigError
from ratedeck.core.exits import ExitCode

from ..cli import build_parser as run_parser
from ..replay import DEFAULT_ENDINGS, ReplayError, parse_endings, read_requests, workload_file
from .common import fail, parse_args
from .run import plan_run, run_from_args


def build_parser() -> argparse.ArgumentParser:
    p = run_parser("ratedeck replay")
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
        help="only these endings, comma-separated (succeeded, uncertain, expired, graveyard, shed, queued,"
        " in_flight); default: all but succeeded and uncertain",
    )
    return p


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
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
        return ExitCode.OK
    print(f"ratedeck: replay: {len(got.items)} requests from {args.file}", file=sys.stderr)
    args.workload = workload_file(got.items)
    try:
        return run_from_args(args)
    finally:
        try:
            os.unlink(args.workload)
        except OSError:
            pass
