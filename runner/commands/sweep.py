"""`ratedeck sweep`: goodput against arrival rate for messages of several calls (runner/sweep.py)."""

from __future__ import annotations

import argparse

from .. import sweep


def build_parser() -> argparse.ArgumentParser:
    return sweep.build_parser()


def main(argv: list[str]) -> int:
    return sweep.main(argv)
