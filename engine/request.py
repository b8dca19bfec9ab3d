"""A unit of work and where it can end."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ratedeck.core.vocab import Ending

#: Called once with (request, ending) when a request reaches its final place.
DoneCallback = Callable[["Request", Ending], None]
#: A library caller's own coroutine function, run with the key's secret (`RateDeck.run`).
CallFn = Callable[[str], Awaitable[Any]]


#: A workload line's own underscore fields a results line gives back as `line` (beside
#: `params` and `pool`, the line again: `ratedeck replay` sends it).
LINE_FIELDS = ("_id", "_method", "_path", "_body", "_weight", "_budget")


#: How `Request.last_error` begins for a request no endpoint of the pool serves (its model):
#: it ends at once, never sent; a gateway answers it as the API answers an unknown model.
UNSERVED = "no endpoint serves it"


@dataclass(frozen=True, slots=True)
class Shape:
    """How one request differs from the target's defaults (a workload line's `_method`, `_path`, ...).

    `body` is "form" or "json" (the parameters, encoded so), or a JSON object or array: the
    body itself, sent as it is (`payload`, its bytes, encoded once when the line is read).
    A dict body is left out of the hash (`hash=False`), so a Shape stays hashable;
    nothing hashes one today.
    """

    method: str | None = None
    path: str | None = None  # joined to the target URL
    body: str | dict[str, Any] | list[Any] | None = field(default=None, hash=False)
    weight: int = 1  # what it costs in weight budgets
    budgets: tuple[str, ...] = ()  # named budgets it also spends from
    payload: bytes | None = field(default=None, compare=False, repr=False)  # an object body's JSON
    # Extra request headers sent as they are (a gateway client's content-type, anthropic-version,
    # Idempotency-Key...): after the transport's own, never over the key, auth or signing headers.
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def verbatim(self) -> bool:
        """Whether the body is the line's own JSON (an object or array), sent as it is."""
        return isinstance(self.body, dict | list)

    @staticmethod
    def encode(body: dict[str, Any] | list[Any]) -> bytes:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class _Sent:
    """What a request holds once sent or ended; none of it while it waits in a queue."""

    __slots__ = (
        "first_sent_at",
        "last_sent_at",
        "last_status",
        "last_error",
        "result",
        "ending",
        "key",
        "unsure",
        "request_id",
        "stamps",
    )

    def __init__(self) -> None:
        self.stamps: tuple[Any, ...] = ()  # the latest attempt's slot stamps (`limiter.Stamp`)
        self.first_sent_at: float | None = None
        self.last_sent_at: float | None = None  # the latest attempt's slot stamp
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.result: Any = None  # the last Outcome (what a library caller gets)
        self.ending: Ending | None = None  # set once, when it reaches its final place
        self.key: str | None = None  # the label of the key of its latest attempt
        self.unsure = False  # an attempt may have written without us knowing (see Ending.UNCERTAIN)
        self.request_id: str | None = None  # the server's id of the attempt that made it unsure


class _Extra:
    """What only some requests carry: a pool, a shape, a library caller's hooks, a key."""

    __slots__ = (
        "cancelled",
        "call",
        "on_done",
        "pool",
        "shape",
        "idempotency_key",
        "pin",
        "units",
        "line_id",
        "answer",
        "leasing",
        "flow",
    )

    def __init__(self) -> None:
        self.cancelled = False  # the caller gave up: never send it again (ends as shed)
        self.call: CallFn | None = None
        self.on_done: DoneCallback | None = None
        self.pool: str | None = None  # the connection pool this request needs, if pools are configured
        self.shape: Shape | None = None  # method, path, body, weight, budgets when not the target's own
        self.idempotency_key: str | None = None  # made once per logical request, kept across retries
        # The label of the only key that may send it: a workload line's `_key`, or the key
        # that first sent its Idempotency-Key (keys are scoped to an account).
        self.pin: str | None = None
        self.units: dict[str, int] | None = None  # its estimated tokens, once a token budget asked
        self.line_id: str | int | None = None  # a workload line's `_id`: never sent, kept for results
        # The `ports.AnswerSink` of a live client (the gateway): a streamed answer goes to it as it
        # arrives, and the outcome keeps the raw answer (`Outcome.headers`, `Outcome.body`).
        self.answer: Any = None
        # With a shared store: the lease holder (`LeasedSlots`) of the key that asked the store
        # for this request's slot. The other keys leave it to that key while its fetch runs or
        # its lease waits, so one request never costs two keys a slot.
        self.leasing: Any = None
        # Its flow's index in the run's flows (`EngineSettings.flows`: a gateway client's
        # priority, weight and quotas, engine/flows.py); 0 with none.
        self.flow = 0


#: The side objects of a request that has none of its own: every read of a side attribute
#: finds the default there; they are never written (`_side` makes a request its own first).
_UNSENT = _Sent()
_PLAIN = _Extra()


def _side(holder: str, shared: Any, name: str) -> Any:
    """A request attribute kept in a side object (`_Sent` or `_Extra`), made when the
    attribute is first set to something other than its default. A queued request
    holds neither (it points at the shared `_UNSENT` and `_PLAIN`).

    Both halves are measured, not tricks kept out of habit:
    - the side objects keep a queued request within the memory target (a million queued,
      under 250 bytes each, `tests/engine/test_lean.py`): 216 bytes a request with them,
      360 with the 20 attributes as slots of `Request` itself (the test's tracemalloc count);
    - the getter is `operator.attrgetter` (C, no Python frame): these are read several times
      per request on the path, writes are fewer. A plain Python getter in its place costs
      4.7% more opcodes per request on the openai run (47,001 -> 49,197) and 0.7% on the study
      run (9,520 -> 9,590) of `python -m tests.perf.opcodes`."""
    kind, default = type(shared), getattr(shared, name)

    def put(obj: Any, value: Any) -> None:
        side = getattr(obj, holder)
        if side is shared:
            if value is default:
                return
            side = kind()
            setattr(obj, holder, side)
        setattr(side, name, value)

    return property(attrgetter(f"{holder}.{name}"), put)


class Request:
    """One request, from generation to its single final place.

    Times are engine clock seconds. `attempts` counts sends; `eligible_at`
    holds a retry back until its backoff has passed. `params` are what the
    target receives; `call` is a library caller's function, never sent.
    Attributes most queued requests never set live in side objects (`_side`, which says
    why, with the measurements).
    """

    __slots__ = (
        "id",
        "created_at",
        "deadline",
        "attempts",
        "eligible_at",
        "params",
        "intended_at",
        "_sent",
        "_extra",
    )

    first_sent_at = _side("_sent", _UNSENT, "first_sent_at")
    last_sent_at = _side("_sent", _UNSENT, "last_sent_at")
    last_status = _side("_sent", _UNSENT, "last_status")
    last_error = _side("_sent", _UNSENT, "last_error")
    result = _side("_sent", _UNSENT, "result")
    ending = _side("_sent", _UNSENT, "ending")
    key = _side("_sent", _UNSENT, "key")
    unsure = _side("_sent", _UNSENT, "unsure")
    request_id = _side("_sent", _UNSENT, "request_id")
    cancelled = _side("_extra", _PLAIN, "cancelled")
    call = _side("_extra", _PLAIN, "call")
    on_done = _side("_extra", _PLAIN, "on_done")
    pool = _side("_extra", _PLAIN, "pool")
    shape = _side("_extra", _PLAIN, "shape")
    idempotency_key = _side("_extra", _PLAIN, "idempotency_key")
    pin = _side("_extra", _PLAIN, "pin")
    units = _side("_extra", _PLAIN, "units")
    line_id = _side("_extra", _PLAIN, "line_id")
    answer = _side("_extra", _PLAIN, "answer")
    leasing = _side("_extra", _PLAIN, "leasing")
    flow = _side("_extra", _PLAIN, "flow")

    def __init__(
        self,
        id: int,
        created_at: float,
        deadline: float,
        params: dict[str, Any] | None = None,
        on_done: DoneCallback | None = None,
        pool: str | None = None,
        call: CallFn | None = None,
        intended_at: float | None = None,
    ):
        self.id = id
        self.created_at = created_at
        self.deadline = deadline
        self.attempts = 0
        self.eligible_at = created_at
        self.params = params
        # When it should have arrived (a fixed arrival rate's schedule, a message's
        # arrival), so latency counts time a stalled source held it back.
        self.intended_at = created_at if intended_at is None else intended_at
        self._sent = _UNSENT
        self._extra = _PLAIN
        if call is not None:
            self.call = call
        if on_done is not None:
            self.on_done = on_done
        if pool is not None:
            self.pool = pool

    def mark_sent(self, at: float, key: str, stamps: tuple[Any, ...] = ()) -> bool:
        """An attempt sent at `at` on key `key` with its slots' `stamps`; True when it is the
        first. The send path's side attributes set in one call, not a descriptor call each."""
        sent = self.sent_state()
        sent.last_sent_at = at
        sent.key = key
        sent.stamps = stamps
        if sent.first_sent_at is None:
            sent.first_sent_at = at
            return True
        return False

    def head_in(self) -> None:
        """Its latest attempt's answer has begun (a stream's head is in): the request reached
        the server, so its slots are not held for the rest of the answer (`limiter._Sliding`)."""
        for stamp in self.sent_state().stamps:
            stamp.out = False

    def live_answer(self) -> Any:
        """`answer` (its live client's sink, or None)."""
        return self._extra.answer

    def sent_state(self) -> _Sent:
        """Its own `_Sent`, made now if it has none (never the shared `_UNSENT`): the hot path
        sets several of a sent request's attributes at once through it (`mark_sent`, `_settle`),
        not one property call each."""
        sent = self._sent
        if sent is _UNSENT:
            sent = self._sent = _Sent()
        return sent

    def __lt__(self, other: Request) -> bool:  # heap order for the DLQ
        return (self.eligible_at, self.id) < (other.eligible_at, other.id)


def line_fields(req: Request) -> dict[str, Any]:
    """The underscore fields of `req`'s workload line that made it (`LINE_FIELDS`), as written."""
    out: dict[str, Any] = {}
    if req.line_id is not None:
        out["_id"] = req.line_id
    shape = req.shape
    if shape is not None:
        if shape.method is not None:
            out["_method"] = shape.method
        if shape.path is not None:
            out["_path"] = shape.path
        if shape.body is not None:
            out["_body"] = shape.body
        if shape.weight != 1:
            out["_weight"] = shape.weight
        if shape.budgets:
            out["_budget"] = list(shape.budgets)
    return out
