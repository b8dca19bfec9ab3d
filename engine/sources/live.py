"""Requests from live clients: each one made when a client asks, answered when it ends.

A `LiveSource` is neither a job nor fed and has no arrival rate: clients bring
the work, one request at a time, and the engine paces it as it paces any other
source (the same limiters, budgets, gates, key affinity and endings). Its user
(the gateway) makes a request, offers it, and learns its end through the
request's `on_done`; a client that gives up withdraws it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter
from typing import TYPE_CHECKING

from ratedeck.engine.request import DoneCallback, Request, Shape
from ratedeck.engine.snapshot import ClientRow, ClientView, QuotaRow

if TYPE_CHECKING:
    from ratedeck.engine.flows import FlowQueue, QuotaRefusal
    from ratedeck.engine.ports import SourceSink
    from ratedeck.engine.snapshot import MessageStats

#: Queue waits kept for the percentiles (the latest ones; older ones drop off).
_WAITS_KEPT = 4096


#: Upper bounds (seconds) of the queue-wait histogram's buckets.
WAIT_BUCKETS_S = (0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class LiveSource:
    """A `Source` whose requests come from live clients (see the module doc)."""

    fed = False
    clients = True  # what a client sends is its own: written nowhere unless the user asks

    def __init__(self) -> None:
        self.rate = 0.0  # no arrival rate: clients decide when work comes
        self.exhausted = False
        self._sink: SourceSink | None = None
        self._ready: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None
        self.waiting: set[Request] = set()  # offered, not yet sent or ended
        self.waits_ms: list[float] = []  # the latest queue waits
        self.statuses: Counter[int] = Counter()
        self.wait_sum_s = 0.0
        self.wait_count = 0
        self.wait_buckets = [0] * len(WAIT_BUCKETS_S)  # waits per bucket (not cumulative)
        # Per client, with flows (gateway clients): their latest waits, answers and quota refusals.
        self.flow_waits_ms: dict[int, list[float]] = {}
        self.flow_answered: Counter[int] = Counter()
        self.flow_refused: Counter[int] = Counter()

    # ------------------------------------------------------------ the Source protocol
    @property
    def job(self) -> bool:
        return False

    @property
    def job_total(self) -> None:
        return None  # clients come as they come

    @property
    def job_models(self) -> None:
        return None

    def set_rate(self, rate: float) -> None:
        """Clients set the pace; an arrival rate means nothing here (kept for the protocol)."""

    def set_throttle(self, value: str | float) -> None:
        raise ValueError(
            "live clients have no entry throttle: the gateway queues what the limits cannot admit"
        )

    def poke(self) -> None:
        pass

    async def run(self, sink: SourceSink) -> None:
        self._sink = sink
        self._closing = asyncio.Event()
        self._ready_event().set()
        try:
            await self._closing.wait()
        finally:
            self.exhausted = True
            sink.source_done()

    def close_second(self) -> None:
        pass

    def stats(self, elapsed_s: float) -> MessageStats | None:
        return None

    # ------------------------------------------------------------ what the gateway does
    def _ready_event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def ready(self) -> None:
        """Wait until the engine runs this source (requests can be made from then on)."""
        await self._ready_event().wait()

    @property
    def sink(self) -> SourceSink:
        if self._sink is None:
            raise RuntimeError("the engine has not started this source")
        return self._sink

    @property
    def open(self) -> bool:
        """Whether new requests are taken (not once the engine stops, or `close` was called)."""
        sink = self._sink
        return (
            sink is not None
            and not sink.stopping
            and not self.exhausted
            and not (self._closing is not None and self._closing.is_set())
        )

    def close(self) -> None:
        """Take no new request; the run may finish once what was taken has ended."""
        if self._closing is not None:
            self._closing.set()

    def make(
        self,
        shape: Shape,
        *,
        ttl_s: float | None,
        on_done: DoneCallback,
        idempotency_key: str | None = None,
        flow: int = 0,
    ) -> Request:
        """A request for one client call; it may wait queued up to `ttl_s` (None: forever).
        `flow`: the client's flow (its index in `EngineSettings.flows`)."""
        req = self.sink.new_request(None, ttl_s=ttl_s)
        req.shape = shape
        if flow:
            req.flow = flow
        if idempotency_key:
            req.idempotency_key = idempotency_key  # the client's own, kept across retries (and pins them)
        req.on_done = self._ended(on_done)
        return req

    def _ended(self, on_done: DoneCallback) -> DoneCallback:
        def done(req: Request, ending) -> None:
            self._left_queue(req)
            on_done(req, ending)

        return done

    def full(self) -> bool:
        """Whether the queue is at its bound (backpressure): a new request would not fit."""
        sink = self.sink
        return sink.queues.fresh() >= sink.queue_max

    def offer(self, req: Request) -> bool:
        """Queue `req` now if there is room; False (nothing queued) when the queue is full."""
        if not self.open or self.full():
            return False
        self._queue(req)
        return True

    async def submit(self, req: Request) -> None:
        """Queue `req`, waiting for room first when the queue is full."""
        sink = self.sink
        await sink.queues.wait_space(sink.queue_max)
        self._queue(req)

    def _queue(self, req: Request) -> None:
        self.waiting.add(req)
        self.sink.submit(req)

    def _left_queue(self, req: Request) -> None:
        if req in self.waiting:
            self.waiting.discard(req)
            left_at = req.first_sent_at if req.first_sent_at is not None else self.sink.clock()
            wait_s = max(0.0, left_at - req.created_at)
            self.wait_sum_s += wait_s
            self.wait_count += 1
            for i, bound in enumerate(WAIT_BUCKETS_S):
                if wait_s <= bound:
                    self.wait_buckets[i] += 1
                    break
            waits = self.waits_ms
            waits.append(wait_s * 1000.0)
            if len(waits) > _WAITS_KEPT:
                del waits[: len(waits) - _WAITS_KEPT]
            if self.flows is not None:
                mine = self.flow_waits_ms.setdefault(req.flow, [])
                mine.append(wait_s * 1000.0)
                if len(mine) > _WAITS_KEPT:
                    del mine[: len(mine) - _WAITS_KEPT]

    def withdraw(self, req: Request) -> bool:
        """The client gave up: a queued `req` leaves the queue now and ends as shed; one in
        flight is never sent again. True when it was still queued."""
        req.cancelled = True
        if self._sink is None or req.ending is not None:
            return False
        return self._sink.withdraw(req)

    def withdraw_all(self, *, retries: bool = False) -> int:
        """Every request still queued and never sent ends as shed (a drain answers them at once);
        with `retries`, queued retries too (the engine has stopped: nothing will send them)."""
        return sum(
            1
            for req in list(self.waiting)
            if (retries or req.first_sent_at is None) and req.ending is None and self.withdraw(req)
        )

    def answered(self, status: int, flow: int = 0) -> None:
        """The client (of `flow`) was answered `status` (counted for the clients' view)."""
        self.statuses[status] += 1
        self.flow_answered[flow] += 1

    # ------------------------------------------------------------ clients' flows
    @property
    def flows(self) -> FlowQueue | None:
        """The flows' queue when the gateway knows several clients (engine/flows.py)."""
        return self.sink.queues.flows if self._sink is not None else None

    def quota_refusal(self, req: Request) -> QuotaRefusal | None:
        """Whether `req`'s client refuses it past a quota (`quota = "refuse"`): which quota and
        when it frees; counted as refused. None: it may queue."""
        flows = self.flows
        if flows is None:
            return None
        refusal = flows.refusal(req, self.sink.clock())
        if refusal is not None:
            self.flow_refused[req.flow] += 1
        return refusal

    def retry_after_s(self) -> float:
        """When capacity should free for a new request, in seconds: the next closed gate's
        opening, or the time the keys need to send what waits ahead of it; at least 1."""
        sink = self.sink
        now = sink.clock()
        gate = sink.next_gate_open(now)
        wait = gate - now if gate is not None else 0.0
        capacity = sink.live_capacity(now)
        ahead = len(sink.queues)
        if capacity > 0:
            wait = max(wait, ahead / capacity)
        elif gate is None:
            wait = max(wait, 60.0)  # nothing can send now and nothing says when: a minute
        return float(max(1, math.ceil(wait)))

    def view(self) -> ClientView:
        waits = sorted(self.waits_ms)
        return ClientView(
            waiting=sum(1 for r in self.waiting if r.first_sent_at is None),
            answered=sum(self.statuses.values()),
            wait_p50_ms=_quantile(waits, 0.5),
            wait_p99_ms=_quantile(waits, 0.99),
            wait_sum_s=self.wait_sum_s,
            wait_count=self.wait_count,
            wait_buckets=tuple(zip(WAIT_BUCKETS_S, itertools.accumulate(self.wait_buckets), strict=True)),
            statuses=tuple(sorted(self.statuses.items())),
            rows=self._rows(),
            unit=self.flows.unit if self.flows is not None else "requests",
        )

    def _rows(self) -> tuple[ClientRow, ...]:
        flows = self.flows
        if flows is None:
            return ()
        rows = []
        for i, f in enumerate(flows.rows(self.sink.clock())):
            waits = sorted(self.flow_waits_ms.get(i, ()))
            rows.append(
                ClientRow(
                    name=f.name,
                    priority=f.priority,
                    weight=f.weight,
                    waiting=f.waiting,
                    answered=self.flow_answered[i],
                    wait_p50_ms=_quantile(waits, 0.5),
                    wait_p99_ms=_quantile(waits, 0.99),
                    share=f.share,
                    served=f.served,
                    sent=f.taken,
                    refused=self.flow_refused[i],
                    quotas=tuple(QuotaRow(name, limit, left) for name, limit, left in f.quotas),
                )
            )
        return tuple(rows)


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
