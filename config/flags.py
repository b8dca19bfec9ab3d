"""The commands' setting flags, generated from the rows (each command only those it takes), and
the flags read back as config overrides."""

from __future__ import annotations

import argparse
from enum import Enum
from typing import Any

from ratedeck.engine.settings import ConfigError

from .load import DEMO_PRESET, PRESETS, parse_setting
from .rows import NO_DEFAULT, NO_SWITCH, ROWS, RUN, Row


def flag_rows(command: str | None = None) -> list[Row]:
    """The rows that have a flag (that `command` takes, when given), in the rows' order."""
    return [row for row in ROWS if row.flag is not None and (command is None or command in row.flag.commands)]


def shown_value(row: Row, value: Any) -> str | None:
    """A setting's value as its flag would take it ("10s", "GET", "adaptive"); None: nothing to
    show (unset, empty, a list, a table or a yes/no)."""
    if value is NO_DEFAULT or value is None or isinstance(value, bool | list | tuple | dict):
        return None
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str):
        return value or None
    if row.kind == "duration":
        return f"{value:g}s"
    if row.kind in ("milliseconds", "headroom"):
        return f"{value:g} ms"
    return f"{value:g}" if isinstance(value, float) else str(value)


def preset_value(row: Row, preset: str) -> Any:
    """What `preset` sets the row's setting to, as its file writes it; NO_DEFAULT where it sets none."""
    table = PRESETS.get(preset, {})
    if row.section:
        table = table.get(row.section, {})
    return table.get(row.key, NO_DEFAULT)


def demo_value(row: Row) -> str | None:
    """The demo preset's value of the row's setting, shown, where it sets one; else None."""
    demo = preset_value(row, DEMO_PRESET)
    if demo is NO_DEFAULT:
        return None
    try:
        return shown_value(row, row.read(demo) if row.parse is not None else demo)
    except ValueError:
        return None


def flag_help(row: Row) -> str:
    """A flag's --help line: what it does, then its default and the demo preset's value where it
    differs ("default 10s; 1s with --preset study"), from the row and the preset files. A help that
    says what unset means ("(default: capacity)") keeps that instead of the default; a flag that
    only switches something on shows neither."""
    flag = row.flag
    assert flag is not None
    text = flag.help or row.help
    if flag.switch is not NO_SWITCH:
        return text
    default, demo = shown_value(row, row.default), demo_value(row)
    notes = [] if "(default" in text or default is None else [f"default {default}"]
    if demo is not None and demo != default:
        notes.append(f"{demo} with --preset {DEMO_PRESET}")
    if not notes:
        return text
    if text.endswith(")") and "(default" in text:  # one parenthesis: "(default: capacity; 90 with ...)"
        return f"{text[:-1]}; {'; '.join(notes)})"
    return f"{text} ({'; '.join(notes)})"


def add_setting_flags(parser: argparse.ArgumentParser, command: str = RUN) -> None:
    """One flag per row whose flag `command` takes (rows.RUN, rows.GATEWAY): its --help lists
    those and no other."""
    groups: dict[str, Any] = {}
    for row in flag_rows(command):
        flag = row.flag
        assert flag is not None
        into: Any = parser
        if flag.group is not None:
            into = groups.get(flag.group) or groups.setdefault(
                flag.group, parser.add_mutually_exclusive_group()
            )
        kwargs: dict[str, Any] = {"help": flag_help(row)}
        if flag.switch is not NO_SWITCH:
            kwargs["action"] = "store_true"
        else:
            if flag.choices is not None:
                kwargs["choices"] = flag.choices
            else:
                kwargs["metavar"] = flag.metavar
            if flag.repeat:
                kwargs["action"] = "append"
            if flag.bare is not None:
                kwargs.update(nargs="?", const=flag.bare)
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
