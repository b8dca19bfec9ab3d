"""The real CLI in a subprocess from async tests: `ratedeck` as `python -m ratedeck.runner.cli`."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


async def spawn_ratedeck(*args: str, cwd: Path) -> asyncio.subprocess.Process:
    """Start `ratedeck ARGS` in `cwd` with pipes for stdout and stderr, its config and state
    directories under `cwd` (nothing read from or written to the user's)."""
    return await asyncio.create_subprocess_exec(
        *RATEDECK,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(os.environ, XDG_CONFIG_HOME=str(cwd / "xdg"), XDG_STATE_HOME=str(cwd / "state")),
    )
