"""Where a request's path begins: the source's side of the engine (`ports.SourceSink`)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratedeck.core.numbers import MAX_RATE
from ratedeck.engine.request import Request

if TYPE_CHECKING:
    from ratedeck.core.vocab import EventKind
    from ratedeck.engine.observe.metrics import Metrics
    from ratedeck.engine.observe.spend import SpendMeter
    from ratedeck.engine.ports import Burial, EventSink, RunClock, Source
    from ratedeck.engine.queues import WorkQueues
    from ratedeck.engine.request import CallFn

    from .ending import RunEnd
    from .keys import KeyRing


class Intake:
    """Makes, submits and refuses new requests for a source (`ports.SourceSink`).

    `backpressure` and `queue_max` bound the main queue the source fills;
    `ttl_s` is the requests' time to live (None: they never expire); with
    `idempotency` each request gets an Idempotency-Key kept across its retries.
    """

    __slots__ = (
        "run",
        "work",
        "metrics",
        "keys",
        "burial",
        "ends",
        "source",
        "_event",
        "backpressure",
        "queue_max",
        "ttl_s",
        "idempotency",
        "pools",
        "follow_discovered",
        "spend",
        "unserved",
        "_next_id",
    )

    def __init__(
        self,
        *,
        run: RunClock,
        queues: WorkQueues,
        metrics: Metrics,
        keys: KeyRing,
        burial: Burial,
        ends: RunEnd,
        source: Source,
        events: EventSink,
        backpressure: bool,
        queue_max: int,
        ttl_s: float | None = None,
        idempotency: bool = False,
        pools: dict[str, int] | None = None,
        follow_discovered: bool = True,
        spend: SpendMeter | None = None,
        unserved: Callable[[Request], str | None] | None = None,
    ) -> None:
        self.run = run
        # A pool whose endpoints each serve named models: what is wrong with a request no
        # endpoint serves (None: one does), so it ends at once instead of waiting for ever.
        self.unserved = unserved
        self.work = queues
        self.metrics = metrics
        self.keys = keys
        self.burial = burial
        self.ends = ends
        self.source = source
        self._event = events.event
        self.backpressure = backpressure
        self.queue_max = queue_max
        self.ttl_s = ttl_s
        self.idempotency = idempotency
        self.pools = pools or {}
        # A generated load with no rate of its own follows the limits keys discover.
        self.follow_discovered = follow_discovered
        self.spend = spend  # the --max-cost cap a job's source asks before queueing (`admit_spend`)
        self._next_id = 0

    # The run's loop and state, as a source reads them.
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.run.loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.run.loop = loop

    @property
    def stopping(self) -> bool:
        return self.run.stopping

    @stopping.setter
    def stopping(self, on: bool) -> None:
        self.run.stopping = on

    @property
    def queues(self) -> WorkQueues:
        return self.work

    def clock(self) -> float:
        return self.run.clock()

    def wall_time(self, t: float) -> float:
        return t + self.run.wall_offset

    def event(self, kind: EventKind, text: str) -> None:
        self._event(kind, text)

    def problem(self, text: str) -> None:
        self.ends.problem(text)

    def live_capacity(self, now: float) -> float:
        return self.keys.live_capacity(now)

    def next_gate_open(self, now: float) -> float | None:
        return self.keys.next_gate_open(now)

    def new_request(
        self,
        params: dict | None = None,
        pool: str | None = None,
        ttl_s: float | None = None,
        call: CallFn | None = None,
        intended_at: float | None = None,
    ) -> Request:
        """A request created now, with the run's TTL unless `ttl_s` is given (no TTL: it never expires).

        `intended_at` is when it should have arrived (a fixed arrival rate's
        schedule): latency from arrival counts from there.
        """
        now = self.run.clock()
        self._next_id += 1
        if pool is not None and self.pools and pool not in self.pools:
            raise ValueError(f"no pool {pool!r}; pools are {', '.join(self.pools)}")
        ttl = self.ttl_s if ttl_s is None else ttl_s
        deadline = now + ttl if ttl is not None else math.inf
        req = Request(self._next_id, now, deadline, params, pool=pool, call=call, intended_at=intended_at)
        if self.idempotency:
            req.idempotency_key = uuid.uuid4().hex  # one per logical request, kept across its retries
        return req

    def submit(self, req: Request) -> None:
        """Accept a new request into the main queue."""
        self.metrics.generated += 1
        if req.pin is not None:
            owner = self.keys.by_label.get(req.pin)
            if owner is None or owner.blocked:  # its one key is not ours, or was refused for good
                req.last_error = f"its key {req.pin} {'was refused' if owner else 'is not one of ours'}"
                self.burial.bury(req, self.run.clock())
                return
        if self.unserved is not None and (why := self.unserved(req)) is not None:
            req.last_error = why
            self.burial.bury(req, self.run.clock())
            return
        self.work.put(req)

    def refuse(self, req: Request) -> None:
        """A new request that found no room: counted as generated, and shed at once."""
        self.metrics.generated += 1
        self.burial.shed(req)

    def withdraw(self, req: Request) -> bool:
        """A queued request its caller gave up on: out of the queue now and shed, so it holds
        no place and never reserves a slot. False when it is not queued (sent, or ended)."""
        req.cancelled = True  # not sent again if it is in flight now
        if not self.work.discard(req):
            return False
        self.burial.shed(req)
        return True

    @property
    def spend_gate(self) -> bool:
        """Whether a job's source must ask `admit_spend` before queueing (a cost cap is set)."""
        return self.spend is not None and self.spend.gating

    async def admit_spend(self, req: Request) -> bool:
        """Reserve `req`'s most possible cost within the cost cap (waiting while in-flight
        requests may free room); False when the cap is reached: make no more requests."""
        return self.spend is None or await self.spend.admit(req)

    def source_done(self) -> None:
        self.ends.check_finished()

    def limits_discovered(self) -> None:
        """A key adopted the limit its server advertises: a generated load with no rate of its
        own follows what the keys now allow."""
        if self.follow_discovered:
            self.source.set_rate(min(MAX_RATE, self.keys.discovered_rate()))
