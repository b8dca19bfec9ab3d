"""A unit of work and where it can end."""

from __future__ import annotations


class Request:
    """One request, from generation to its single final place.

    Times are engine clock seconds. `attempts` counts sends; `eligible_at`
    holds a retry back until its backoff has passed.
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
        "on_done",
        "pool",
        "result",
        "cancelled",
    )

    def __init__(
        self,
        id: int,
        created_at: float,
        deadline: float,
        params: dict | None = None,
        on_done=None,
        pool: str | None = None,
    ):
        self.id = id
        self.created_at = created_at
        self.deadline = deadline
        self.attempts = 0
        self.eligible_at = created_at
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.params = params
        # called once with (request, outcome_name) when the request reaches its final place
        self.on_done = on_done
        self.pool = pool  # the connection pool this request needs, if pools are configured
        self.result = None  # the last outcome (what a library caller gets)
        self.cancelled = False  # the caller gave up: never send it again (ends as shed)

    def __lt__(self, other: Request) -> bool:  # heap order for the DLQ
        return (self.eligible_at, self.id) < (other.eligible_at, other.id)
