"""What every loopback stub shares: the `Stub` handle, the ledger each stub keeps, clocks.

A stub is an aiohttp app on 127.0.0.1 (port 0) that plays one public API's documented
limits. It keeps its OWN accounting, independent of any client: every request that
reached it is one `Record` in its `Ledger` (arrival time on the stub's clock, the key
or IP it was charged to, the limiter bucket, the units it cost, and the outcome).
Tests and benchmarks read that ledger as the truth.

Outcomes (the `outcome` field) are a small shared vocabulary:

- ``ok``: served; its ``cost`` is the units of the limit it used.
- ``replayed``: Stripe answered a saved idempotent result (nothing new was written).
- everything else is a refusal: ``rate_limited`` (GitHub primary 403/429, Stripe 429,
  Binance 429, Kraken ``EAPI:Rate limit exceeded``), ``secondary_limited`` (GitHub),
  ``banned`` (Binance 418), ``order_limited`` (Binance -1015, Kraken
  ``EOrder:Rate limit exceeded``), ``invalid_nonce``, ``bad_signature``,
  ``bad_timestamp``, ``unauthorized``, ``invalid_request``, ``idempotency_error``,
  ``idempotency_in_use``, ``server_error``, ``not_found``, ``no_user_agent``.

``during_backoff`` marks a request that arrived while the server had already told
that key or IP to wait (a Retry-After or reset not yet reached, or, where the API
gives no time, a refusal streak not yet broken by an accepted request).

"Share of what the server allowed" is ``stub.share(start, end, key=..., bucket=...)``:
the units the stub served ``ok`` in ``[start, end)`` over
``stub.allowed_capacity(start, end, ...)``, the most an ideal client could have been
served in the same interval given the stub's state at ``start``. Each API's state
class defines its own capacity (fixed windows, sliding windows, decaying counters).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

Clock = Callable[[], float]

OK = "ok"
REPLAYED = "replayed"
NOT_REFUSALS = frozenset({OK, REPLAYED})


class FakeClock:
    """A clock a test moves by hand: ``clock()`` reads it, ``advance(s)`` moves it on."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def set(self, when: float) -> float:
        self.now = float(when)
        return self.now


@dataclass(frozen=True)
class Record:
    """One request as the stub saw it."""

    at: float  # arrival, on the stub's clock
    key: str  # token / API key / "ip:ADDR": what the limit was charged to
    method: str
    path: str
    status: int
    outcome: str
    bucket: str = ""  # the limiter: "core", "search", "weight", "rest", "POST /v1/charges", ...
    cost: float = 0.0  # units of the limit this request used (refused ones usually 0)
    during_backoff: bool = False
    detail: str = ""


@dataclass
class Ledger:
    """Every request a stub received, in arrival order."""

    records: list[Record] = field(default_factory=list)

    def add(self, **fields: Any) -> Record:
        rec = Record(**fields)
        self.records.append(rec)
        return rec

    def select(
        self,
        *,
        key: str | None = None,
        bucket: str | None = None,
        start: float | None = None,
        end: float | None = None,
        outcome: str | None = None,
    ) -> list[Record]:
        out = []
        for r in self.records:
            if key is not None and r.key != key:
                continue
            if bucket is not None and r.bucket != bucket:
                continue
            if start is not None and r.at < start:
                continue
            if end is not None and r.at >= end:
                continue
            if outcome is not None and r.outcome != outcome:
                continue
            out.append(r)
        return out

    def accepted(self, **filters: Any) -> list[Record]:
        return self.select(outcome=OK, **filters)

    def refused(self, kind: str | None = None, **filters: Any) -> list[Record]:
        rows = self.select(**filters)
        if kind is not None:
            return [r for r in rows if r.outcome == kind]
        return [r for r in rows if r.outcome not in NOT_REFUSALS]

    def counts(self, **filters: Any) -> Counter[str]:
        return Counter(r.outcome for r in self.select(**filters))

    def arrivals(self, **filters: Any) -> list[float]:
        return [r.at for r in self.select(**filters)]

    def units(self, **filters: Any) -> float:
        """Units of the limit used by requests served ``ok``."""
        return sum(r.cost for r in self.accepted(**filters))

    def charged(self, **filters: Any) -> float:
        """Units of the limit used by every request, served or not."""
        return sum(r.cost for r in self.select(**filters))

    def backoff_ignored(self, **filters: Any) -> int:
        """Requests that arrived while the server had told their key to wait."""
        return sum(1 for r in self.select(**filters) if r.during_backoff)


class CapacityState(Protocol):
    """A stub's API-specific state as `Stub.allowed_capacity` reads it: what its limits allowed."""

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = ..., bucket: str | None = ...
    ) -> float: ...


@dataclass
class Stub:
    """A running stub: ``url`` to call, ``ledger`` to read, ``state`` for API-specific data."""

    url: str
    ledger: Ledger
    clock: Clock
    state: Any
    runner: web.AppRunner

    def now(self) -> float:
        return self.clock()

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = None, bucket: str | None = None
    ) -> float:
        return self.state.allowed_capacity(start, end, key=key, bucket=bucket)

    def share(self, start: float, end: float, *, key: str | None = None, bucket: str | None = None) -> float:
        """Units served ok in [start, end) over what the limits allowed in that interval."""
        cap = self.allowed_capacity(start, end, key=key, bucket=bucket)
        got = self.ledger.units(key=key, bucket=bucket, start=start, end=end)
        return got / cap if cap > 0 else math.inf if got else 0.0

    async def close(self) -> None:
        await self.runner.cleanup()

    async def __aenter__(self) -> Stub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def serve(app: web.Application, *, ledger: Ledger, clock: Clock, state: Any) -> Stub:
    """Start ``app`` on 127.0.0.1, an OS-chosen port; only loopback, ever."""
    runner = web.AppRunner(
        app, access_log=None
    )  # handlers finish even if a client hangs up: the ledger stays whole
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)  # a burst of new connections is not dropped
    await site.start()
    host, port = runner.addresses[0][:2]
    return Stub(url=f"http://{host}:{port}", ledger=ledger, clock=clock, state=state, runner=runner)


async def work(latency: float, hold: asyncio.Event | None) -> None:
    """The stub's processing time: wait for a test's gate, then a fixed (real) delay."""
    if hold is not None:
        await hold.wait()
    if latency > 0:
        await asyncio.sleep(latency)


def wall_clock() -> float:
    return time.time()


def mono_clock() -> float:
    return time.monotonic()


def sliding_capacity(limit: int, window: float, occupied: list[float], start: float, end: float) -> int:
    """Most requests an ideal client gets in [start, end) from a sliding window of ``limit`` per ``window``.

    The window admits a request at t when fewer than ``limit`` accepted requests lie in
    (t - window, t]. ``occupied`` are the accepted arrivals in (start - window, start].
    Each of the ``limit`` slots frees at start (if empty) or at its last use + window,
    then serves once per ``window``.
    """
    if end <= start:
        return 0
    busy = sorted(t + window for t in occupied if start - window < t <= start)[-limit:] if limit else []
    frees = [start] * (limit - len(busy)) + busy
    # a slot free at f serves at f, f + window, ... while before end
    return sum(math.ceil((end - free) / window - 1e-9) for free in frees if free < end)


def interval_name(seconds: float) -> tuple[int, str, str]:
    """Binance's (intervalNum, intervalLetter, interval enum) for a window of ``seconds``."""
    s = int(round(seconds))
    for unit, letter, name in ((86400, "D", "DAY"), (3600, "H", "HOUR"), (60, "M", "MINUTE")):
        if s % unit == 0:
            return s // unit, letter, name
    return s, "S", "SECOND"
