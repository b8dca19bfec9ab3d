"""The installed version, for `--version` and the User-Agent."""

from __future__ import annotations

import importlib.metadata


def version() -> str:
    """ratedeck's version as installed ("dev" when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version("ratedeck")
    except importlib.metadata.PackageNotFoundError:
        return "dev"
