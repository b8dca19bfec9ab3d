"""What the gateway's tests share: a config for a preset against a stub, a gateway on a free
loopback port, and a bound on every test's time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ratedeck.config import load_config
from ratedeck.config.settings import GatewaySettings, RunConfig
from ratedeck.gateway.service import GatewayService

TOKEN = "gw-token-0123456789"


def run_async(test):
    """Run an async test on a fresh loop, bounded (a hung gateway fails the test, not the suite)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 60))

    return run


def gateway_config(preset: str, target: str, keys: list[str], **overrides: Any) -> RunConfig:
    """The preset's config against `target` with `keys` (literal secrets), plus `overrides` sections."""
    data: dict[str, Any] = {"target": {"url": target}, "keys": {"secrets": keys}}
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return load_config(None, preset, data)


@contextlib.asynccontextmanager
async def running_gateway(cfg: RunConfig, **settings: Any) -> AsyncIterator[GatewayService]:
    """A gateway on a free loopback port (token `TOKEN` unless given), stopped (drained) at the end."""
    values = {"listen": "127.0.0.1:0", "token": TOKEN, **settings}
    service = GatewayService(cfg, dataclasses.replace(GatewaySettings(), **values))
    await service.start()
    try:
        yield service
    finally:
        await service.stop(drain_timeout_s=2.0)


#: The real command, in a child process.
GATEWAY_COMMAND = [sys.executable, "-m", "ratedeck.runner.cli", "gateway"]


async def gateway_command(
    target: str, *flags: str, cwd: Path, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, str, str]:
    """`ratedeck gateway --preset openai --target TARGET` with the keys in $GW_KEYS and the
    token in $GW_TOKEN on a free loopback port, `--no-ui`, and `flags`; (the process, its URL,
    its first line, which names the URL)."""
    proc = await asyncio.create_subprocess_exec(
        *GATEWAY_COMMAND,
        *("--preset", "openai", "--target", target, "--keys", "env:GW_KEYS"),
        *("--gateway-token", "env:GW_TOKEN", "--listen", "127.0.0.1:0", "--no-ui", *flags),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    assert proc.stdout is not None
    first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    found = re.search(r"gateway at (http://127\.0\.0\.1:\d+)", first)
    assert found, first
    return proc, found.group(1), first
