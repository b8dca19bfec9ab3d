"""`[[gateway.clients]]`: the gateway's clients, each with its own token, priority, weight and quotas.

```toml
[[gateway.clients]]
name = "chat"
token = "env:CHAT_TOKEN"
priority = "interactive"        # interactive > standard (the default) > batch
[[gateway.clients]]
name = "nightly"
token = "env:NIGHTLY_TOKEN"
priority = "batch"
weight = 1                      # its share among clients of its priority while they compete
tokens_per_minute = 100000      # quotas: requests_per_minute, tokens_per_minute, usd_per_day
quota = "refuse"                # over a quota: 429 + Retry-After ("wait", the default: it waits queued)
```

The tokens are kept as written (`env:VAR`, `@FILE` or the token itself) and resolved by the
gateway command (`runner/commands/gateway.py`); the engine sees each client as a flow
(`FlowSpec`, engine/flows.py), never its token.
"""

from __future__ import annotations

import math
from typing import Any

from ratedeck.core.numbers import show
from ratedeck.core.vocab import Priority
from ratedeck.engine.settings import ConfigError, FlowSpec

from . import parsers
from .settings import GatewayClient

#: What a `[[gateway.clients]]` table may hold.
FIELDS = (
    "name",
    "token",
    "priority",
    "weight",
    "requests_per_minute",
    "tokens_per_minute",
    "usd_per_day",
    "quota",
)
#: What a client over its quota meets.
QUOTA_MODES = ("wait", "refuse")
#: The most a weight may be: shares of 1 to a million are as fine as anyone sets them.
MAX_WEIGHT = 1_000_000


def parse_clients(raw: Any, source: str, *, counts_tokens: bool, priced: bool) -> tuple[GatewayClient, ...]:
    """The clients of `[[gateway.clients]]` checked; `ConfigError` naming the table and field.

    `counts_tokens`: the pool charges tokens at admission (a `tokens_per_minute` quota needs it);
    `priced`: the run has prices (a `usd_per_day` quota needs them)."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(
            source, "gateway.clients", "must be a list of tables, like [[gateway.clients]] name = ..."
        )
    clients: list[GatewayClient] = []
    names: dict[str, int] = {}
    tokens: dict[str, str] = {}
    for i, table in enumerate(raw):
        at = f"gateway.clients[{i}]"
        for field in table:
            if field not in FIELDS:
                raise ConfigError(source, f"{at}.{field}", f"unknown field; known: {', '.join(FIELDS)}")
        name = parsers.label_name(table.get("name"), source, f"{at}.name")
        if name in names:
            raise ConfigError(
                source, f"{at}.name", f"{name!r} is already the name of gateway.clients[{names[name]}]"
            )
        names[name] = i
        token = table.get("token")
        if not isinstance(token, str) or not token.strip():
            raise ConfigError(
                source, f"{at}.token", "must be the client's token: env:VAR, @FILE or the token itself"
            )
        token = token.strip()
        if token in tokens:
            raise ConfigError(
                source, f"{at}.token", f"is the same as client {tokens[token]!r}'s: each needs its own"
            )
        tokens[token] = name
        priority = table.get("priority", Priority.STANDARD.value)
        if priority not in tuple(p.value for p in Priority):
            raise ConfigError(
                source,
                f"{at}.priority",
                f"must be interactive, standard or batch, got {show(priority)}",
            )
        weight = _number(table, "weight", at, source, integer=False, default=1.0)
        if weight is None or weight > MAX_WEIGHT:
            raise ConfigError(
                source, f"{at}.weight", f"must be a number from above 0 to {MAX_WEIGHT:,}, got {show(weight)}"
            )
        rpm = _number(table, "requests_per_minute", at, source, integer=True)
        tpm = _number(table, "tokens_per_minute", at, source, integer=True)
        usd = _number(table, "usd_per_day", at, source, integer=False)
        if tpm is not None and not counts_tokens:
            raise ConfigError(
                source,
                f"{at}.tokens_per_minute",
                "this pool counts no tokens (no token budget: use an LLM preset, or requests_per_minute)",
            )
        if usd is not None and not priced:
            raise ConfigError(
                source,
                f"{at}.usd_per_day",
                'the run has no prices to charge it by (use a preset with prices, or add [prices."model"])',
            )
        quota = table.get("quota", "wait")
        if quota not in QUOTA_MODES:
            raise ConfigError(source, f"{at}.quota", f'must be "wait" or "refuse", got {show(quota)}')
        if quota == "refuse" and rpm is None and tpm is None and usd is None:
            raise ConfigError(
                source,
                f"{at}.quota",
                '"refuse" needs a quota to refuse past (requests_per_minute, tokens_per_minute or usd_per_day)',
            )
        flow = FlowSpec(
            name=name,
            priority=Priority(priority),
            weight=float(weight),
            requests_per_minute=int(rpm) if rpm is not None else None,
            tokens_per_minute=int(tpm) if tpm is not None else None,
            usd_per_day=float(usd) if usd is not None else None,
            refuse=quota == "refuse",
        )
        clients.append(GatewayClient(name=name, token=token, flow=flow))
    return tuple(clients)


def _number(
    table: dict[str, Any], field: str, at: str, source: str, *, integer: bool, default: float | None = None
) -> float | None:
    """A positive number (an integer where `integer`), or `default` when the field is absent."""
    if field not in table:
        return default
    value = table[field]
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "a whole number" if integer else "a number"
        raise ConfigError(source, f"{at}.{field}", f"must be {kind} above 0, got {show(value)}")
    return float(value)
