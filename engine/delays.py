"""Reading "slow down" from a response: how long to wait, and what the server's policy is.

Sources, first found wins for the delay: Retry-After (seconds or an HTTP
date), the IETF RateLimit field (`"name";r=0;t=5`: no quota left, resets in
5 s), X-RateLimit-Reset (seconds, or an epoch time when it is that large)
when X-RateLimit-Remaining is 0, and a user hook for APIs that put the delay
in the body. RateLimit-Policy (`"a";q=20;w=1, "b";q=600;w=60`) is read as the
server's own statement of its policies.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ratedeck.core.policy import Policy

# A hook gets (status, headers, body text) and returns seconds to wait, or None.
DelayHook = Callable[[int, Mapping[str, str], str], "float | None"]

_EPOCH_THRESHOLD = 1e9  # X-RateLimit-Reset above this is a Unix time, not a delta


def parse_retry_after(value: str | None, now_wall: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        now_wall = time.time() if now_wall is None else now_wall
        return max(0.0, when.timestamp() - now_wall)
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        return None
    return seconds


_PARAM = re.compile(r";\s*([a-z]+)\s*=\s*([0-9.]+)")


def _items(header: str) -> list[dict[str, float]]:
    """Split a structured-field list into items with their numeric parameters."""
    out = []
    for item in header.split(","):
        params = {k: float(v) for k, v in _PARAM.findall(item)}
        if params:
            out.append(params)
    return out


def ratelimit_delay(header: str | None) -> float | None:
    """From `RateLimit: "p";r=0;t=5`: seconds until quota returns when none is left."""
    if not header:
        return None
    waits = [item["t"] for item in _items(header) if item.get("r", 1) <= 0 and "t" in item]
    return max(waits) if waits else None


@lru_cache(maxsize=64)
def advertised_policies(header: str | None) -> tuple[Policy, ...]:
    """From `RateLimit-Policy: "a";q=20;w=1`: the policies the server says it enforces."""
    if not header:
        return ()
    policies = []
    for item in _items(header):
        q, w = item.get("q"), item.get("w")
        if q and w and q >= 1 and w > 0:
            policies.append(Policy(int(q), float(w)))
    return tuple(policies)


def x_ratelimit_delay(
    remaining: str | None, reset: str | None, now_wall: float | None = None
) -> float | None:
    """X-RateLimit-Reset when X-RateLimit-Remaining is 0: a delta, or an epoch time."""
    if reset is None or remaining is None:
        return None
    try:
        if float(remaining) > 0:
            return None
        value = float(reset)
    except ValueError:
        return None
    if value > _EPOCH_THRESHOLD:
        now_wall = time.time() if now_wall is None else now_wall
        value = value - now_wall
    return max(0.0, value)


def response_delay(
    status: int, headers: Mapping[str, str], body: str, hook: DelayHook | None = None
) -> float | None:
    """How long the server asks us to wait, from whichever source it used."""
    for value in (
        parse_retry_after(headers.get("Retry-After")),
        ratelimit_delay(headers.get("RateLimit")) if status in (429, 503) else None,
        x_ratelimit_delay(headers.get("X-RateLimit-Remaining"), headers.get("X-RateLimit-Reset"))
        if status in (429, 503)
        else None,
    ):
        if value is not None:
            return value
    if hook is not None and status >= 400:
        return hook(status, headers, body)
    return None


def json_field_hook(path: str) -> DelayHook:
    """A hook reading seconds from a JSON body field, e.g. "error.details.retryDelay".

    Values may be numbers or strings like "15s" / "1.5s" (Google APIs' style).
    """
    parts = [p for p in path.split(".") if p]

    def hook(status: int, headers: Mapping[str, str], body: str) -> float | None:
        try:
            node: Any = json.loads(body)
        except (ValueError, TypeError):
            return None
        for part in parts:
            if isinstance(node, list):
                node = node[0] if node else None
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return max(0.0, float(node))
        if isinstance(node, str):
            match = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)?\s*", node)
            if match:
                value = float(match.group(1))
                return value / 1000.0 if match.group(2) == "ms" else value
        return None

    return hook
