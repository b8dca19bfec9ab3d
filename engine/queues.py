"""Main queue, dead-letter queue and graveyard.

Retries (DLQ) are served ahead of fresh work once their backoff has passed.
Workers wait on the queues without polling: a getter is a future, woken by a
put or by one timer armed for the earliest retry.

A request pinned to one key (`Request.pin`: a workload line's `_key`, or an
Idempotency-Key's first account) waits in that key's own queues, which only
its worker takes from, ahead of the shared ones: it never holds up the other
keys, and unpinned work pays one integer test for them.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

from .flows import FlowQueue
from .jsonl import JsonLines
from .ports import AdmissionT
from .request import Request, line_fields

_POOL_SCAN = 64  # how far past the head a full pool's requests are skipped


class _Pinned:
    """One key's own queues: fresh work (FIFO) and retries (a heap by eligible time)."""

    __slots__ = ("main", "dlq")

    def __init__(self) -> None:
        self.main: deque[Request] = deque()
        self.dlq: list[Request] = []

    def __len__(self) -> int:
        return len(self.main) + len(self.dlq)


class WorkQueues:
    """Fresh work (FIFO) and retries (a heap by eligible time), with waiting getters;
    and each key's pinned work (`_Pinned`), taken only by that key."""

    __slots__ = (
        "main",
        "dlq",
        "_getters",
        "_timer",
        "_space",
        "_space_limit",
        "_loop",
        "pinned",
        "_pinned_n",
        "_pinned_fresh",
        "flows",
        "urgent",
    )

    def __init__(self, flows: FlowQueue | None = None) -> None:
        # Fresh work: one first-come queue, or with flows (gateway clients) a `FlowQueue` that
        # serves them by priority, fair share and quota (engine/flows.py).
        # With flows, every fresh unpinned request waits there and `main` stays empty.
        self.flows = flows
        # Wakes every key (the composition root sets it): a request of a higher priority came
        # while keys wait for the time the lower one they hold for may go.
        self.urgent: Callable[[], None] | None = None
        self.main: deque[Request] = deque()
        self.dlq: list[Request] = []
        self._getters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._space: asyncio.Event | None = None
        self._space_limit = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pinned: dict[str, _Pinned] = {}
        self._pinned_n = 0  # requests in every key's pinned queues
        self._pinned_fresh = 0  # of which fresh (not retries)

    def __len__(self) -> int:
        n = len(self.main) + len(self.dlq) + self._pinned_n
        return n if self.flows is None else n + len(self.flows)

    def fresh(self) -> int:
        """Fresh work waiting, shared and pinned: what backpressure bounds."""
        n = len(self.main) + self._pinned_fresh
        return n if self.flows is None else n + len(self.flows)

    def retries(self) -> int:
        """Retries waiting, shared and pinned."""
        return len(self) - self.fresh()

    def all_queued(self) -> list[Request]:
        """Every queued request: fresh work first, then retries by due time."""
        fresh = [*self.main, *(self.flows or ()), *(r for p in self.pinned.values() for r in p.main)]
        return [*fresh, *sorted([*self.dlq, *(r for p in self.pinned.values() for r in p.dlq)])]

    def take_pinned(self, key: str) -> list[Request]:
        """Remove and return every request pinned to `key` (its key was refused for good)."""
        p = self.pinned.pop(key, None)
        if p is None:
            return []
        self._pinned_n -= len(p)
        self._pinned_fresh -= len(p.main)
        return [*p.main, *p.dlq]

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # -- putting
    def put(self, req: Request) -> None:
        if req.pin is not None:
            self._pinned_for(req.pin).main.append(req)
            self._pinned_n += 1
            self._pinned_fresh += 1
            self._wake_all()  # only its key's worker can take it: wake whoever waits
            return
        if self.flows is not None:
            if self.flows.append(req) and self.urgent is not None:
                self.urgent()  # keys holding for lower-priority work look again: this goes first
        else:
            self.main.append(req)
        self._wake()

    def retry(self, req: Request) -> None:
        """Queue a retry; it is served ahead of fresh work from `req.eligible_at` on."""
        if req.pin is not None:
            heap = self._pinned_for(req.pin).dlq
            heapq.heappush(heap, req)
            self._pinned_n += 1
            if self._getters and heap[0] is req:
                self._arm()
            return
        heapq.heappush(self.dlq, req)
        if self._getters and self.dlq[0] is req:
            self._arm()

    def discard(self, req: Request) -> bool:
        """Take `req` out of whichever queue holds it (its caller gave up); False if none does.

        O(queue): for the rare request withdrawn before it was sent, never on the hot path."""
        p = self.pinned.get(req.pin) if req.pin is not None else None
        if self.flows is not None and req in self.flows:
            self.flows.remove(req)
        elif req in self.main:
            self.main.remove(req)
        elif p is not None and req in p.main:
            p.main.remove(req)
            self._pinned_n -= 1
            self._pinned_fresh -= 1
        elif req in self.dlq:
            self.dlq.remove(req)
            heapq.heapify(self.dlq)
            return True
        elif p is not None and req in p.dlq:
            p.dlq.remove(req)
            heapq.heapify(p.dlq)
            self._pinned_n -= 1
            return True
        else:
            return False
        if self._space is not None and self.fresh() < self._space_limit:
            self._space.set()
        return True

    def _pinned_for(self, key: str) -> _Pinned:
        p = self.pinned.get(key)
        if p is None:
            p = self.pinned[key] = _Pinned()
        return p

    def _pop_pinned(self, key: str, now: float) -> Request | None:
        p = self.pinned.get(key)
        if p is None:
            return None
        if p.dlq and p.dlq[0].eligible_at <= now:
            self._pinned_n -= 1
            return heapq.heappop(p.dlq)
        if p.main:
            return self._take_pinned_fresh(p)
        return None

    def _take_pinned_fresh(self, p: _Pinned) -> Request:
        self._pinned_n -= 1
        self._pinned_fresh -= 1
        req = p.main.popleft()
        if self._space is not None and self.fresh() < self._space_limit:
            self._space.set()
        return req

    # -- taking
    def pop_ready(self, now: float, key: str | None = None) -> Request | None:
        """The next request to send: one pinned to `key` first, then an eligible retry, else
        fresh work (a key whose requests all spend alike takes the head)."""
        if self._pinned_n and key is not None:
            pinned = self._pop_pinned(key, now)
            if pinned is not None:
                return pinned
        dlq, main = self.dlq, self.main
        if dlq and dlq[0].eligible_at <= now:
            req = heapq.heappop(dlq)
        elif self.flows is not None:
            got = self.flows.popleft(now)
            if got is None:
                return None
            req = got
        elif main:
            req = main.popleft()
        else:
            return None
        if self._space is not None and self.fresh() < self._space_limit:
            self._space.set()
        return req

    def pick(
        self, now: float, choose: Callable[[Request], AdmissionT], key: str | None = None
    ) -> tuple[Request, AdmissionT] | None:
        """The first request `choose` admits, in `pop_ready`'s order, taken out with its decision.

        `choose(request)` returns a decision (`engine/path/admit.py`): one whose `take` is
        true takes the request; one whose `stop` is true ends the search (what holds that
        request holds every one behind it). Fresh work is searched a little way past the
        head (`_POOL_SCAN`), so one busy pool or budget does not stall the others.
        """
        if self._pinned_n and key is not None:
            p = self.pinned.get(key)
            if p is not None:
                if p.dlq and p.dlq[0].eligible_at <= now and (d := choose(p.dlq[0])).take:
                    self._pinned_n -= 1
                    return heapq.heappop(p.dlq), d
                if p.main and (d := choose(p.main[0])).take:
                    return self._take_pinned_fresh(p), d
        dlq, main = self.dlq, self.main
        req, got = None, None
        if dlq and dlq[0].eligible_at <= now and (d := choose(dlq[0])).take:
            req, got = heapq.heappop(dlq), d
        elif (flows := self.flows) is not None:
            for candidate in flows.candidates(now, _POOL_SCAN):
                d = choose(candidate)
                if d.take:
                    req, got = candidate, d
                    flows.take(candidate, now)
                    break
                if d.stop:
                    break
        else:
            for i in range(min(len(main), _POOL_SCAN)):
                d = choose(main[i])
                if d.take:
                    req, got = main[i], d
                    del main[i]
                    break
                if d.stop:  # what stops it stops every request behind it too
                    break
        if req is None or got is None:
            return None
        if self._space is not None and self.fresh() < self._space_limit:
            self._space.set()
        return req, got

    def add_getter(self, fut: asyncio.Future[None]) -> None:
        """Register a future to be resolved when work may be ready.

        Call only right after `pop_ready` returned None; a getter whose future
        is already done (poked elsewhere) is skipped when waking.
        """
        self._arm()
        self._getters.append(fut)

    def pass_on(self) -> None:
        """A woken getter could not take the work: wake the next one instead."""
        self._wake()

    def _wake(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _wake_all(self) -> None:
        getters, self._getters = self._getters, deque()
        for fut in getters:
            if not fut.done():
                fut.set_result(None)

    def _arm(self) -> None:
        """One timer for the earliest retry (or flow's quota freeing), so a waiting getter wakes when it is due."""
        when = self.dlq[0].eligible_at if self.dlq else None
        if self.flows is not None and self.flows:
            free = self.flows.next_free_at(self._get_loop().time())
            if free is not None and (when is None or free < when):
                when = free
        if self._pinned_n:
            for p in self.pinned.values():
                if p.dlq and (when is None or p.dlq[0].eligible_at < when):
                    when = p.dlq[0].eligible_at
        if when is None:
            return
        loop = self._get_loop()
        if self._timer is not None:
            if self._timer.when() <= when and not self._timer.cancelled():
                return
            self._timer.cancel()
        self._timer = loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._pinned_n:
            self._wake_all()  # the retry due may be pinned: its key must look
        else:
            self._wake()
        if (self.dlq or self._pinned_n or self.flows) and self._getters:
            self._arm()

    # -- backpressure
    async def wait_space(self, limit: int) -> None:
        """Wait until the main queue holds fewer than `limit` requests.

        A full queue wakes the waiter only once it has room for an eighth of
        `limit` (at least 1): a source held back by a busy client then refills
        several at once instead of waking for every request taken (a loop turn
        each, when the client is short of CPU). The bound itself is unchanged."""
        while self.fresh() >= limit:
            if self._space is None:
                self._space = asyncio.Event()
            self._space.clear()
            self._space_limit = limit - max(0, limit // 8 - 1)
            await self._space.wait()

    def release_space(self) -> None:
        """Let a waiting generator go (backpressure switched off, or stopping)."""
        if self._space is not None:
            self._space_limit = 1 << 62
            self._space.set()

    def drain_expired(self, now: float) -> list[Request]:
        """Remove and return every queued request whose deadline has passed.

        The main queue is in creation order and most requests share the run's
        TTL, so the scan stops at the first live request: O(expired), not
        O(queue). One with a shorter deadline behind a longer one (a library
        call's own TTL, a cancelled call of a failed message) is expired when
        a worker pops it instead, never sent.
        """
        main = self.main
        dead = self.flows.expired(now) if self.flows is not None else []
        while main and main[0].deadline <= now:
            dead.append(main.popleft())
        if dead and self._space is not None and self.fresh() < self._space_limit:
            self._space.set()
        dead_dlq = [r for r in self.dlq if r.deadline <= now]
        if dead_dlq:
            self.dlq = [r for r in self.dlq if r.deadline > now]
            heapq.heapify(self.dlq)
        if self._pinned_n:
            for p in self.pinned.values():
                while p.main and p.main[0].deadline <= now:
                    dead.append(p.main.popleft())
                    self._pinned_n -= 1
                    self._pinned_fresh -= 1
                late = [r for r in p.dlq if r.deadline <= now]
                if late:
                    p.dlq = [r for r in p.dlq if r.deadline > now]
                    heapq.heapify(p.dlq)
                    self._pinned_n -= len(late)
                    dead_dlq.extend(late)
        return dead + dead_dlq if dead_dlq else dead


class Graveyard:
    """Requests that used up their attempts, one JSONL line each, written as they happen.

    Each line is written and flushed when its request is buried, so a kill -9
    loses at most a partial last line. `written` counts the lines that reached
    the file. A write that fails sets `problem`, no later line is tried (they
    are counted, not written), and `flush()` returns the problem so the
    engine reports it; a run whose graveyard is incomplete must say so.

    A line carries the whole request as it was submitted, so `ratedeck replay`
    can send it again: `params` (what the workload gave, never the key, the
    nonce or the id the transport adds) and `pool`, with `reason` (the last
    error, or the last status) and `ending` ("graveyard"). `redact`, when set
    (the composition root sets the engine's), masks every key in the texts and parameters.
    """

    __slots__ = ("path", "count", "redact", "_out")

    def __init__(self, path: str | None) -> None:
        self.path = path or None
        self.count = 0
        self.redact: Callable[[str], str] | None = None
        self._out = JsonLines(self.path, "graveyard") if self.path is not None else None

    @property
    def written(self) -> int:
        """Lines that reached the file."""
        return self._out.written if self._out is not None else 0

    @property
    def problem(self) -> str | None:
        return self._out.problem if self._out is not None else None

    def add(self, req: Request, now: float, wall_offset: float) -> None:
        self.count += 1
        if self._out is not None and self._out.problem is None:
            self._out.write(self.record(req, now, wall_offset))

    def record(self, req: Request, now: float, wall_offset: float) -> dict[str, object]:
        """The line `add` writes for `req` (a durable store journals the same line)."""
        reason = req.last_error or (f"HTTP {req.last_status}" if req.last_status is not None else None)
        return {
            "id": req.id,
            "ending": "graveyard",
            "attempts": req.attempts,
            "last_status": req.last_status,
            "last_error": req.last_error,  # masked where it was made (transport, engine)
            "reason": reason,
            "created_at": round(req.created_at + wall_offset, 3),
            "buried_at": round(now + wall_offset, 3),
            "params": self.scrub(req.params, self.redact) if req.params else {},
            "pool": req.pool,
            **({"line": self.scrub(line, self.redact)} if (line := line_fields(req)) else {}),
        }

    @staticmethod
    def scrub(value: Any, redact: Callable[[str], str] | None) -> Any:
        """`value` (parameters: dicts, lists, scalars) with `redact` applied to every string in it."""
        if redact is None:
            return value
        if isinstance(value, str):
            return redact(value)
        if isinstance(value, dict):
            return {redact(str(k)): Graveyard.scrub(v, redact) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [Graveyard.scrub(v, redact) for v in value]
        return value

    def flush(self) -> str | None:
        """Lines are written as they come; returns the write problem, if one happened."""
        return self.problem

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
