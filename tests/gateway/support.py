"""What the gateway's tests share: a config for a preset against a stub, a gateway on a free
loopback port, and a bound on every test's time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator
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
