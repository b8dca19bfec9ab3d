"""`ratedeck presets [NAME]`: one line per preset, or a preset's settings as TOML."""

from __future__ import annotations

import argparse
import sys

import tomli_w

from ratedeck.config import PRESET_DESCRIPTIONS, PRESETS
from ratedeck.core.exits import ExitCode

from .common import parse_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck presets",
        description="The built-in presets for real APIs; with a NAME, what that preset sets, as TOML.",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help=f"one of {', '.join(PRESETS)}")
    return p


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    if not parsed.name:
        width = max(len(name) for name in PRESETS)
        for name in PRESETS:
            print(f"{name:<{width}}  {PRESET_DESCRIPTIONS.get(name, '')}")
        print("\nUse one with --preset NAME; 'ratedeck presets NAME' prints what it sets.")
        return ExitCode.OK
    name = parsed.name
    if name not in PRESETS:
        print(f"ratedeck: presets: unknown preset {name!r}; known: {', '.join(PRESETS)}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"# {name}: {PRESET_DESCRIPTIONS.get(name, '')}")
    print(tomli_w.dumps(PRESETS[name]), end="")
    return ExitCode.OK
