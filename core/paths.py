"""Where ratedeck looks for the user's own files, and where a run leaves its own.

Following the XDG base directory convention: `$XDG_CONFIG_HOME/ratedeck/`
(by default `~/.config/ratedeck/`) holds `config.toml`, read when no
`--config` is given, and `themes/`, the user's own theme files.
`$XDG_STATE_HOME/ratedeck/` (by default `~/.local/state/ratedeck/`) holds
what runs leave behind when no place was named: a graveyard file per run,
unless the run writes a report (then it goes next to the report). A gateway leaves
nothing there: its clients' requests are theirs (docs/files.md). The directories made
here are 0700, the files 0600 (core/files.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .files import private_dir

APP_DIR = "ratedeck"
CONFIG_NAME = "config.toml"
THEMES_DIR = "themes"


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/ratedeck`, or `~/.config/ratedeck` when the variable is unset or not absolute."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / APP_DIR


def state_dir() -> Path:
    """`$XDG_STATE_HOME/ratedeck`, or `~/.local/state/ratedeck` when the variable is unset or not absolute."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / APP_DIR


def run_graveyard_path(report: str | os.PathLike[str] | None = None, now: float | None = None) -> Path:
    """Where a run's graveyard goes when none was named: next to its report file
    (`out.json` -> `out-graveyard.jsonl`), else a file of its own in `state_dir()`
    (`graveyard-20260124-061500-4242.jsonl`: the start time and the process id), never
    the working directory. The state directory is created (0700) when it is used."""
    if report is not None and str(report) not in ("", "-"):
        p = Path(report)
        return p.with_name(f"{p.stem}-graveyard.jsonl")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    where = state_dir()
    try:
        private_dir(where)
    except OSError:
        pass  # the run's output check names the place that cannot be written
    return where / f"graveyard-{stamp}-{os.getpid()}.jsonl"


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
