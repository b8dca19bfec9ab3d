"""Load the console's themes from TOML data files.

Themes are data, not code: each `*.toml` file in the `ratedeck.themes`
package (or a folder given by the caller) describes one Textual `Theme`.
A broken file never stops the console; it is skipped and reported.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

from ratedeck.core.numbers import fraction

DEFAULT_THEME = "ratedeck-dark"

COLOUR_FIELDS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "success",
    "warning",
    "error",
)
_KNOWN_FIELDS = {"name", "dark", "variables", "luminosity_spread", "text_alpha", *COLOUR_FIELDS}


class ThemeFileError(ValueError):
    """A theme file that cannot become a `Theme`; the message names file and field."""


def theme_from_toml(text: str, source: str) -> Theme:
    """Build a `Theme` from the text of one theme file.

    Raises `ThemeFileError` naming `source` and the offending field. Unknown
    fields are errors too: a misspelt "primry" silently ignored would leave
    the operator wondering why the colour never changed.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ThemeFileError(f"{source}: not valid TOML ({error})") from None
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError(f"{source}: field 'name' is missing or not a string")
    unknown = sorted(set(data) - _KNOWN_FIELDS)
    if unknown:
        raise ThemeFileError(f"{source}: unknown field(s) {', '.join(unknown)}")
    if "primary" not in data:
        raise ThemeFileError(f"{source}: field 'primary' is missing")
    colours: dict[str, str] = {}
    for field in COLOUR_FIELDS:
        if field not in data:
            continue
        value = data[field]
        try:
            if not isinstance(value, str):
                raise ColorParseError("not a string")
            Color.parse(value)
        except ColorParseError:
            raise ThemeFileError(f"{source}: field '{field}' is not a colour: {value!r}") from None
        colours[field] = value
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(f"{source}: field 'dark' must be true or false")
    variables = data.get("variables", {})
    if not isinstance(variables, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in variables.items()
    ):
        raise ThemeFileError(f"{source}: field 'variables' must be a table of strings")
    extra: dict[str, float] = {}
    for field in ("luminosity_spread", "text_alpha"):
        if field in data:
            try:  # finite, 0..1: a NaN here would reach every colour the console mixes
                extra[field] = fraction(data[field], allow_zero=True)
            except ValueError as error:
                raise ThemeFileError(f"{source}: field '{field}' {error}") from None
    return Theme(name=name.strip(), dark=dark, variables=dict(variables), **colours, **extra)  # type: ignore[arg-type]  # each field's type is checked above


def _as_root(folder: str | Path | Traversable) -> Traversable | Path:
    return Path(folder) if isinstance(folder, str) else folder


def _theme_files(folder: str | Path | Traversable | None) -> list[Traversable | Path]:
    root = files("ratedeck.themes") if folder is None else _as_root(folder)
    try:
        entries = [entry for entry in root.iterdir() if entry.name.endswith(".toml")]
    except OSError:
        return []
    return sorted(entries, key=lambda entry: entry.name)


def load_themes(folder: str | Path | Traversable | None = None) -> tuple[list[Theme], list[str]]:
    """Read every `*.toml` theme in `folder` (default: the shipped themes).

    Returns the themes that loaded, in file-name order, and one problem
    message per file that did not ("bad.toml: field 'primary' is not a
    colour: 'blurple'"). Duplicate names keep the first file.
    """
    themes: list[Theme] = []
    problems: list[str] = []
    if folder is not None and not _as_root(folder).is_dir():
        return themes, [f"{folder}: theme folder not found"]
    seen: set[str] = set()
    for entry in _theme_files(folder):
        try:
            text = entry.read_text(encoding="utf-8")
            theme = theme_from_toml(text, entry.name)
        except ThemeFileError as error:
            problems.append(str(error))
            continue
        except (OSError, UnicodeDecodeError) as error:
            problems.append(f"{entry.name}: cannot be read ({error})")
            continue
        if theme.name in seen:
            problems.append(f"{entry.name}: theme name {theme.name!r} is already used by another file")
            continue
        seen.add(theme.name)
        themes.append(theme)
    return themes, problems
