"""`ratedeck serve`: the simulator, a rate-limited API to play against."""

from __future__ import annotations

import argparse

from ratedeck.server.serve import add_serve_arguments, run_serve

from .common import parse_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck serve",
        description="Run the simulated rate-limited API.",
        epilog="POST /reset (clear all state) is off unless started with --allow-reset; then it needs "
        "the header X-Reset-Token with the token printed at start.",
    )
    add_serve_arguments(p)
    return p


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
    return parsed if isinstance(parsed, int) else run_serve(parsed)
