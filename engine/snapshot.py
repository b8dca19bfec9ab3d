"""The immutable picture of the engine that every consumer reads.

The engine builds a `Snapshot` on demand; the console, the headless runner,
reports and tests read it and never touch engine state directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratedeck.core.numbers import usd
from ratedeck.core.vocab import EventKind, Excess, KeyState, MessagePattern, OutcomeKind, Phase


@dataclass(frozen=True, slots=True)
class Makespan:
    """A job's makespan: `jobs` done in `elapsed_s`, where the limits allowed `least_s` at best."""

    jobs: int = 0
    elapsed_s: float = 0.0
    least_s: float = 0.0

    @property
    def ratio(self) -> float | None:
        """elapsed / least (1.0: as fast as the rules allow); None before any job is done."""
        if self.jobs == 0 or self.least_s <= 0:
            return None
        return self.elapsed_s / self.least_s


@dataclass(frozen=True, slots=True)
class Progress:
    """A job of known size as it goes: `done` of `total` ended (in any place), and when the rest will.

    `least_s` is the least time the limits (as told, advertised or learned) allow for
    what remains, at their steady pace (the start's burst already spent), plus one
    round trip; `eta_s` is the time left: that least time blended with the pace
    observed so far once enough is done, never below it. Either is None while
    unknown (no limit known yet, nothing done at a pace to measure).
    """

    total: int = 0
    done: int = 0
    eta_s: float | None = None
    least_s: float | None = None

    @property
    def fraction(self) -> float:
        """done / total, 0.0 to 1.0 (1.0 for an empty job)."""
        return min(1.0, self.done / self.total) if self.total > 0 else 1.0

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.done)


@dataclass(frozen=True, slots=True)
class SpendRow:
    """What one model cost on one key, from the `usage` of its answers (engine/observe/spend.py).

    `usd` is None when the model has no price: unknown, never 0. `unmetered`
    counts successful answers that reported no usage (their cost is not in `usd`)."""

    model: str
    key: str
    answers: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float | None = 0.0
    unmetered: int = 0


@dataclass(frozen=True, slots=True)
class Spend:
    """The run's bill so far: per model and key, the priced total, and the `--max-cost` cap.

    `reserved_usd` is what requests admitted and not yet ended may still cost
    (their estimate's ceiling); `capped` says the cap stopped admission."""

    rows: tuple[SpendRow, ...] = ()
    total_usd: float = 0.0  # the priced rows' sum
    unpriced: tuple[str, ...] = ()  # models answered that have no price
    reserved_usd: float = 0.0
    cap_usd: float | None = None
    capped: bool = False

    def by_model(self) -> dict[str, float | None]:
        """USD per model over every key (None: the model has no price)."""
        out: dict[str, float | None] = {}
        for r in self.rows:
            before = out.get(r.model, 0.0)
            out[r.model] = None if r.usd is None or before is None else before + r.usd
        return out

    def line(self) -> str:
        """One line: "$0.0123 spent (gpt-4o-mini $0.0100, claude-x unknown), cap $1.00, $0.0300 reserved"."""
        models = ", ".join(f"{m} {usd(v)}" for m, v in self.by_model().items())
        text = f"{usd(self.total_usd)} spent" + (f" ({models})" if models else "")
        if self.unpriced:
            text += f"; no price: {', '.join(self.unpriced)}"
        if self.cap_usd is not None:
            text += f", cap {usd(self.cap_usd)}" + (" reached" if self.capped else "")
            text += f", {usd(self.reserved_usd)} reserved" if self.reserved_usd else ""
        return text


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One API key as the console's key table shows it.

    `label` is the key's id ("k1"); `masked` is the secret with all but its
    last characters hidden. `state` says whether it can send now: a
    `cooling` key has a closed gate (see `cooldown_left_s`); a `blocked` one
    was refused by the server for good and is no longer used.
    """

    label: str
    masked: str
    state: KeyState = KeyState.ACTIVE
    cooldown_left_s: float = 0.0
    in_flight: int = 0
    sent: int = 0
    succeeded: int = 0
    rejected_429: int = 0
    window_used: int = 0
    window_limit: int = 0
    last_latency_ms: float | None = None
    errors: int = 0  # attempts of this key that did not succeed
    last_status: int | None = None  # the last answer's HTTP status (None: no answer yet, or none came)
    last_error: str = ""  # the last failed attempt's status or cause and text, secrets masked
    server_remaining: int | None = None  # the server's own count of what is left (X-RateLimit-Remaining ...)
    server_limit: int | None = None  # the limit the server reports for this key
    server_reset_in_s: float | None = None  # seconds until the server's window turns
    learned_limit: str | None = None  # a limit learned from rejections, below the one given ("20/1s")
    told_limit: str = ""  # the limits the key was given ("25/1s"; several joined by ", ")
    fingerprint: str = ""  # six hex digits of SHA-256 of the secret (core.secrets.fingerprint); "" if short
    latency: LatencySummary = field(default_factory=lambda: LatencySummary())  # this key's successes
    recent_errors: tuple[ErrorRow, ...] = ()  # this key's last failed attempts, newest last (count 1 each)
    refused_status: int | None = None  # a blocked key: the status that refused it (401, 403, ...)
    refused_message: str = ""  # and the server's message with it, secrets masked
    # The key's limit as an estimate (engine/limits/estimate.py): "20/1s", why it is that, how long
    # ago it last moved (None: never), how it climbs ("additive" or "probing") and the share of
    # the last counted window someone else used (None: none seen).
    limit_estimate: str | None = None
    estimate_reason: str = ""
    estimate_moved_ago_s: float | None = None
    estimate_climb: str = ""
    shared_share: float | None = None
    # Of the key's own limit and its budgets, the one nearest full now (its name; "" with no
    # budgets): for an LLM key, the unit that binds (requests, tokens, output-tokens).
    binding: str = ""
    # The key's buckets as the server's headers state them (LLM APIs: "requests 500, tokens
    # 30,000 per 6.0 s"; "" until they are followed).
    followed: str = ""
    # How many attempts the key may have in flight now, and whether that follows its rate and
    # round trip ("auto", engine/limits/in_flight.py) rather than a pinned number.
    in_flight_limit: int = 0
    in_flight_auto: bool = False
    # In a pool of endpoints ([[endpoints]]): the name of the endpoint the key belongs to ("" with
    # one target).
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """One model an endpoint serves, and its limits as the endpoint's keys' lanes hold them now
    (told in `models`, started from the preset, or learned from the answers' headers).

    `limits` is (unit, per minute) for each bucket, summed over the endpoint's keys that have
    a lane for the model ("requests", "tokens", ...); empty while no key has sent the model.
    `followed` says a key's lane follows the server's own buckets (its headers)."""

    model: str
    limits: tuple[tuple[str, float], ...] = ()
    followed: bool = False

    def text(self) -> str:
        """ "gpt-4o-mini: requests 120/min, tokens 12,000/min" ("gpt-4o-mini: not sent yet")."""
        parts = ", ".join(f"{unit} {per_min:,.0f}/min" for unit, per_min in self.limits)
        return f"{self.model}: {parts or 'not sent yet'}"


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One endpoint of a pool (`[[endpoints]]`): what it is, what it serves, whether it is in the pool.

    `url` is printable (core.secrets.safe_url: no user:password@, no query string); `serves`
    the models named in its `models` ("any" when it serves whatever a request names);
    `models` each model's limits as its keys learned them; `state` "up", "down" (out of the
    pool), "probing" (one request out to see) or "refused" (the server refused all its keys), `reason` why it is out, `downs` how often it
    left the pool (engine/path/health.py; an endpoint alone in its pool has no health: "up").
    `keys`, `sent`, `succeeded` and `rejected_429` add up its keys' rows."""

    name: str
    preset: str = ""
    url: str = ""
    serves: tuple[str, ...] = ("any",)
    models: tuple[ModelLimits, ...] = ()
    state: str = "up"
    reason: str = ""
    downs: int = 0
    keys: int = 0
    sent: int = 0
    succeeded: int = 0
    rejected_429: int = 0

    def limits_text(self) -> str:
        """Each model's limits: "gpt-4o-mini: requests 120/min, tokens 12,000/min; ..." ("" with none)."""
        return "; ".join(m.text() for m in self.models)


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """A named budget ([[budgets]]) as spent so far: `owner` is "host" or the key's label.

    `used` and `limit` are the tightest policy's current window (a bucket's
    level), in the budget's units, our forecast synced to the server's own
    count where its answers give one. `reserved` and `settled` are the run's
    totals: a token budget reserves an estimate and settles to the real use.
    """

    name: str
    owner: str
    used: int
    limit: int
    unit: str = "requests"  # requests, weight, tokens, input_tokens, output_tokens
    per_min: float | None = None  # what its tightest policy allows per minute (as learned)
    reserved: int = 0  # units every send so far reserved
    settled: int = 0  # what they cost once settled (reserved less what was given back)

    @property
    def weighted(self) -> bool:
        return self.unit == "weight"


@dataclass(frozen=True, slots=True)
class GateRow:
    """A cooldown gate: closed for `left_s` more seconds (0 when open) and why.

    `escalations` counts closings that asked for a longer wait than the one
    before: the server raising its penalty, which ratedeck exists to avoid.
    """

    name: str
    left_s: float
    reason: str
    closures: int
    escalations: int


@dataclass(frozen=True, slots=True)
class Event:
    """A line of the event log: seconds since start, a kind and a text."""

    at_s: float
    kind: EventKind
    text: str


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """A latency distribution, in milliseconds."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    p999: float = 0.0
    count: int = 0
    buckets: tuple[tuple[float, int], ...] = ()  # (upper bound ms, cumulative count), metrics.BUCKET_EDGES_MS
    # The whole histogram, sparse: (bin, count) for every bin in use (metrics.LatencyHistogram's
    # bins). Only an engine that runs as one of several processes fills it: percentiles of
    # several processes together are then exact (engine/observe/merge.py).
    hist: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class LoopLag:
    """How late the engine's ticker fired (ms), and whether the client, not the server, is the limit.

    `p50_ms` and `p99_ms` cover the recent ticks (about the last minute, ten ticks a
    second); `run` every tick of the run (`run.max` the worst). `core_share` is the CPU
    seconds per wall second of the engine's process over the same recent ticks
    (1.0: a whole core; with several processes, the busiest), `run_core_share` the
    same since the start (None until a few seconds have passed). `limit` is the
    verdict on the recent figures and `run_limit` on the whole run's
    (engine/observe/loop_watch.py `client_limit`): the figures that say the client
    is the limit, "" when they do not.
    """

    p50_ms: float = 0.0
    p99_ms: float = 0.0
    run: LatencySummary = field(default_factory=lambda: LatencySummary())
    core_share: float | None = None
    run_core_share: float | None = None
    limit: str = ""
    run_limit: str = ""

    def shown(self, final: bool) -> tuple[float, float, str]:
        """(p50 ms, p99 ms, verdict): the whole run's once it ended (`final`), else the recent ones."""
        if final:
            return self.run.p50, self.run.p99, self.run_limit
        return self.p50_ms, self.p99_ms, self.limit


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Attempts that did not succeed, grouped by what came back.

    `status` is the HTTP status (None when no answer came: `cause` then says
    why, "connection refused", "timed out"); `last_text` is the last answer's
    body or error, secrets masked; `last_key` the key label that got it.
    """

    status: int | None
    kind: OutcomeKind
    cause: str
    count: int
    last_text: str
    last_key: str
    last_at_s: float


@dataclass(frozen=True, slots=True)
class MessageStats:
    """A message run's part of a snapshot (engine/sources/multicall.py).

    A message ends in one place: generated == completed + failed + shed +
    queued + in_progress.
    """

    calls_per_message: int = 1
    pattern: MessagePattern = MessagePattern.PARALLEL
    generated: int = 0  # arrived at the entry
    completed: int = 0  # every call succeeded
    failed: int = 0  # a call expired, was buried or was refused
    shed: int = 0  # dropped at the entry (throttle excess or not sampled)
    queued: int = 0  # waiting at the entry for the throttle
    in_progress: int = 0
    calls_wasted: int = 0  # attempts spent on messages that failed
    calls_cancelled: int = 0  # calls of failed messages expired before being sent
    goodput_tps: float = 0.0  # messages completed per second since start
    current_goodput: float = 0.0  # messages completed in the last full second
    goodput_series: tuple[float, ...] = ()  # per second, oldest first, like tps_series
    throttle_mode: str = "off"  # "off", "auto" or "fixed"
    throttle_rate: float = 0.0  # messages/s the entry admits now (0 with the throttle off)
    excess: Excess = Excess.QUEUE

    def balance(self) -> int:
        """generated minus every place a message can be; 0 when nothing is lost."""
        return self.generated - (self.completed + self.failed + self.shed + self.queued + self.in_progress)


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One quota of a gateway client: its name as configured (`tokens_per_minute`), its limit
    and what is left of it now (over the last 60 s; `usd_per_day`: the last 24 h)."""

    name: str
    limit: float
    left: float


@dataclass(frozen=True, slots=True)
class ClientRow:
    """One gateway client (`[[gateway.clients]]`, a flow of engine/flows.py): its priority and
    weight, its requests waiting, its queue waits, its share of the binding unit served over
    the last 60 s, its quotas, and the requests its quota refused (429)."""

    name: str
    priority: str
    weight: float
    waiting: int = 0
    answered: int = 0  # answers given to it, of any status
    wait_p50_ms: float = 0.0
    wait_p99_ms: float = 0.0
    share: float = 0.0  # of the binding unit served to all clients over the last 60 s
    served: float = 0.0  # binding units served to it since the start
    sent: int = 0  # its requests taken by a key to be sent
    refused: int = 0  # requests refused by its quota (429 + Retry-After)
    quotas: tuple[QuotaRow, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch of the gateway's Batch APIs (gateway/batches): its id, API ("openai" or
    "anthropic"), client, status (OpenAI's names), lines in all, ended, failed, and the time
    its lines left should take at the rate they have been ending (None: no rate yet)."""

    id: str
    api: str
    client: str
    status: str
    total: int
    done: int
    failed: int
    eta_s: float | None = None

    @property
    def left(self) -> int:
        return max(0, self.total - self.done)


@dataclass(frozen=True, slots=True)
class ClientView:
    """Live clients' part of a snapshot (engine/sources/live.py, the gateway): how many wait,
    how long they waited, what they were answered."""

    waiting: int = 0  # requests queued for the limits, not yet sent
    answered: int = 0  # answers given to clients, of any status
    wait_p50_ms: float = 0.0  # arrival to first send (or to the end, for one never sent), recent requests
    wait_p99_ms: float = 0.0
    wait_sum_s: float = 0.0  # every queue wait so far, added up (Prometheus' histogram sum)
    wait_count: int = 0
    wait_buckets: tuple[tuple[float, int], ...] = ()  # (upper bound in s, waits at most that), cumulative
    statuses: tuple[tuple[int, int], ...] = ()  # (status answered, count); 499: the client left first
    # Each client with `[[gateway.clients]]` (() with one token), and the unit shares are in:
    # "tokens" (an LLM pool), "weight" or "requests".
    rows: tuple[ClientRow, ...] = ()
    unit: str = "requests"
    # The Batch APIs' batches (gateway/batches): those not ended, and the latest that did.
    batches: tuple[BatchRow, ...] = ()


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One member of a cluster (`--store redis://...`) as it last published itself.

    `member` is its id (host:pid:random, no secret); `phase` its engine's
    phase; counts are its own since its start; `main_depth`/`dlq_depth` its
    local queues; `leases_used`/`leases_granted` the send times the store
    granted it and how many it used; `store` "ok" or "unreachable".
    """

    member: str
    phase: str = ""
    current_tps: float = 0.0
    sent: int = 0
    succeeded: int = 0
    rejected_429: int = 0
    main_depth: int = 0
    dlq_depth: int = 0
    in_flight: int = 0
    leases_used: int = 0
    leases_granted: int = 0
    store: str = "ok"


@dataclass(frozen=True, slots=True)
class SharedKeyRow:
    """What the members last learned of one shared key (or budget), from its hash in the store.

    Last writer wins (no exactness at stake: the grants stay exact whatever this says):
    `budget` is its store name (a fingerprint), `member` who wrote it, `age_s` how long ago;
    `estimate` the learned limit ("40/1s", "" if none) and `reason`; `remaining`/`limit` the
    server's last count; `headroom_ms` the writer's headroom.
    """

    budget: str
    member: str = ""
    age_s: float = 0.0
    estimate: str = ""
    estimate_limit: int | None = None
    reason: str = ""
    remaining: int | None = None
    limit: int | None = None
    headroom_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster as its members published it, read from the shared store at most once a second.

    `members` are the live ones (a summary that expired is left out), sorted by
    id; `waiting`, `claimed`, `uncertain` and `graveyard` are the shared work
    queues' depths (0 when no work store uses the namespace); `read_at_s` is
    when it was read, in seconds since the run's start.
    """

    members: tuple[MemberRow, ...] = ()
    waiting: int = 0
    claimed: int = 0
    uncertain: int = 0
    graveyard: int = 0
    read_at_s: float = 0.0
    keys: tuple[SharedKeyRow, ...] = ()  # what members learned of each shared key (last writer wins)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the engine knows, at one instant, as scalars and tuples.

    Request accounting balances at every snapshot:
    generated == succeeded + uncertain + expired + graveyard + shed + main_depth
                 + dlq_depth + in_flight
    Attempts (sent, rejected_429, rejected_other, failed, retried) explain the
    traffic and are counted separately.
    """

    elapsed_s: float = 0.0
    phase: Phase = Phase.RUNNING
    capacity_tps: float = 0.0  # what every key allows (advertised limits included)
    live_capacity_tps: float = 0.0  # what the keys that can send now allow, headroom included
    throughput_tps: float = 0.0  # successes per second since start
    current_tps: float = 0.0  # successes in the last full second
    # requests (each ends in exactly one place)
    generated: int = 0
    succeeded: int = 0
    expired: int = 0
    graveyard: int = 0
    shed: int = 0
    main_depth: int = 0
    dlq_depth: int = 0
    in_flight: int = 0
    # attempts
    sent: int = 0
    rejected_429: int = 0
    rejected_other: int = 0  # 4xx other than 429 (nonce, auth, ...)
    failed: int = 0  # 5xx, timeouts, connection errors
    retried: int = 0
    failures: tuple[tuple[str, int], ...] = ()  # cause -> count, e.g. ("timeout", 3)
    errors: tuple[ErrorRow, ...] = ()  # every attempt that did not succeed, by status and cause
    # queues
    main_max: int = 0  # backpressure limit of the main queue
    main_peak: int = 0
    main_avg: float = 0.0
    dlq_peak: int = 0
    dlq_avg: float = 0.0
    # limiter and settings
    headroom_ms: float = 0.0
    headroom_adaptive: bool = True
    headroom_min_ms: float = 0.0  # lowest value seen during the run
    headroom_max_ms: float = 0.0  # highest value seen during the run
    backpressure: bool = True
    arrival_rate: float = 0.0
    latency: LatencySummary = field(default_factory=LatencySummary)  # send -> answer, successes
    latency_total: LatencySummary = field(default_factory=LatencySummary)  # arrival -> done, successes
    queue_wait: LatencySummary = field(default_factory=LatencySummary)  # arrival -> first send
    # per-second series, oldest first, for sparklines (last few minutes)
    tps_series: tuple[float, ...] = ()
    p50_series: tuple[float, ...] = ()
    p99_series: tuple[float, ...] = ()
    keys: tuple[KeyRow, ...] = ()
    events: tuple[Event, ...] = ()  # newest last
    # a message run's own counts (None for a plain request workload)
    messages: MessageStats | None = None
    # cooldown gates: one per key, plus "host" with a host-wide limit
    gates: tuple[GateRow, ...] = ()
    budgets: tuple[BudgetRow, ...] = ()  # named budgets, host ones first
    # what the headroom is made of (engine/limits/headroom.py)
    # "round trip", "hints", "probe", "budget probing", "remaining counts" or "fixed"
    headroom_source: str = "round trip"
    rtt_spread_ms: float | None = None  # whole round trips: network and server time together
    network_spread_ms: float | None = None  # the network's alone, where known (hints or a probe)
    server_time_ms: float | None = None  # mean server time the answers' hints report, where used
    rejection_budget: int = 0  # engine.rejection_budget: 429s the run may spend probing
    rejections_spent: int = 0  # rate-limit rejections the run took, any cause (probing stops at the budget)
    probe_sent: int = 0  # probes sent to target.probe_url (their cost)
    # the client's own cost: is ratedeck the bottleneck?
    cpu_s: float = 0.0  # CPU seconds (user + system) of the engine's process(es) since the start
    loop_lag_ms: float = 0.0  # how late the engine's timers fired, worst in the last few seconds
    lag: LoopLag = field(default_factory=LoopLag)  # the timers' lateness as p50/p99, and the verdict
    procs: int = 1  # engine processes (`--procs`); a merged snapshot sums them
    loop: str = ""  # the event loop the engine runs on: "uvloop" or "asyncio" ("" before the start)
    # what else the process's CPU figures count, on the same loop ("the embedded simulator"); "" none
    cpu_with: str = ""
    # with a shared store (`--store redis://...`): every member and the shared queues, else None
    cluster: ClusterView | None = None
    # a job run (a workload file, a store): its makespan against the least time the limits allow
    makespan: Makespan | None = None
    # a job of known size (a workload file, a store's pending jobs, `--total`): done of total, ETA
    progress: Progress | None = None
    fed: bool = False  # a job fed as fast as the limits allow (no arrival rate; `arrival_rate` unused)
    # requests that ended uncertain: a write that may or may not have happened (Ending.UNCERTAIN)
    uncertain: int = 0
    # no limit was given and the server's first answers advertised none: the run stopped (the line)
    no_limit: str = ""
    # live clients (the gateway): what they see of the queue; None for other sources
    clients: ClientView | None = None
    # what the answers cost in USD (LLM usage against config/prices); None when nothing was priced
    spend: Spend | None = None
    # a pool of endpoints ([[endpoints]]): one row each, in the config's order; empty with one target
    endpoints: tuple[EndpointRow, ...] = ()

    @property
    def answered(self) -> int:
        """Attempts that came back (with an answer or without one): sent minus in flight."""
        return max(0, self.sent - self.in_flight)

    @property
    def cpu_us_per_request(self) -> float | None:
        """CPU microseconds per answered attempt; None before any came back. Where the
        embedded simulator shares the engine's process (`--no-ui` with no target and one
        process), its CPU is in the figure too."""
        answered = self.answered
        return self.cpu_s * 1e6 / answered if answered and self.cpu_s > 0 else None

    @property
    def cpu_cores(self) -> float | None:
        """Cores the engine kept busy on average since the start (1.0: one whole core;
        several processes add up); None before any time has passed. Near 1.0 per
        process, the client is the bottleneck whatever its CPU per request."""
        return self.cpu_s / self.elapsed_s if self.elapsed_s > 0 and self.cpu_s > 0 else None

    def balance(self) -> int:
        """generated minus every place a request can be; 0 when nothing is lost."""
        return self.generated - (
            self.succeeded
            + self.expired
            + self.graveyard
            + self.shed
            + self.uncertain
            + self.main_depth
            + self.dlq_depth
            + self.in_flight
        )

    def headroom_from(self) -> str:
        """Where the headroom comes from, with what that cost:
        "budget probing, spent 3 of 10 rejections", "probe, 300 probes sent"."""
        text = self.headroom_source
        if self.rejection_budget:
            text += f", spent {self.rejections_spent} of {self.rejection_budget} rejections"
        if self.probe_sent:
            text += f", {self.probe_sent} probes sent"
        return text

    def headroom_spread(self) -> str:
        """The round trip's parts where known: "network 38 ms, server 50 ms"
        (hints or a probe), else the whole round trip's "round trip 98 ms" ("98 ms" when
        that is the source); "" before any."""
        parts = []
        if self.network_spread_ms is not None:
            parts.append(f"network {self.network_spread_ms:.0f} ms")
        elif self.rtt_spread_ms is not None:
            whole = f"{self.rtt_spread_ms:.0f} ms"
            parts.append(whole if self.headroom_source == "round trip" else f"round trip {whole}")
        if self.server_time_ms is not None:
            parts.append(f"server {self.server_time_ms:.0f} ms")
        return ", ".join(parts)

    @property
    def pct_capacity(self) -> float:
        return 100.0 * self.throughput_tps / self.capacity_tps if self.capacity_tps else 0.0
