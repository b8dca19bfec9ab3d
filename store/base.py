"""The store contract: where work and its endings live when a run must outlive its process.

A `WorkStore` holds jobs (workload lines) in one of four states:

- pending: enqueued, not yet claimed (`uncertain` may be set: see below);
- claimed: handed to a running member (a process working the store) by `claim`;
  a store that can (SQLite) also keeps whether the member marked it *sending*
  (`mark_sending`, written before the job may go out): a killed member's claimed
  jobs that were never marked go back to pending on `recover`, as they were;
- done: `finish` journaled its ending (`Ending`: succeeded, uncertain, expired, graveyard, shed);
- uncertain: claimed by a member that went away (killed) after it may have sent
  the job, on a target with no Idempotency-Key; sending it again could do the work
  twice, so it is reported, never silently re-sent or dropped.

`recover` is how a run takes back the jobs a dead member held (a member that still
beats, `beat`, is at work: its jobs are left to it): with `retry` (the
target has an Idempotency-Key) they go back to pending with `uncertain` set and
are sent again with the same key (`Job.key`), which the server deduplicates;
without it they become uncertain.

The engine never calls a store on its hot path: a store-backed source claims
jobs in batches and a journal writer records endings in batches
(`ratedeck.store.work`). Every method is a coroutine so a networked store can
await its server; a local store may simply do the work.

Implementations: `memory` (no store at all: the engine's own queues, the
default), `sqlite:PATH` (`sqlite.py`, durable on one machine), `redis://...`
(`redis.py`, shared by many processes). `open_store(url)` (`open.py`) picks
one; this module holds only the interface and its plain data.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratedeck.core.errors import RatedeckError
from ratedeck.core.vocab import Ending
from ratedeck.engine.ports import SharedState

#: How often a run says it is still at work on its store (`WorkStore.beat`).
BEAT_S = 0.5
#: A member whose last beat is this old is gone; one that beat more lately is watched this
#: long at most, to see whether it beats again (`SqliteStore.recover`).
GONE_S = 2.0


class StoreError(RatedeckError, ValueError):
    """A store that cannot be used (bad URL, unwritable path, a file that is not ours).

    `str()` is one line fit to show a user, the problem alone (the caller names the
    store: `--store: URL: problem`); the CLI prints it and exits 2.
    """


@dataclass(frozen=True, slots=True)
class Job:
    """One workload line handed to a member.

    `item` is the line's object as `ratedeck enqueue` read it (parameters plus
    `_pool`, `_method`, ... as in a workload file). `key` is stable for the job
    across runs and processes: it is the job's Idempotency-Key. `attempts`
    counts the claims before this one; `uncertain` says an earlier claim may
    have sent it (its member died).
    """

    id: int
    item: Mapping[str, Any]
    key: str
    attempts: int = 0
    uncertain: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """A job's ending, as the journal writer hands it to `finish`.

    `record` is the graveyard line (`engine.queues.Graveyard`'s shape, keys
    masked) for a buried job, None otherwise.
    """

    job_id: int
    ending: Ending
    attempts: int = 0
    record: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """How many jobs are in each state; `done` by ending."""

    pending: int = 0
    claimed: int = 0
    uncertain: int = 0
    done: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.pending + self.claimed + self.uncertain + sum(self.done.values())


class WorkStore(abc.ABC):
    """Jobs and their endings, durable as the implementation promises.

    `url` is how the user named it, safe to print (no password).
    """

    url: str

    @abc.abstractmethod
    async def enqueue(self, items: Sequence[Mapping[str, Any]]) -> int:
        """Add `items` as pending jobs, all or none (one transaction); returns how many."""

    @abc.abstractmethod
    async def claim(self, member: str, n: int) -> list[Job]:
        """Up to `n` pending jobs, oldest first, now claimed by `member`."""

    @abc.abstractmethod
    async def finish(self, member: str, endings: Sequence[Finished]) -> None:
        """Journal the endings of jobs `member` claimed, in one durable step.

        A buried job's `record` is kept with it (`graveyard_lines`), so no
        graveyard line is lost when the process is killed after this returns.
        """

    @abc.abstractmethod
    async def release(self, member: str, job_ids: Sequence[int]) -> None:
        """Give back claimed jobs that were never sent (a clean stop): pending again, as they were."""

    @abc.abstractmethod
    async def recover(self, member: str, *, retry: bool) -> int:
        """Take back every job claimed by a member other than `member` (a killed run), but
        not a member still at work (`beat`): its jobs would be sent twice.

        With `retry` they become pending and uncertain (sent again with the
        same `Job.key`), else uncertain. Returns how many.
        """

    async def mark_sending(self, member: str, job_ids: Sequence[int]) -> None:  # noqa: B027
        """Mark claimed jobs as about to be sent, in one durable step, before any of them goes.

        `recover` makes only marked jobs uncertain (or sends them again with their key);
        a claimed job never marked was never sent and goes back to pending. A store that
        does not keep the mark (the default) treats every claimed job as marked."""

    async def beat(self, member: str) -> None:  # noqa: B027
        """Say `member` is still at work (its journal does every `BEAT_S`): `recover` leaves a
        member that beats alone. A store that keeps no beats (the default) has its own way, or
        none: Redis takes only entries idle past their claim's timeout."""

    async def leave(self, member: str) -> None:  # noqa: B027
        """`member` stopped cleanly: a --resume need not wait to see whether it still beats."""

    async def save_windows(self, member: str, windows: Mapping[str, Sequence[float]]) -> None:  # noqa: B027
        """Keep each key's recent send times (Unix seconds, by key fingerprint), replacing the
        last ones: a resumed run starts each key's limiter from the dead run's last window."""

    async def load_windows(self) -> dict[str, tuple[float, list[float]]]:
        """What `save_windows` kept: fingerprint -> (when it was saved, send times)."""
        return {}

    @abc.abstractmethod
    async def counts(self) -> StoreCounts: ...

    @abc.abstractmethod
    async def graveyard_lines(self) -> list[dict[str, Any]]:
        """The graveyard records `finish` journaled, in the order they were buried."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    #: Members `recover` found still at work (`beat`): their jobs were left to them.
    at_work: tuple[str, ...] = ()

    #: Jobs this process had claimed when the store lost its state (a restart with nothing kept):
    #: gone from the store, so their endings can no longer be accounted for there.
    lost_claims: int = 0

    async def persistence(self) -> str | None:
        """What a restart of the store keeps: None when that is not a question (a file, fsync'd),
        "none" when a restart loses the work, "unknown" when the server would not say."""
        return None

    def shared(self) -> SharedState | None:
        """What members share besides work (key budgets, gates, snapshots), if the store is
        shared by many processes (Redis); None for a store one process works alone."""
        return None


@dataclass(frozen=True)
class StoreReport:
    """What a store run adds to the summary and the report: plain data."""

    url: str
    counts: StoreCounts
    recovered: int  # jobs a killed run held, taken back by --resume
    retried_uncertain: bool  # they were sent again with their Idempotency-Key (else: uncertain)
    journaled: int  # endings of this run written to the store
    unjournaled: int  # endings of this run the store did not take (a write problem)
    problem: str | None = None  # the store failed at the end (counts are then empty)
    persistence: str | None = None  # what a restart of the store keeps (`WorkStore.persistence`)
    lost_claims: int = 0  # jobs this run had claimed when the store lost its state
    left_claimed: int = 0  # jobs another run held when this one started, not taken back (no --resume)
    at_work: tuple[str, ...] = ()  # runs a --resume found still at work: their jobs were left to them
