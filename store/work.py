"""Working a store with an engine, off the engine's hot path.

- `StoreWorkload` is the engine's `Source`: the plain `Workload` (rate,
  Poisson, `--total`, line shaping), fed by jobs it claims from the store a
  batch at a time, each request tied to its job.
- `Journal` is a finish watcher: it notes each ending in memory, and a task
  of its own writes them to the store in one transaction a tick (or sooner
  when `FLUSH_AT` are waiting), buried requests with their graveyard line.
- `StoreRun` puts the two around an engine: `--resume` first, a last
  journal flush and the give-back of never-sent jobs at the end.

What a kill -9 leaves behind is the store's claimed jobs. Before a job may go
out, the source marks it *sending* in the store (`WorkStore.mark_sending`),
group-committed for the few jobs just ahead of the limiter (`MARK_AHEAD_S` of
the keys' capacity), and keeps the queue no deeper than that: a killed run's
marked jobs are those in flight, queued, or ended in the last tick's unwritten
batch, a few more than were on the wire. `--resume` takes them back
(`WorkStore.recover`): sent again with the same Idempotency-Key when the target
has one, or as they are where a repeat does nothing twice (`target.safe_writes`,
an LLM prompt: its answer was lost with the run), else reported as uncertain; claimed jobs never marked go back to
pending, as they were. Nothing is sent twice without that key, and nothing is
dropped.

The journal also keeps each key's sends of its last window (`save_windows`,
every tick); a run on the same store starts each key's limiter from them
(`Engine.seed_sends`), so the first second after a restart brings no 429.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ratedeck.core.secrets import fingerprint, safe_url
from ratedeck.core.vocab import Arrival, Ending, EventKind, Pacing
from ratedeck.engine.settings import (
    ConfigError,
    EngineSettings,
)
from ratedeck.engine.sources.workload import LineRules, Workload, fed_depth

from .base import BEAT_S, Finished, Job, StoreCounts, StoreError, StoreReport, WorkStore
from .open import MEMORY, open_store

if TYPE_CHECKING:
    from ratedeck.engine.ports import JournalHost, SourceSink, StoreRunHost
    from ratedeck.engine.request import Request

__all__ = ["Journal", "StoreReport", "StoreRun", "StoreWorkload", "open_for_run"]

#: Endings waiting for the journal are written at once when this many pile up.
FLUSH_AT = 500
#: How often the journal writes what has ended (one transaction each time).
FLUSH_EVERY_S = 0.1
#: Most jobs claimed at once; a claim takes at most the main queue's size too, so few
#: jobs sit claimed but unsent (a kill -9 makes those uncertain).
CLAIM_MAX = 256
#: Jobs are marked sending (and queued) this far ahead of the keys' capacity: enough that a
#: mark's commit never starves the limiter, few enough that a kill -9 strands few.
MARK_AHEAD_S = 0.1
#: What a member says once when its store keeps nothing across a restart.
NOT_KEPT = (
    "keeps nothing across a restart (appendonly no, save ''): a restart loses every job, ending and budget;"
    " set appendonly yes"
)
#: At least this many are marked at once (one commit each time), at most `CLAIM_MAX`.
MARK_MIN = 4


class StoreChoice(Protocol):
    """The store's own two settings (the config layer's `RunnerSettings` has them)."""

    @property
    def store(self) -> str: ...  # memory, sqlite:PATH or redis://host:port/db

    @property
    def resume(self) -> bool: ...  # take back the jobs a killed run held


def open_for_run(choice: StoreChoice, cfg: EngineSettings) -> WorkStore | None:
    """The run's store (None: memory), its settings checked; `ConfigError` naming the problem.

    A store holds its own work: `--workload` goes in with `ratedeck enqueue`, and
    `[messages]` runs have no store yet. `--resume` needs a store that outlives a
    process.
    """
    shown = safe_url(choice.store) or choice.store
    if choice.store.strip() == MEMORY:
        if choice.resume:
            raise ConfigError(
                "command line",
                "--resume",
                "needs a durable store: --store sqlite:PATH or redis://host:port/db",
            )
        return None
    if cfg.workload.file:
        raise ConfigError(
            "command line",
            "--workload",
            f"a store run works the store's jobs; add the file with: ratedeck enqueue --store {shown} FILE",
        )
    if cfg.messages is not None:
        raise ConfigError("config", "messages", "message workloads cannot run from a store (yet)")
    try:
        return open_store(choice.store)
    except StoreError as exc:
        raise ConfigError("--store", shown, str(exc)) from None


class StoreWorkload(Workload):
    """A `Workload` whose items are jobs claimed from `store` by `member`.

    `jobs` maps the id of every request made and not yet ended to its job.
    With `idempotent` (the target sends an Idempotency-Key), a request's key
    is its job's, the same in every run.
    """

    def __init__(
        self,
        store: WorkStore,
        member: str,
        rate: float,
        *,
        batch: int,
        idempotent: bool,
        poisson: bool = False,
        total: int | None = None,
        rng: random.Random | None = None,
        fed: bool = False,
        depth: int | None = None,
        rules: LineRules | None = None,
    ):
        super().__init__(rate, poisson=poisson, total=total, rng=rng, fed=fed, depth=depth, rules=rules)
        self.store = store
        self.member = member
        self.batch = max(1, min(batch, CLAIM_MAX))
        self.idempotent = idempotent
        self.jobs: dict[int, Job] = {}
        self.claimed = 0
        self._buffer = _JobBuffer()
        self._claim: asyncio.Future[list[Job]] | None = None
        self.items = self._buffer
        self.marks = True  # every job is marked sending in the store before it is queued
        self._marked: set[int] = set()  # marked ahead, not yet queued
        self._unqueued: list[int] = []  # made, never queued (the run stopped during a mark)
        self.mark_problem: str | None = None

    @classmethod
    def for_store(
        cls, cfg: EngineSettings, rng: random.Random, store: WorkStore, member: str
    ) -> StoreWorkload:
        w = cfg.workload
        return cls(
            store,
            member,
            cfg.arrival_rate,
            batch=cfg.main_queue_max,
            idempotent=cfg.target.idempotency,
            poisson=w.arrival == Arrival.POISSON,
            total=w.total,
            rng=rng,
            fed=w.rate is None,  # a job: fed as fast as the limits allow, unless --rate
            depth=fed_depth(cfg),
            rules=LineRules.of(cfg),
        )

    async def refill(self) -> bool:
        # Shielded: a run stopped while a claim is under way must still learn which
        # jobs it claimed, to give them back (`unsent_of`).
        self._claim = asyncio.ensure_future(self.store.claim(self.member, self.batch))
        jobs = await asyncio.shield(self._claim)
        self._claim = None
        self.claimed += len(jobs)
        self._buffer.extend(jobs)
        return bool(jobs)

    def made(self, req: Request) -> None:
        """`req` was made from the job the buffer handed out last: tie it to that job."""
        job = self._buffer.last
        assert job is not None
        self.jobs[req.id] = job
        if self.idempotent:
            req.idempotency_key = job.key

    def unmade(self, req: Request) -> None:
        job = self.jobs.get(req.id)
        if job is not None:
            self._unqueue(req, job)

    async def before_submit(self, req: Request, sink: SourceSink) -> bool:
        """Mark `req`'s job sending (with the next few, one commit) before it may be sent.

        The queue is kept as deep as the jobs marked at once, so what a kill -9 leaves
        marked is what was in flight plus about `MARK_AHEAD_S` of the keys' capacity."""
        job = self.jobs[req.id]
        if job.id in self._marked:
            self._marked.discard(job.id)
            return True
        ahead = max(MARK_MIN, min(CLAIM_MAX, math.ceil(sink.live_capacity(sink.clock()) * MARK_AHEAD_S) + 1))
        self.depth = ahead
        # As many as the queue has room for now: marked jobs wait in the queue, not here.
        room = max(1, min(ahead, sink.queue_max) - sink.queues.fresh())
        ids = [job.id, *self._buffer.peek(room - 1)]
        try:
            while True:
                try:
                    await self.store.mark_sending(self.member, ids)
                    break
                except StoreError as exc:
                    if self.mark_problem is None:
                        self.mark_problem = f"cannot mark jobs sending: {exc}"
                        sink.problem(self.mark_problem)
                    if sink.stopping:
                        self._unqueue(req, job)
                        return False
                    await asyncio.sleep(0.25)
        except asyncio.CancelledError:
            # The run stopped during the mark: the request was made but is queued nowhere,
            # so the give-back at the end must name its job (else it stays "in flight").
            self._unqueue(req, job)
            raise
        self._marked.update(ids[1:])
        return True

    def _unqueue(self, req: Request, job: Job) -> None:
        """`req` will not be queued: its job goes back with the never-sent ones at the end."""
        self.jobs.pop(req.id, None)
        self._unqueued.append(job.id)

    async def unsent_of(self, never_sent: set[int]) -> list[int]:
        """The jobs claimed and never done: in a claim the stop cut short, still in the buffer,
        or made into one of the requests `never_sent` (queued, no attempt of it may have landed)."""
        ids = [job.id for job in await self._claim] if self._claim is not None else []
        ids += self._buffer.drain()
        ids += [self.jobs.pop(rid).id for rid in never_sent if rid in self.jobs]
        ids += self._unqueued
        return ids


class _JobBuffer(Iterator[dict[str, Any]]):
    """Claimed jobs, handed to the workload as item dicts one at a time; refilled by `refill`."""

    def __init__(self) -> None:
        self._jobs: list[Job] = []
        self._next = 0
        self.last: Job | None = None

    def extend(self, jobs: list[Job]) -> None:
        self._jobs = self._jobs[self._next :] + jobs
        self._next = 0

    def __next__(self) -> dict[str, Any]:
        if self._next >= len(self._jobs):
            raise StopIteration
        self.last = job = self._jobs[self._next]
        self._next += 1
        return dict(job.item)  # the workload pops _pool and the shaping fields from it

    def peek(self, n: int) -> list[int]:
        """The ids of the next `n` jobs (or fewer) the buffer will hand out."""
        return [job.id for job in self._jobs[self._next : self._next + max(0, n)]]

    def drain(self) -> list[int]:
        ids = [job.id for job in self._jobs[self._next :]]
        self._jobs, self._next = [], 0
        return ids


class Journal:
    """Writes every ending of the source's jobs to the store, a batch at a time."""

    def __init__(self, engine: JournalHost, source: StoreWorkload):
        self.engine = engine
        self.source = source
        self.store = source.store
        self.waiting: list[Finished] = []
        self.written = 0
        self.problem: str | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._windows: dict[str, list[float]] = {}  # the last ones saved
        self._lost_told = 0  # lost claims already told

    def finished(self, req: Request, ending: Ending) -> None:
        """The finish watcher: note the ending (no I/O here: this is the engine's path)."""
        job = self.source.jobs.pop(req.id, None)
        if job is None:
            return
        record = None
        if ending is Ending.GRAVEYARD:
            now = self.engine.clock()
            record = self.engine.graveyard.record(req, now, self.engine.wall_time(now) - now)
        self.waiting.append(Finished(job.id, ending, req.attempts, record))
        if len(self.waiting) >= FLUSH_AT:
            self._wake.set()

    def start(self) -> None:
        """Write what has ended every `FLUSH_EVERY_S`, or at once when `FLUSH_AT` wait."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal")

    async def stop(self) -> None:
        """Let a write under way finish (never cut one short), then write the rest."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()

    async def _run(self) -> None:
        beat_at = time.monotonic()
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY_S)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()
            self.note_lost()
            await self.save_windows()
            if time.monotonic() - beat_at >= BEAT_S:
                beat_at = time.monotonic()
                await self.beat()

    async def beat(self) -> None:
        """Say this run is still at work: a --resume leaves its jobs to it (`WorkStore.beat`)."""
        try:
            await self.store.beat(self.source.member)
        except StoreError:
            pass  # said again next beat; a resume meanwhile may take it for gone, as before beats

    async def save_windows(self) -> None:
        """Keep each key's sends of its last window in the store, when they changed."""
        windows = self.engine.recent_sends()
        if windows == self._windows:
            return
        try:
            await self.store.save_windows(self.source.member, windows)
        except StoreError:
            return  # tried again next tick; only a resume's first second depends on it
        self._windows = windows

    async def flush(self) -> None:
        if not self.waiting:
            return
        batch, self.waiting = self.waiting, []
        try:
            await self.store.finish(self.source.member, batch)
        except StoreError as exc:
            self.waiting = batch + self.waiting  # kept: tried again next tick
            if self.problem is None:
                self.problem = f"cannot journal endings: {exc}"
                self.engine.problem(self.problem)
            return
        self.written += len(batch)

    def note_lost(self) -> None:
        """Say (once per loss) how many claimed jobs a store that lost its state took with it."""
        lost = self.store.lost_claims
        if lost > self._lost_told:
            self.engine.problem(
                f"store {self.store.url} lost its state (restarted empty): {lost - self._lost_told} jobs"
                " this run had claimed are gone from it and can no longer be accounted for there"
            )
            self._lost_told = lost


#: How late a save of the windows may come on a busy machine: a kill -9 may have come this long
#: after the last one, not just the one tick the journal aims for (its writes take time too).
LATE_SAVE_S = 1.0


def last_sends(
    windows: dict[str, tuple[float, list[float]]],
    now: float,
    burst_limits: dict[str, list[tuple[int, float]]] | None = None,
) -> dict[str, list[float]]:
    """The sends a store kept per key, with what the run may have sent after it last saved.

    A kill -9 lost the sends since the last save: the journal saves every `FLUSH_EVERY_S`,
    but a busy machine may keep it waiting, so the kill may have come up to `LATE_SAVE_S`
    later (never after `now`). The lost sends count as made at that latest moment. At the
    key's pace they are two ticks' share of its last second, plus one; a key that sends in
    bursts (`burst_limits`: its limits and windows, by key) may have spent every slot its
    windows had free by then, the slots of sends that left a window included."""
    out: dict[str, list[float]] = {}
    for key, (saved_at, times) in windows.items():
        if not times:
            continue
        recent = [t for t in times if t > saved_at - 1.0]  # its pace over the last second
        lost = math.ceil(len(recent) * 2 * FLUSH_EVERY_S) + 1
        at = min(now, saved_at + LATE_SAVE_S)
        if burst_limits is not None and key in burst_limits:
            free = min(
                limit - sum(1 for t in times if t > at - window_s) for limit, window_s in burst_limits[key]
            )
            lost = max(lost, free)
        out[key] = [*times, *([at] * lost)]
    return out


class StoreRun:
    """An engine's source and journal on `store`, and what happens at its start and end."""

    def __init__(self, choice: StoreChoice, cfg: EngineSettings, store: WorkStore, rng: random.Random):
        self.cfg = cfg
        self.resume = choice.resume
        self.store = store
        self.member = f"run-{uuid.uuid4().hex[:12]}"
        self.source = StoreWorkload.for_store(cfg, rng, store, self.member)
        self.journal: Journal | None = None
        self.recovered = 0
        self.left_claimed = 0  # claimed by earlier runs, not taken back (no --resume)
        self.windows: dict[str, tuple[float, list[float]]] = {}  # the last run's sends, per key
        self.persistence: str | None = None  # what a restart of the store keeps (read at the start)

    @property
    def _retry(self) -> bool:
        """Whether jobs a killed run may have sent go out again on --resume: with the same
        Idempotency-Key, or where a repeat does nothing twice (an LLM prompt: `safe_writes`)."""
        t = self.cfg.target
        return t.idempotency or t.safe_writes

    async def prepare(self) -> None:
        """Before the engine starts: take back a killed run's jobs (--resume), or count them."""
        try:
            await self.store.beat(self.member)
            if self.resume:
                self.recovered = await self.store.recover(self.member, retry=self._retry)
            counts = await self.store.counts()
            if not self.resume or self.store.at_work:
                self.left_claimed = counts.claimed
            self.source.size = counts.pending  # the job's size as this run starts (its progress)
            self.windows = await self.store.load_windows()
            self.persistence = await self.store.persistence()
        except StoreError as exc:
            raise ConfigError("--store", self.store.url, str(exc)) from None

    def attach(self, engine: StoreRunHost) -> None:
        """Watch the engine's endings; start the journal's writer on the running loop."""
        self.journal = Journal(engine, self.source)
        engine.watch(self.journal)
        burst = None
        if engine.pacing is Pacing.BURST:
            burst = {
                (fingerprint(k.secret) or k.label): [(p.limit, p.window_s) for p in k.policies]
                for k in self.cfg.keys
                if k.policies  # a limit not told yet: learned from the server, by pace meanwhile
            }
        seeded = engine.seed_sends(last_sends(self.windows, time.time(), burst))
        if seeded:
            engine.event(EventKind.INFO, f"each key starts from the last run's window: {seeded} sends")
        self.journal.start()
        if self.persistence == "none":
            engine.problem(f"store {self.store.url}: {NOT_KEPT}")
        if self.recovered:
            t = self.cfg.target
            what = (
                "sent again with the same Idempotency-Key"
                if t.idempotency
                else "sent again (target.safe_writes: a repeat does nothing twice)"
                if t.safe_writes
                else "not sent again: reported uncertain"
            )
            engine.event(
                EventKind.INFO, f"resumed: {self.recovered} jobs in flight when the last run stopped, {what}"
            )
        elif self.left_claimed and not self.store.at_work:
            engine.event(
                EventKind.INFO,
                f"{self.left_claimed} jobs are claimed by another run (killed? --resume takes them back)",
            )
        if self.store.at_work:
            engine.event(
                EventKind.INFO,
                f"{self.left_claimed} jobs are held by a run still at work on {self.store.url}"
                f" ({', '.join(self.store.at_work)}): left to it, or they would be sent twice",
            )

    async def finish(self, engine: StoreRunHost | None) -> StoreReport:
        """After the engine stopped: write the last endings, give back jobs never sent, close."""
        journal = self.journal
        counts, problem = StoreCounts(), None
        try:
            if journal is not None:
                await journal.stop()
            if engine is not None:
                queued = engine.queued()
                # a request still queued was never sent, or every attempt was answered with a
                # definite "not done" (a refused key, a 429): its job goes back to pending
                await self.store.release(
                    self.member, await self.source.unsent_of({r.id for r in queued if not r.unsure})
                )
            await self.store.leave(self.member)
            counts = await self.store.counts()
        except StoreError as exc:
            problem = str(exc)
        finally:
            await self.store.close()
        return StoreReport(
            url=self.store.url,
            counts=counts,
            recovered=self.recovered,
            retried_uncertain=self._retry,
            journaled=journal.written if journal is not None else 0,
            unjournaled=len(journal.waiting) if journal is not None else 0,
            problem=problem or (journal.problem if journal is not None else None),
            persistence=self.persistence,
            lost_claims=self.store.lost_claims,
            left_claimed=self.left_claimed,
            at_work=self.store.at_work,
        )
