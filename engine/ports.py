"""The engine's ports: every narrow interface between the engine's parts and what plugs into them.

The composition root (`build.py`) hands each part the few of these it uses,
never the `Engine` itself:

- the run's clock and state: `RunClock` (the loop, its clock, the phase), shared by every part;
- the wire: `Transport` (and `ProbeGet`, a transport's own way to time the probe);
- a work source: `Source` (what the engine calls) and `SourceSink` (what it may call,
  the intake), with what it reads of the queues (`SourceQueues`);
- a key worker: `WorkerHost` (the request path: launch, expire, shed) and `WorkerQueues`;
  the key as the request path sees it after an answer: `KeySide` (learn, carry out, wake);
- the request path's ends: `Endings` (the run's end receives a request's end),
  `EventSink`, `ProblemSink`, `Burial` (where the intake ends a request at once),
  `GateWatcher` and `BudgetWatcher` (a cluster member told what the path learned),
  `Cooldown` (how a server's delay is honoured);
- watchers of finished requests (a results file, a store's journal): `FinishWatcher`,
  registered through `Watched`, with what they may read (`JournalHost`, `ResultsHost`,
  `StoreRunHost`);
- a shared store: `SharedState` (with `Ask`, `Grant`, `Poll`, `StoreUnavailable`), and
  what a cluster member reads of the run (`Pace`, `RunCounts`, `Depths`);
- the makespan meter's view of the keys: `MeterHost`;
- a live client waiting for a request's answer (the gateway): `AnswerSink`.

This module imports no implementation: only `ratedeck.core` and the engine's
plain data types (`request`, `snapshot`, `gate`; the rest for type checking
only). import-linter holds it (pyproject.toml), so the engine's modules can
all import it and no import circle runs through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ratedeck.core.errors import RatedeckError
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import Ending, EventKind, Pacing, Phase
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.snapshot import ClusterView, ErrorRow, MessageStats

from .request import CallFn, Request

if TYPE_CHECKING:
    from ratedeck.engine.flows import FlowQueue
    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.path.settle import Verdict
    from ratedeck.engine.settings import KeySpec

#: A key worker, as the request path knows it (the path's own implementation picks the type).
W_contra = TypeVar("W_contra", contravariant=True)

#: A transport's own way to time the probe endpoint: the answer's status.
ProbeGet = Callable[[], Awaitable[int]]


# ---------------------------------------------------------------- queues, as their users see them


class SourceQueues(Protocol):
    """What a source reads of the engine's queues: their depth, and a wait for room."""

    @property
    def main(self) -> Sized: ...

    #: The flows' queue (gateway clients: engine/flows.py), None for one first-come queue.
    flows: FlowQueue | None

    def __len__(self) -> int: ...

    def fresh(self) -> int:
        """Fresh work waiting, shared and pinned to a key: what backpressure bounds."""

    async def wait_space(self, limit: int) -> None: ...


class Admission(Protocol):
    """A decision on one queued request (`path/admit.py`'s `Send`, `Hold`, `Pass`), as the
    queue reads it: `take` the request now, or `stop` looking past it (what holds it holds
    every request behind it)."""

    @property
    def take(self) -> bool: ...

    @property
    def stop(self) -> bool: ...


#: The decisions a key worker's admission returns.
AdmissionT = TypeVar("AdmissionT", bound=Admission)


class WorkerQueues(Protocol):
    """What a key worker does with the engine's queues: take the next request (the head, or
    the first its admission takes), wait for work, pass a wake on."""

    def __len__(self) -> int: ...

    def pop_ready(self, now: float, key: str | None = None) -> Request | None: ...

    def pick(
        self, now: float, choose: Callable[[Request], AdmissionT], key: str | None = None
    ) -> tuple[Request, AdmissionT] | None: ...

    def pass_on(self) -> None: ...

    def add_getter(self, fut: asyncio.Future[None]) -> None: ...


class SendStamp(Protocol):
    """A slot's grant (`limiter.Stamp`): its send time, and the headroom it needs once answered."""

    t: float
    extra: float | None
    out: bool


# ---------------------------------------------------------------- the wire


class Transport(Protocol):
    """Sends one attempt of `req` with `key` and `nonce`, never raising for network trouble.

    `stats()` and `prober()` are the optional parts, present in every transport:
    subclass `http.transport.TransportBase` for their defaults (no counts, the engine's own probe).
    """

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome: ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """What came back, counted, for the run's summary: plain data, safe to print ({}: not counted)."""
        ...

    def prober(self) -> ProbeGet | None:
        """The transport's own way to time `target.probe_url` (a simulated network); None: the
        engine's probe sends a plain GET (engine/http/probe.py)."""
        ...


# ---------------------------------------------------------------- sources


class SourceSink(Protocol):
    """What a work source may do with the engine: make, submit and refuse requests."""

    loop: asyncio.AbstractEventLoop | None
    backpressure: bool
    queue_max: int
    stopping: bool

    @property
    def queues(self) -> SourceQueues: ...

    def clock(self) -> float: ...

    def new_request(
        self,
        params: dict | None = None,
        pool: str | None = None,
        ttl_s: float | None = None,
        call: CallFn | None = None,
        intended_at: float | None = None,
    ) -> Request: ...

    def submit(self, req: Request) -> None:
        """Accept a new request into the main queue."""

    def refuse(self, req: Request) -> None:
        """Count a new request that never entered the queue (no room): it ends as shed."""

    def withdraw(self, req: Request) -> bool:
        """Take a queued request whose caller gave up out of the queue; it ends as shed.
        False when it is not queued (in flight or ended): then it is only never sent again."""

    def source_done(self) -> None:
        """The source will make nothing more; the run may finish when the queues empty."""

    @property
    def spend_gate(self) -> bool:
        """Whether a job's source must ask `admit_spend` before queueing a request."""

    async def admit_spend(self, req: Request) -> bool:
        """Reserve `req`'s cost within the cost cap; False when the cap is reached (stop making)."""

    def live_capacity(self, now: float) -> float:
        """Requests per second the keys that can send now allow."""

    def next_gate_open(self, now: float) -> float | None:
        """When the next closed gate of a usable key opens, if one is closed."""

    def wall_time(self, t: float) -> float:
        """Engine clock seconds as Unix time, for files people read."""

    def problem(self, text: str) -> None:
        """Report something the run could not do (a file not written): shown once, fails the run."""

    def event(self, kind: EventKind, text: str) -> None: ...


class Source(Protocol):
    """Where requests come from: a generator, a file, messages of several calls."""

    rate: float
    exhausted: bool
    fed: bool  # a job fed as fast as the limits allow: no arrival rate, the queue kept full
    # Live clients' requests (the gateway's): theirs, so no file holds them unless the user names
    # one (no graveyard by default); a run's own work (a file, a store, a stream) is the user's.
    clients: bool

    @property
    def job(self) -> bool:
        """Whether the work is a job (a file's lines, a store's jobs), not a generated stream."""

    @property
    def job_total(self) -> int | None:
        """How many requests the work holds in all, when known (a file's lines, a store's pending
        jobs, `--total`): a snapshot's `progress`; None for endless work."""

    @property
    def job_models(self) -> dict[str, int] | None:
        """How many of the work's requests name each model lane, when counted (a file's lines,
        with limits per model): the ETA's least time; None when not known."""

    def set_rate(self, rate: float) -> None: ...

    def set_throttle(self, value: str | float) -> None:
        """Raises ValueError where the source has no entry throttle."""

    def poke(self) -> None: ...

    async def run(self, sink: SourceSink) -> None: ...

    def close_second(self) -> None:
        """Once a second: roll per-second series, flush files."""

    def stats(self, elapsed_s: float) -> MessageStats | None:
        """The source's part of a snapshot (None for plain requests)."""


# ---------------------------------------------------------------- the request path


class RunClock:
    """The run's clock and state, shared by every part: the loop and its clock once the
    engine starts (`Engine.start`), and whether it is stopping. Parts read it; only the
    engine's lifecycle writes it."""

    __slots__ = ("loop", "clock", "started_at", "wall_offset", "stopping", "phase", "ended_at")

    def __init__(self, clock: Callable[[], float], wall_offset: float = 0.0) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clock = clock
        self.started_at = 0.0
        self.wall_offset = wall_offset  # Unix time less the clock (measured again at the start)
        self.stopping = False
        self.phase = Phase.STARTING
        self.ended_at: float | None = None

    def wall_time(self, t: float) -> float:
        """Clock seconds as Unix time, for files people read."""
        return t + self.wall_offset


class WorkerHost(Protocol[W_contra]):
    """What a key worker launches into: the request path (launch, expire, shed, its pools)."""

    @property
    def pool_ok(self) -> Callable[[str | None], bool] | None: ...

    def launch(
        self, worker: W_contra, req: Request, nonce: int | None, stamps: tuple[SendStamp, ...]
    ) -> None:
        """Send one attempt of `req` (the worker has counted it)."""

    def expire(self, req: Request) -> None: ...

    def shed(self, req: Request) -> None: ...


class KeySide(Protocol):
    """The key that sent an attempt, as the request path sees it (`path/worker.py`'s `KeyWorker`):
    who it is, and its two steps after the answer. The path reaches no further into the key
    (its limits, counts, gates), and the key calls the path only to launch (`WorkerHost`)."""

    @property
    def spec(self) -> KeySpec:
        """What the transport sends with."""

    @property
    def label(self) -> str: ...

    @property
    def masked(self) -> str: ...

    def answered(
        self, outcome: Outcome, req: Request, stamps: tuple[SendStamp, ...], now: float
    ) -> tuple[str, bool, bool, float]:
        """The key takes the answer's facts (counts it, learns what it says of its limits) and
        returns what it knows for the verdict (`settle.decide`): its label, whether it was
        refused for good already, whether its limit explains the answer's 429, and how long it
        sits out for 429s in a row (seconds, 0: not at all)."""

    def carry_out(
        self, verdict: Verdict, req: Request, outcome: Outcome, error: ErrorRow | None
    ) -> CooldownGate | None:
        """The verdict's key part: count its tally (and `error`, a failure's row), block the key
        it refuses. Returns the key's gate its cooldown closes (the model's with limits per model);
        None when it closes none of the key's."""

    def wake_if_sooner(self, now: float) -> None:
        """The answer is carried out: wake the key's sender if it may send sooner now."""


class Endings(Protocol):
    """Where the request path hands a request that reached its final place: the run's end
    (`path/ending.py`'s `RunEnd`)."""

    def finish(self, req: Request, ending: Ending) -> None:
        """`req` ended (`ending` is its one final place): tell its caller and the watchers."""

    def key_refused(self) -> None:
        """A key was refused for good (blocked): when none is left, nothing more can be sent."""


class EventSink(Protocol):
    def event(self, kind: EventKind, text: str) -> None: ...


class ProblemSink(Protocol):
    def problem(self, text: str) -> None:
        """Report something the run could not do: shown once, fails the run."""


class Burial(Protocol):
    """Where the intake ends a new request at once: the request path's graveyard and shedding."""

    def bury(self, req: Request, now: float) -> None: ...

    def shed(self, req: Request) -> None: ...


class GateWatcher(Protocol):
    """Told when a server's delay closed a gate (a cluster member shares it with the others)."""

    def gate_closed(self, gate: CooldownGate, reason: str) -> None: ...


class BudgetWatcher(Protocol):
    """Told what the server charged and counted, for budgets a store shares (a cluster member)."""

    def gave_back(self, worker: Any, limiter: Any, ticket: Any, units: int) -> None:
        """A send on a lease (`ticket`) was charged `units` less in `limiter`'s budget."""

    def synced(
        self, worker: Any, limiter: Any, policy: Policy, counted: int, at: float, until: float | None
    ) -> None:
        """The server counted `counted` of `limiter`'s budget under `policy`, for a send at `at`
        (loop time; a fixed window's count is that window's), counting until `until` if known."""


class Cooldown(Protocol):
    """How the request path honours a server's delay (Retry-After and the like).

    The engine's own (`path.SharedGates`) closes the budget's gate for every
    sender; the bench supplies the design it compares against
    (`ratedeck.bench.cooldown`).
    """

    def cool(self, gate: CooldownGate, req: Request, now: float, delay_s: float, reason: str) -> None: ...


# ---------------------------------------------------------------- watchers of finished requests


class FinishWatcher(Protocol):
    """Told of every request that ends, after the request's own `on_done` (no I/O: this is the hot path)."""

    def finished(self, req: Request, ending: Ending) -> None: ...


class Watched(Protocol):
    """An engine a finish watcher registers with."""

    def watch(self, watcher: FinishWatcher) -> None: ...

    def event(self, kind: EventKind, text: str) -> None: ...


class GraveRecords(Protocol):
    def record(self, req: Request, now: float, wall_offset: float) -> dict[str, object]:
        """`req`'s graveyard line (keys masked)."""
        ...


class JournalHost(Protocol):
    """What a store's journal reads of the engine."""

    @property
    def graveyard(self) -> GraveRecords: ...

    def clock(self) -> float: ...

    def wall_time(self, t: float) -> float: ...

    def problem(self, text: str) -> None: ...

    def recent_sends(self) -> dict[str, list[float]]:
        """Each key's sends in its last window (Unix times), by key fingerprint."""
        ...


class StoreRunHost(JournalHost, Watched, Protocol):
    """What a store run does with the engine: watch it, and read what is left queued at the end."""

    @property
    def pacing(self) -> Pacing:
        """How the keys' limiters spend a window: even or burst."""

    def queued(self) -> list[Request]:
        """Requests still queued (main queue first, then the retry queue by due time)."""
        ...

    def seed_sends(self, sends: dict[str, list[float]]) -> int:
        """Start each key's limiter with another run's sends (Unix times, by key fingerprint)."""
        ...


class ResultsHost(Watched, Protocol):
    """What a results file reads of the engine."""

    def redact(self, text: str, limit: int | None = None) -> str: ...

    def clock(self) -> float: ...

    def wall_time(self, t: float) -> float: ...

    def queued(self) -> list[Request]: ...

    def in_flight_requests(self) -> list[Request]:
        """Requests with an attempt in flight now."""
        ...


# ---------------------------------------------------------------- a shared store


class StoreUnavailable(RatedeckError):
    """The shared store did not answer (down, unreachable, too slow); the text is one line."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One budget a lease spends from: its name in the store, its policies as enforced now, the cost."""

    budget: str
    policies: tuple[Policy, ...]
    cost: int = 1


@dataclass(frozen=True, slots=True)
class Grant:
    """Send times the store reserved for this member, in its loop clock, earliest first.

    Each may be used from its time until `usable_s` after it (the slack the
    store reserved beyond it). `retry_at` (loop clock), when nothing was
    granted, is when the budget may have room again. `fresh` says the store
    had no record of the budget (first use, or its state was lost).
    """

    times: tuple[float, ...]
    usable_s: float
    retry_at: float | None = None
    fresh: bool = False
    epoch: str = ""  # the store's epoch the grant belongs to (see `ClusterMember.confirm_s`)
    tickets: tuple[Any, ...] = ()  # one per time: what `give_back` needs of it (the store's own)


@dataclass(frozen=True, slots=True)
class Poll:
    """What a member reads each poll: the shared gates closed now (loop time, reason) and the epoch."""

    gates: dict[str, tuple[float, str]]
    epoch: str | None


class SharedState(Protocol):
    """What members share through a store. Every method raises `StoreUnavailable` when it cannot answer."""

    shown: str  # the store as it may be printed (no password)
    calls: int  # round trips made so far

    def bind(self, clock: Callable[[], float]) -> None:
        """The engine's clock (loop time): grants and gates are told in it."""

    async def lease(
        self,
        asks: Sequence[Ask],
        count: int,
        headroom_s: float,
        slack_s: float,
        pace_s: float,
        spacing: float,
        horizon_s: float,
        hold_s: float,
    ) -> Grant:
        """Up to `count` send times at which every budget of `asks` has room for its cost (all
        or none, all policies together), each reserved before the answer, at least `slack_s`
        usable each; none further ahead than `horizon_s`. `hold_s`: see `ClusterMember._hold_s`."""
        ...

    async def give_back(self, ticket: Any, budget: str, units: int) -> None:
        """`units` of `budget` a granted send (`ticket`) reserved were not charged: free them."""

    async def sent(self, sends: Sequence[tuple[Any, float]]) -> None:
        """Granted sends made, each a ticket and its send's loop time: count each from then on,
        no longer over all the lateness its grant allowed (`slack_s`)."""

    async def sync(self, budget: str, policy: Policy, counted: int, at: float, until: float | None) -> None:
        """The server counted `counted` units of `budget`'s `policy` for a send at `at` (loop
        time), counting until `until` (a sliding window's, if known): raise the shared count to
        it, never lower it below what members hold."""

    async def close_gate(self, gate: str, until: float, reason: str) -> None: ...

    async def poll(self, gates: Sequence[str]) -> Poll: ...

    async def publish(self, member: str, summary: dict[str, Any], ttl_s: float) -> None: ...

    async def read_cluster(self) -> ClusterView:
        """Every live member's last summary and the shared work queues' depths."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class Pace(Protocol):
    """The headroom as a cluster member reads it."""

    def seconds(self) -> float: ...

    def pace_seconds(self) -> float: ...


class RunCounts(Protocol):
    @property
    def sent(self) -> int: ...

    @property
    def succeeded(self) -> int: ...

    @property
    def rejected_429(self) -> int: ...

    @property
    def tps_series(self) -> Sequence[float]: ...


class Depths(Protocol):
    @property
    def main(self) -> Sized: ...

    @property
    def dlq(self) -> Sized: ...


# ---------------------------------------------------------------- the makespan meter


class MeterHost(Protocol):
    """What the makespan meter reads of the keys: each key's limiters and state, the budgets."""

    @property
    def workers(self) -> Sequence[Any]: ...

    @property
    def budgets(self) -> Any: ...

    @property
    def host_limiter(self) -> Any: ...


# ---------------------------------------------------------------- a live client's answer


class AnswerSink(Protocol):
    """A live client waiting for a request's answer (the gateway): a streamed answer's bytes go to it as they arrive.

    The transport calls `begin` once, then `write` for each piece in order (for an event
    stream, one whole SSE event each, its terminating blank line included). Either
    returning False says the client is gone: the transport closes the upstream at once.
    """

    async def begin(self, status: int, headers: Sequence[tuple[str, str]]) -> bool:
        """The answer's status and headers as received (the sink shows its client what
        `engine.http.answer_headers` lets through); False: the client is gone."""
        ...

    async def write(self, chunk: bytes) -> bool:
        """One piece of the answer, as it arrived; False: the client is gone."""
        ...
