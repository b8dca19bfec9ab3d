"""A unit of work and where it can end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ratedeck.core.vocab import Ending

#: Called once with (request, ending) when a request reaches its final place.
DoneCallback = Callable[["Request", Ending], None]
#: A library caller's own coroutine function, run with the key's secret (`RateDeck.run`).
CallFn = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Shape:
    """How one request differs from the target's defaults (a workload line's `_method`, `_path`, ...)."""

    method: str | None = None
    path: str | None = None  # joined to the target URL
    body: str | None = None  # "form" or "json"
    weight: int = 1  # what it costs in weight budgets
    budgets: tuple[str, ...] = ()  # named budgets it also spends from


class Request:
    """One request, from generation to its single final place.

    Times are engine clock seconds. `attempts` counts sends; `eligible_at`
    holds a retry back until its backoff has passed. `params` are what the
    target receives; `call` is a library caller's function, never sent.
    """

    __slots__ = (
        "id",
        "created_at",
        "deadline",
        "attempts",
        "eligible_at",
        "last_status",
        "last_error",
        "params",
        "call",
        "on_done",
        "pool",
        "result",
        "cancelled",
        "ending",
        "intended_at",
        "first_sent_at",
        "last_sent_at",
        "shape",
        "idempotency_key",
    )

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
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.params = params
        self.call = call
        self.on_done = on_done
        self.pool = pool  # the connection pool this request needs, if pools are configured
        self.result: Any = None  # the last Outcome (what a library caller gets)
        self.cancelled = False  # the caller gave up: never send it again (ends as shed)
        self.ending: Ending | None = None  # set once, when it reaches its final place
        # When it should have arrived (a fixed arrival rate's schedule, a message's
        # arrival), so latency counts time a stalled source held it back.
        self.intended_at = created_at if intended_at is None else intended_at
        self.first_sent_at: float | None = None
        self.last_sent_at: float | None = None  # the latest attempt's slot stamp
        self.shape: Shape | None = None  # method, path, body, weight, budgets when not the target's own
        self.idempotency_key: str | None = None  # made once per logical request, kept across retries

    def __lt__(self, other: Request) -> bool:  # heap order for the DLQ
        return (self.eligible_at, self.id) < (other.eligible_at, other.id)
