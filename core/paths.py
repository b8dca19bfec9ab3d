"""Where ratedeck looks for the user's own files: the config, saved profiles, themes.

Following the XDG base directory convention: `$XDG_CONFIG_HOME/ratedeck/`
(by default `~/.config/ratedeck/`) holds `config.toml`, read when no
`--config` is given, and `themes/`, the user's own theme files.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_DIR = "ratedeck"
CONFIG_NAME = "config.toml"
THEMES_DIR = "themes"


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/ratedeck`, or `~/.config/ratedeck` when the variable is unset or not absolute."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / APP_DIR


def user_config_path() -> Path:
    """The user's config file (it may not exist): read when no --config is given."""
    return config_dir() / CONFIG_NAME


def user_themes_dir() -> Path:
    """The directory of the user's own theme files (it may not exist)."""
    return config_dir() / THEMES_DIR


def profile_save_path(config_given: str | os.PathLike[str] | None = None) -> Path:
    """Where the console's `s` saves the current settings: the config file the run was
    given (`--config`), else the user's config file."""
    return Path(config_given) if config_given else user_config_path()
