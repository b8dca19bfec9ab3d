"""Flows: the queue of fresh work split by who sent it, served by priority, fair share and quota.

A gateway serving a team knows several clients (`[[gateway.clients]]`); each is a flow
(`FlowSpec`) with a priority, a weight and optional quotas. `FlowQueue` replaces the one
first-come queue of fresh work when flows are configured (`WorkQueues.flows`):

- **Priority.** A waiting request of a higher priority (interactive > standard > batch)
  is always offered to a key before any of a lower one, so a batch client delays an
  interactive one by at most the requests already in flight.
- **Fair share.** Among the flows of one priority that have work waiting, requests are
  served by start-time fair queuing (Goyal, Vin and Cheng, SIGCOMM 1996): each flow has a
  virtual start tag; the flow with the least goes next, and serving a request advances its
  flow's tag by the request's cost over the flow's weight. Cost is the pool's binding unit:
  the tokens admission charges in an LLM pool, else the request's weight (1 for most).
  That is max-min fair by weight, and a flow that was idle starts at the current virtual
  time: it banks no credit, and its share goes to the busy flows at once.
- **Quotas.** A flow's quota (requests, tokens or USD) holds over any 60 s (`usd_per_day`
  over any 24 h): a sliding window of what was charged when each request was taken, not a
  bucket that allows two windows' worth at once. A flow over its quota is skipped until the
  oldest charges leave the window (`next_free_at` arms the queue's timer), or, with
  `refuse`, a new request is refused at once (`refusal`: the gateway's 429 and Retry-After).

Flows are few (a team's clients), so the order is found by a scan of the flows, not a heap.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from ratedeck.core.vocab import Priority

from .request import Request
from .settings import FlowSpec

#: A quota's window: any 60 s; `usd_per_day`'s any 24 h.
MINUTE_S = 60.0
DAY_S = 86_400.0
#: How long after its window a quota's charge leaves it: the way from the send to the server's
#: arrival stamp varies (a connection opened, a busy loop), and a quota holds at the server.
QUOTA_MARGIN_S = 1.0
#: The window the shares shown are taken over.
SHARE_WINDOW_S = 60.0
_EPS = 1e-9
#: Charges of requests taken and not sent kept at most (a request taken then expired never sends).
_UNSENT_KEPT = 4096

#: What a quota counts: requests, tokens (as admission charges them) or USD (the price of
#: the tokens admission charges: the prompt's estimate and the whole `max_tokens`).
REQUESTS, TOKENS, USD = "requests", "tokens", "usd"

#: A quota's name as configured, by its unit.
QUOTA_NAMES = {REQUESTS: "requests_per_minute", TOKENS: "tokens_per_minute", USD: "usd_per_day"}


class Window:
    """What was charged in the last `window_s` seconds: each charge kept with its time, so the
    sum holds over any window (a sliding window, exact), and the time a new charge fits is known."""

    __slots__ = ("limit", "window_s", "charges", "used")

    def __init__(self, limit: float, window_s: float, margin_s: float = 0.0) -> None:
        self.limit = limit
        # A charge leaves `margin_s` after its window: the server stamps the arrival, a little
        # after the send, and how much later varies (a connection opened, a loop turn).
        self.window_s = window_s + margin_s
        # [time, amount] each, in the order charged; a time may move later once (`FlowQueue.sent`)
        self.charges: deque[list[float]] = deque()
        self.used = 0.0

    def expire(self, now: float) -> None:
        # `t + window_s <= now`, the very sum `free_at` returns: a timer armed for that time
        # finds the charge gone (now - window_s may round below t and hold it forever)
        charges, window_s = self.charges, self.window_s
        while charges and charges[0][0] + window_s <= now:
            self.used -= charges.popleft()[1]
        if not charges:
            self.used = 0.0  # no float residue once empty

    def fits(self, now: float, amount: float) -> bool:
        self.expire(now)
        return self.used + amount <= self.limit + _EPS

    def charge(self, now: float, amount: float) -> list[float]:
        """Charge `amount` at `now`; the entry (its time may be moved to the send's, later)."""
        entry = [now, amount]
        if amount:
            self.charges.append(entry)
            self.used += amount
        return entry

    def left(self, now: float) -> float:
        self.expire(now)
        return max(0.0, self.limit - self.used)

    def free_at(self, now: float, amount: float) -> float:
        """The earliest time `amount` more fits (now if it does; inf if it is over the limit alone)."""
        self.expire(now)
        over = self.used + amount - self.limit
        if over <= _EPS:
            return now
        if amount > self.limit + _EPS:
            return math.inf
        freed, latest = 0.0, -math.inf
        for t, charged in self.charges:
            freed += charged
            latest = max(latest, t)  # a time moved to its send's may be later than the next's
            if freed >= over - _EPS:
                return latest + self.window_s
        return math.inf


class Quota(NamedTuple):
    """One quota of a flow: what it counts (`REQUESTS`, `TOKENS`, `USD`) and its window."""

    unit: str
    window: Window

    @property
    def name(self) -> str:
        return QUOTA_NAMES[self.unit]


class Flow:
    """One flow's waiting requests (FIFO), its virtual start tag, its quotas and what it was served."""

    __slots__ = (
        "spec",
        "index",
        "rank",
        "weight",
        "queue",
        "start",
        "quotas",
        "recent",
        "served",
        "taken",
        "unsent",
    )

    def __init__(self, spec: FlowSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.rank = Priority(spec.priority).rank
        self.weight = float(spec.weight)
        self.queue: deque[Request] = deque()
        self.start = 0.0  # the virtual start tag of its head (or of its next request, idle)
        quotas = []
        if spec.requests_per_minute is not None:
            quotas.append(Quota(REQUESTS, Window(spec.requests_per_minute, MINUTE_S, QUOTA_MARGIN_S)))
        if spec.tokens_per_minute is not None:
            quotas.append(Quota(TOKENS, Window(spec.tokens_per_minute, MINUTE_S, QUOTA_MARGIN_S)))
        if spec.usd_per_day is not None:
            quotas.append(Quota(USD, Window(spec.usd_per_day, DAY_S, QUOTA_MARGIN_S)))
        self.quotas = tuple(quotas)
        self.recent = Window(math.inf, SHARE_WINDOW_S)  # binding units served, for its share
        self.served = 0.0  # binding units served since the start
        self.taken = 0  # requests taken to be sent
        # The quota charges of requests taken and not yet sent, by request id: each moves to its
        # send's time (`FlowQueue.sent`), which a key's pacing may put a little after the take.
        self.unsent: dict[int, list[list[float]]] = {}


class QuotaRefusal(NamedTuple):
    """A request a `refuse` flow may not queue: the quota it would pass and when it frees."""

    quota: str  # its configured name, like "tokens_per_minute"
    limit: float
    retry_after_s: float


class FlowQueue:
    """The fresh work of several flows (see the module doc); `WorkQueues` holds it as `main`.

    `tokens(req)` is what admission charges a request in tokens (None: the pool counts no
    tokens), `usd(req)` its price at admission (None: no price table); `weighted`: requests
    cost their weight in the pool's own limits (the binding unit without tokens)."""

    __slots__ = ("flows", "_ranks", "vtime", "_n", "_tokens", "_usd", "_weighted", "arrival_checks")

    def __init__(
        self,
        specs: Sequence[FlowSpec],
        *,
        tokens: Callable[[Request], int] | None = None,
        usd: Callable[[Request], float | None] | None = None,
        weighted: bool = False,
    ) -> None:
        if not specs:
            raise ValueError("a FlowQueue needs at least one flow")
        self.flows = [Flow(spec, i) for i, spec in enumerate(specs)]
        ranks = sorted({f.rank for f in self.flows})
        self._ranks = [[f for f in self.flows if f.rank == r] for r in ranks]
        self.vtime = 0.0
        self._n = 0
        # Whether a new request may be refused on arrival (`refusal`, `unpriced`): a flow that
        # refuses past its quota, or counts USD. Without one, the gateway asks nothing.
        self.arrival_checks = any(f.spec.refuse or f.spec.usd_per_day is not None for f in self.flows)
        self._tokens = tokens
        self._usd = usd
        self._weighted = weighted

    # ------------------------------------------------------------ what a request costs
    def cost(self, req: Request) -> float:
        """Its cost in the pool's binding unit: its tokens, else its weight, else 1."""
        if self._tokens is not None:
            return float(self._tokens(req))
        if self._weighted:
            shape = req.shape
            return float(shape.weight) if shape is not None else 1.0
        return 1.0

    def amount(self, req: Request, unit: str) -> float:
        """What a quota counting `unit` charges for `req`."""
        if unit == REQUESTS:
            return 1.0
        if unit == TOKENS:
            return float(self._tokens(req)) if self._tokens is not None else 0.0
        usd = self._usd(req) if self._usd is not None else None
        return float(usd) if usd is not None else 0.0

    @property
    def unit(self) -> str:
        """The binding unit shares are counted in: "tokens", "weight" or "requests"."""
        return "tokens" if self._tokens is not None else "weight" if self._weighted else "requests"

    def unpriced(self, req: Request) -> bool:
        """Whether `req`'s flow counts USD and `req`'s model has no price (it cannot be counted)."""
        flow = self._flow(req)
        if not any(q.unit == USD for q in flow.quotas):
            return False
        return self._usd is None or self._usd(req) is None

    # ------------------------------------------------------------ the deque a queue needs
    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Request]:
        for group in self._ranks:
            for flow in group:
                yield from flow.queue

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Request) and req in self._flow(req).queue

    def _flow(self, req: Request) -> Flow:
        i = req.flow
        return self.flows[i] if 0 <= i < len(self.flows) else self.flows[0]

    def append(self, req: Request) -> bool:
        """Queue `req` in its flow; True when it goes ahead of work of a lower priority that was
        already waiting (a key holding for that work should look again: `WorkQueues.urgent`)."""
        flow = self._flow(req)
        if not flow.queue:  # it was idle: it starts now, with no credit banked
            flow.start = max(self.vtime, flow.start)
        ahead = False
        if self._n and len(self._ranks) > 1:
            rank = flow.rank
            ahead = not any(f.queue for f in self.flows if f.rank <= rank)
        flow.queue.append(req)
        self._n += 1
        return ahead

    def remove(self, req: Request) -> None:
        """Take out a request never sent (its client left): no tag moves, nothing is charged."""
        self._flow(req).queue.remove(req)  # ValueError when it is not there, as a deque's
        self._n -= 1

    # ------------------------------------------------------------ serving
    def _held(self, flow: Flow, now: float) -> bool:
        """Whether its head would pass one of its quotas now."""
        return self._over(flow, flow.queue[0], now)

    def order(self, now: float) -> Iterator[Flow]:
        """The flows with work that may be served now, in service order: priority first, then
        the least start tag (ties: configured order)."""
        for group in self._ranks:
            ready = [f for f in group if f.queue and not (f.quotas and self._held(f, now))]
            if len(ready) > 1:
                ready.sort(key=_start_tag)
            yield from ready

    def first(self, now: float) -> Request | None:
        """The request to serve next, not taken."""
        for flow in self.order(now):
            return flow.queue[0]
        return None

    def candidates(self, now: float, most: int) -> Iterator[Request]:
        """Up to `most` requests in service order: each flow's, head first, flow after flow."""
        left = most
        for flow in self.order(now):
            for req in flow.queue:
                if left <= 0:
                    return
                if flow.quotas and req is not flow.queue[0] and self._over(flow, req, now):
                    break  # its quota has room for the head, not for this one
                yield req
                left -= 1

    def _over(self, flow: Flow, req: Request, now: float) -> bool:
        """Whether `req` would pass one of its flow's quotas now."""
        return any(not q.window.fits(now, self.amount(req, q.unit)) for q in flow.quotas)

    def take(self, req: Request, now: float) -> None:
        """`req` goes to a key now: out of its flow, its flow's tag advanced, its quotas charged."""
        flow = self._flow(req)
        queue = flow.queue
        if queue and queue[0] is req:
            queue.popleft()
        else:
            queue.remove(req)
        self._n -= 1
        cost = self.cost(req)
        if flow.start > self.vtime:
            self.vtime = flow.start
        flow.start += cost / flow.weight
        flow.served += cost
        flow.taken += 1
        flow.recent.charge(now, cost)
        if flow.quotas:
            if len(flow.unsent) > _UNSENT_KEPT:  # taken and never sent (expired, withdrawn): forgotten
                flow.unsent.clear()
            flow.unsent[req.id] = [q.window.charge(now, self.amount(req, q.unit)) for q in flow.quotas]

    def sent(self, req: Request, at: float) -> None:
        """`req` (taken) was sent at `at`: its quota charges count from then, as the server counts
        them from its arrival; a charge at the take would leave the window before the send's."""
        flow = self._flow(req)
        if flow.unsent:
            for entry in flow.unsent.pop(req.id, ()):
                if at > entry[0]:
                    entry[0] = at

    def popleft(self, now: float) -> Request | None:
        req = self.first(now)
        if req is not None:
            self.take(req, now)
        return req

    def expired(self, now: float) -> list[Request]:
        """Every queued request whose deadline has passed, taken out (each flow is in creation
        order, so each scan stops at its first live request)."""
        dead: list[Request] = []
        for flow in self.flows:
            queue = flow.queue
            while queue and queue[0].deadline <= now:
                dead.append(queue.popleft())
        self._n -= len(dead)
        return dead

    def next_free_at(self, now: float) -> float | None:
        """When the first flow held by its quota may go (None: none is held)."""
        when = math.inf
        for flow in self.flows:
            if flow.quotas and flow.queue and self._held(flow, now):
                head = flow.queue[0]
                for q in flow.quotas:
                    when = min(when, max(now, q.window.free_at(now, self.amount(head, q.unit))))
        return None if when == math.inf else when

    # ------------------------------------------------------------ refusing
    def refusal(self, req: Request, now: float) -> QuotaRefusal | None:
        """For a flow that refuses past its quota: the quota `req` would pass, counting what
        its flow already has queued, and when it frees (None: it fits)."""
        flow = self._flow(req)
        if not flow.spec.refuse or not flow.quotas:
            return None
        for q in flow.quotas:
            amount = self.amount(req, q.unit)
            queued = sum(self.amount(r, q.unit) for r in flow.queue)
            window = q.window
            if not window.fits(now, amount + queued):
                at = window.free_at(now, amount + queued)
                if at == math.inf:  # more than the quota alone, or queued work holds it: a window
                    at = now + window.window_s
                return QuotaRefusal(q.name, window.limit, max(0.0, at - now))
        return None

    # ------------------------------------------------------------ what is shown
    def rows(self, now: float) -> list[FlowStats]:
        total = 0.0
        for flow in self.flows:
            flow.recent.expire(now)
            total += flow.recent.used
        return [
            FlowStats(
                name=f.spec.name,
                priority=str(f.spec.priority),
                weight=f.weight,
                waiting=len(f.queue),
                taken=f.taken,
                served=f.served,
                share=(f.recent.used / total) if total > 0 else 0.0,
                quotas=tuple((q.name, q.window.limit, q.window.left(now)) for q in f.quotas),
            )
            for f in self.flows
        ]


class FlowStats(NamedTuple):
    """One flow as shown: its waiting requests, what it was served (binding units; its share of
    the last minute's), and each quota's limit and what is left of it now."""

    name: str
    priority: str
    weight: float
    waiting: int
    taken: int
    served: float
    share: float
    quotas: tuple[tuple[str, float, float], ...]


def _start_tag(flow: Flow) -> float:
    return flow.start
