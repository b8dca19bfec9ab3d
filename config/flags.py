"""The run command's setting flags, generated from the rows, and the flags read back as config overrides."""

from __future__ import annotations

import argparse
from typing import Any

from ratedeck.engine.settings import ConfigError

from .load import parse_setting
from .rows import NO_SWITCH, ROWS, Row


def flag_rows() -> list[Row]:
    """The rows that have a flag, in the rows' order."""
    return [row for row in ROWS if row.flag is not None]


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per row that has one."""
    groups: dict[str, Any] = {}
    for row in flag_rows():
        flag = row.flag
        assert flag is not None
        into: Any = parser
        if flag.group is not None:
            into = groups.get(flag.group) or groups.setdefault(
                flag.group, parser.add_mutually_exclusive_group()
            )
        kwargs: dict[str, Any] = {"help": flag.help or row.help}
        if flag.switch is not NO_SWITCH:
            kwargs["action"] = "store_true"
        else:
            if flag.choices is not None:
                kwargs["choices"] = flag.choices
            else:
                kwargs["metavar"] = flag.metavar
            if flag.repeat:
                kwargs["action"] = "append"
        into.add_argument(flag.name, **kwargs)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The setting flags given, as a config dict that `load_config` merges over the file.

    A flag that `check`s its value is parsed here as the config file parses it
    (core/numbers), so a bad one is a `ConfigError` naming the flag; others are
    checked with the file's values and name the setting.
    """
    out: dict[str, dict[str, Any]] = {}
    for row in flag_rows():
        flag = row.flag
        assert flag is not None
        value = getattr(args, flag.dest, None)
        if flag.switch is not NO_SWITCH:
            if not value:
                continue
            value = flag.switch
        elif value is None or (not value and not flag.keep_empty and not flag.check):
            continue
        else:
            try:
                if flag.convert is not None:
                    value = flag.convert(value)
                if flag.check:
                    value = parse_setting(row.path, value)
            except ValueError as exc:
                raise ConfigError("command line", flag.name, str(exc)) from None
        for path, v in ((row.path, value), *flag.also):
            section, _, key = path.partition(".")
            out.setdefault(section, {})[key] = v
    return out
