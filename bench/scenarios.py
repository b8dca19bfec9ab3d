"""The bench's scenarios and strategies: what runs against what."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ratedeck.server.settings import STUDY_KEYS, generated_keys


@dataclass(frozen=True)
class Scenario:
    """One simulator setup every strategy runs against.

    Attributes:
        name: the stable name used in `--scenarios` and the report.
        summary: one line for the table's heading.
        serve_args: `ratedeck serve` options that start the simulator.
        jitter_ms: "low:high" one-way delay of a jitter proxy (`bench/jitter.py`)
            between client and simulator, in its own process; None: none.
        keys: the API keys the clients use.
        limit / window_s: each key's policy, as the server enforces it.
        nonce: the server requires a strictly increasing nonce per key.
        told_limit: the per-key limit the clients are told, when it is not
            the server's (a limit "told wrong"); they are offered what they
            were told. None: the server's.
        health: the server answers `GET /health` (a probe's target).
        strategies: the strategies run when `--strategies` is not given.
        in_flight: requests in flight per key for the peers that keep
            several (the limit times the slowest round trips, or they cap
            the rate before the limit does); ratedeck sizes its own.
    """

    name: str
    summary: str
    serve_args: tuple[str, ...]
    keys: tuple[str, ...]
    limit: int
    window_s: float
    nonce: bool
    told_limit: int | None = None
    health: bool = False
    strategies: tuple[str, ...] = ()
    in_flight: int = 8
    jitter_ms: str | None = None

    @property
    def capacity_tps(self) -> float:
        """Requests per second all keys allow together, as the server enforces it."""
        return len(self.keys) * self.limit / self.window_s

    @property
    def client_limit(self) -> int:
        """The per-key limit the clients are given."""
        return self.told_limit if self.told_limit is not None else self.limit

    @property
    def offered_tps(self) -> float:
        """The arrival rate every strategy is offered: the capacity the clients believe in."""
        return len(self.keys) * self.client_limit / self.window_s


MANY_KEYS = 50

#: Strategy name -> what it is, in the order they run.
STRATEGIES: dict[str, str] = {
    "original": "the study's original client: 50 ms interval + ring, 1 in flight/key",
    "improved-async": "the study's improved client on asyncio: ring + 30..50 ms buffer, 1 in flight/key",
    "improved-threads": "the study's improved client on threads (http.client)",
    "aiolimiter": "aiolimiter AsyncLimiter(limit, window) per key, 8 in flight/key",
    "ratedeck": "ratedeck's engine (study preset, adaptive headroom, even pacing; reads timing hints; "
    "the engine's default slow start on live rows)",
    "ratedeck+probe": "ratedeck with target.probe_url = the simulator's /health (10 probes/s)",
    "ratedeck+budget": "ratedeck with engine.rejection_budget = 10 (probes the headroom on purpose; learn_policy off)",
    "ratedeck+procs2": "ratedeck with --procs 2: keys shared out among two engine processes",
}

#: The strategies of the original three scenarios (and of `ratedeck bench` with no options).
DEFAULT_STRATEGIES = ("original", "improved-async", "improved-threads", "aiolimiter", "ratedeck")
#: Strategies that need the scenario's `/health`.
NEEDS_HEALTH = frozenset({"ratedeck+probe"})

_PEERS = ("original", "improved-async", "aiolimiter", "ratedeck")
# A server that says nothing but yes or no: no Retry-After, no RateLimit headers.
_QUIET = ("--no-ratelimit-headers", "--no-retry-after")


class Row(NamedTuple):
    """One scenario as data; `scenario()` turns it into the simulator's options and the clients' keys.

    `study`: the study's server (`--mode study`: its 5 keys, 20/1s, nonce, block after 10);
    otherwise standard mode with `keys` generated keys of `limit`/1s each and no nonce.
    `latency` and `processing` are "low:high" ms (None: the mode's own); `flags` are
    further `ratedeck serve` options (`--health` serves the probe's target).
    """

    name: str
    summary: str
    strategies: tuple[str, ...] = _PEERS
    latency: str | None = None
    processing: str | None = None
    flags: tuple[str, ...] = ()
    keys: int = 5
    limit: int = 20
    study: bool = False
    told_limit: int | None = None
    in_flight: int = 8
    jitter_ms: str | None = None


def scenario(row: Row) -> Scenario:
    """The scenario a table row describes."""
    timing: tuple[str, ...] = ()
    if row.latency:
        timing += ("--latency", row.latency)
    if row.processing:
        timing += ("--processing", row.processing)
    if row.study:
        serve_args: tuple[str, ...] = ("--mode", "study", *timing)
        keys = STUDY_KEYS
    else:
        size = ("--keys", str(row.keys), "--limit", f"{row.limit}/1s")
        serve_args = ("--mode", "standard", *size, *timing, "--no-nonce", *row.flags)
        keys = generated_keys(row.keys)
    return Scenario(
        row.name,
        row.summary,
        serve_args,
        keys,
        row.limit,
        1.0,
        nonce=row.study,
        told_limit=row.told_limit,
        health="--health" in row.flags,
        strategies=row.strategies,
        in_flight=row.in_flight,
        jitter_ms=row.jitter_ms,
    )


TABLE: tuple[Row, ...] = (
    Row(
        "seed",
        "the study's server: 5 keys x 20/1s, 0..50 ms each way, nonce, block after 10",
        DEFAULT_STRATEGIES,
        study=True,
    ),
    Row(
        "seed+jitter",
        "study mode with 0..100 ms each way (twice the study's jitter)",
        DEFAULT_STRATEGIES,
        latency="0:100",
        study=True,
    ),
    Row(
        "many-keys",
        f"standard mode: {MANY_KEYS} keys x 20/1s, 0..5 ms each way, no nonce",
        DEFAULT_STRATEGIES,
        latency="0:5",
        keys=MANY_KEYS,
    ),
    # The noisy servers: server time next to network jitter.
    Row(
        "noisy",
        "5 keys x 20/1s, 5..45 ms each way, 20..80 ms processing, no hints of any kind; /health",
        (*_PEERS, "ratedeck+probe", "ratedeck+budget"),
        latency="5:45",
        processing="20:80",
        flags=(*_QUIET, "--health"),
    ),
    Row(
        "noisy+timing",
        "noisy, and every answer says its server time (Server-Timing: app;dur=X)",
        latency="5:45",
        processing="20:80",
        flags=(*_QUIET, "--server-timing"),
    ),
    Row(
        "noisy-wide",
        "noisy with 5..95 ms each way (no hints; budget 0 must stay at 0 rejections)",
        (*_PEERS, "ratedeck+probe"),
        latency="5:95",
        processing="20:80",
        flags=(*_QUIET, "--health"),
    ),
    Row(
        "steady+timing",
        "a steady network (100..104 ms each way), 20..80 ms processing, Server-Timing",
        latency="100:104",
        processing="20:80",
        flags=(*_QUIET, "--server-timing"),
    ),
    # The client's own CPU at scale (the simulator runs in its own process).
    Row(
        "many-keys-heavy",
        f"{MANY_KEYS} keys x 100/1s (5,000/s), 5..45 ms each way, 20..80 ms processing, no hints",
        ("improved-async", "aiolimiter", "ratedeck", "ratedeck+procs2"),
        latency="5:45",
        processing="20:80",
        flags=_QUIET,
        keys=MANY_KEYS,
        limit=100,
        # 100/s per key at round trips of 60..170 ms and more: 8 in flight would cap a key
        # near 60/s, below its limit, for every client alike.
        in_flight=16,
    ),
    Row(
        "told-wrong",
        "clients told 25/1s per key, the server allows 20/1s: 429 + Retry-After, "
        "escalating cooldowns; 0..50 ms each way, no RateLimit headers",
        latency="0:50",
        flags=("--no-ratelimit-headers", "--retry-after", "--escalation"),
        told_limit=25,
    ),
    Row(
        "told-wrong+remaining",
        "clients told 30/1s per key, the server allows 20/1s and says its remaining count "
        "(X-RateLimit-*) on every answer; 429 + Retry-After, escalating cooldowns; 0..50 ms each way",
        latency="0:50",
        flags=("--retry-after", "--escalation"),
        told_limit=30,
    ),
    # Someone else on the same keys for a while, with nothing in the headers to say so.
    Row(
        "shared-keys",
        "5 keys x 20/1s, and another user takes 8/s of each key from 10 s to 30 s after the first "
        "request; 5..45 ms each way, 20..80 ms processing, no hints (the keys must recover)",
        latency="5:45",
        processing="20:80",
        flags=(*_QUIET, "--other-load", "8/1s@10s-30s"),
    ),
)


def _live(
    name: str,
    summary: str,
    flags: tuple[str, ...],
    *,
    jitter_ms: str = "5:45",
    strategies: tuple[str, ...] = ("aiolimiter", "ratedeck"),
    told_limit: int | None = None,
) -> Row:
    """A live row of the study's 5 keys x 20/1s: the simulator adds no delay of its own, 20..80 ms
    of server time, behind a proxy that delays each way by `jitter_ms`."""
    return Row(
        name,
        summary,
        strategies,
        latency="0",
        processing="20:80",
        flags=flags,
        told_limit=told_limit,
        jitter_ms=jitter_ms,
    )


def _live5(
    name: str,
    jitter_ms: str,
    hint: str,
    *flags: str,
    strategies: tuple[str, ...] = ("aiolimiter", "ratedeck"),
) -> Row:
    """A live row (`_live`) named for its proxy's delay ("100:104" is a steady network) and hint."""
    low, high = jitter_ms.split(":")
    kind = "steady" if float(high) - float(low) < 10 else "jitter"
    summary = (
        f"5 keys x 20/1s through a {kind} proxy ({low}..{high} ms each way), 20..80 ms processing, {hint}"
    )
    return _live(name, summary, (*_QUIET, *flags), jitter_ms=jitter_ms, strategies=strategies)


#: Real time on real sockets: the simulator adds no delay of its own, a jitter proxy in its own
#: process delays every chunk each way, and the client's CPU is measured beside the plain peer's.
LIVE_TABLE: tuple[Row, ...] = (
    Row(
        "live-heavy",
        f"{MANY_KEYS} keys x 100/1s (5,000/s) through a jitter proxy (5..45 ms each way), "
        "20..80 ms processing, no hints: CPU per accepted request beside aiolimiter + aiohttp",
        ("aiolimiter", "ratedeck"),
        latency="0",
        processing="20:80",
        flags=_QUIET,
        keys=MANY_KEYS,
        limit=100,
        in_flight=16,
        jitter_ms="5:45",
    ),
    Row(
        "live-heavy+hints",
        f"{MANY_KEYS} keys x 100/1s (5,000/s) as live-heavy, the server sending RateLimit-Policy, "
        "RateLimit, X-RateLimit-* and Server-Timing on every answer",
        ("aiolimiter", "ratedeck"),
        latency="0",
        processing="20:80",
        flags=("--server-timing",),
        keys=MANY_KEYS,
        limit=100,
        in_flight=16,
        jitter_ms="5:45",
    ),
    _live5("live-steady+timing", "100:104", "Server-Timing", "--server-timing"),
    _live5("live-steady", "100:104", "no hints"),
    _live5("live-jitter+timing", "5:45", "Server-Timing", "--server-timing"),
    _live5(
        "live-jitter",
        "5:45",
        "no hints (for ratedeck+probe and ratedeck+budget)",
        "--health",
        strategies=("aiolimiter", "ratedeck", "ratedeck+probe", "ratedeck+budget"),
    ),
    # Issue 44's estimate rows, live: the limit told wrong, and a key shared with another user.
    # Targets (60 s): told-wrong >= 0.90 sustained, <= 60 429s, <= 40 sends into a cooldown
    # (`server_in_cooldown`); told-wrong+remaining >= 0.92, <= 5 429s; shared-keys >= 0.85 of
    # what the other user left (`share_of_left`), <= 150 429s.
    _live(
        "live-told-wrong",
        "clients told 25/1s per key, the server allows 20/1s: 429 + Retry-After, a cooldown on each "
        "429 that doubles on every send into it (escalation); jitter proxy (5..45 ms each way), "
        "20..80 ms processing, no RateLimit headers",
        ("--no-ratelimit-headers", "--retry-after", "--escalation"),
        told_limit=25,
    ),
    _live(
        "live-told-wrong+remaining",
        "clients told 30/1s per key, the server allows 20/1s and says RateLimit / X-RateLimit-* "
        "on every answer; 429 + Retry-After, escalating cooldowns; jitter proxy (5..45 ms each way), "
        "20..80 ms processing",
        ("--ratelimit-headers", "--retry-after", "--escalation"),
        told_limit=30,
    ),
    _live(
        "live-shared-keys",
        "5 keys x 20/1s, another user takes 8/s of each key from 10 s to 30 s after the first request; "
        "jitter proxy (5..45 ms each way), 20..80 ms processing, no hints. Judge by share_of_left "
        "(accepted / (capacity - the other user's accepted)); sustained is over the clients' own "
        "accept stamps only (the other user's are not stamped), so the slots the other user took "
        "count as gaps there and it reads below share_of_left",
        (*_QUIET, "--other-load", "8/1s@10s-30s"),
    ),
)


def engine_extra(scenario: Scenario) -> dict:
    """What ratedeck's strategies add for `scenario` (`RunSpec.extra`): a live row's server, or
    one that tells the clients a limit not its own, is a named target as a user's run meets
    one, so the engine runs with its defaults, the slow start included (the study preset
    turns it off, its limit being the simulator's own). An independent server runs ratedeck
    that way: its steady + Server-Timing figure (0.969) was this engine's with a slow start."""
    return {"slow_start": True} if scenario.jitter_ms or scenario.told_limit is not None else {}


SCENARIOS: dict[str, Scenario] = {row.name: scenario(row) for row in (*TABLE, *LIVE_TABLE)}

#: Names that stand for several scenarios in `--scenarios`.
GROUPS: dict[str, tuple[str, ...]] = {
    "default": ("seed", "seed+jitter", "many-keys"),
    "noisy-servers": (
        "noisy",
        "noisy+timing",
        "noisy-wide",
        "steady+timing",
        "told-wrong",
        "told-wrong+remaining",
    ),
    # opt-in (never in the default): real time through a jitter proxy, the client's CPU side by side
    "live": tuple(row.name for row in LIVE_TABLE),
}
DEFAULT_SCENARIOS = GROUPS["default"]


@dataclass(frozen=True)
class JobScenario:
    """N jobs against an in-process server of one policy kind (`bench/jobs.py`).

    `policy` is each key's, as the server enforces it and the clients are told;
    `costs` cycle over the jobs (with `weighted`, the keys' limits count them);
    `latency_ms` is each way's uniform delay.
    """

    name: str
    summary: str
    policy: str
    keys: int
    jobs: int
    costs: tuple[int, ...] = (1,)
    latency_ms: tuple[float, float] = (1.0, 5.0)

    @property
    def weighted(self) -> bool:
        return self.costs != (1,)

    @property
    def capacity_tps(self) -> float:
        """Jobs per second the keys allow in the long run (mean cost counted)."""
        from ratedeck.core.policy import parse_policy

        mean_cost = sum(self.costs) / len(self.costs)
        return self.keys * parse_policy(self.policy).rate / mean_cost


#: Strategy name -> what it is, for the jobs group.
JOB_STRATEGIES: dict[str, str] = {
    "ratedeck": "ratedeck, the job fed by backpressure (a workload file with no --rate)",
    "ratedeck+rate": "ratedeck with --rate at the keys' capacity (a fixed arrival rate instead of backpressure)",
    "aiolimiter": "AsyncLimiter(limit, limit / rate) per key, 8 senders per key, each 429's Retry-After waited out",
}

#: Each sized for about 12 s of limit, so the group runs in about two minutes.
JOB_TABLE: tuple[JobScenario, ...] = (
    JobScenario("jobs-sliding", "1,300 jobs, 5 keys x 20/1s sliding, 1..5 ms each way", "20/1s", 5, 1300),
    JobScenario(
        "jobs-bucket",
        "250 jobs of cost 1 and 2, 5 keys x a bucket of 20 draining 5/s (20@5/s), 1..5 ms each way",
        "20@5/s",
        5,
        250,
        costs=(1, 2),
    ),
    JobScenario(
        "jobs-fixed",
        "1,300 jobs, 5 keys x 40/2s fixed windows on the clock, 1..5 ms each way",
        "40/2s fixed",
        5,
        1300,
    ),
)
JOB_SCENARIOS: dict[str, JobScenario] = {s.name: s for s in JOB_TABLE}
GROUPS["jobs"] = tuple(JOB_SCENARIOS)


@dataclass(frozen=True)
class LLMScenario:
    """Prompts through several keys of one LLM API stub (`bench/llm.py`, `server/stubs/`).

    `api` is "openai" or "anthropic"; `rpm`/`tpm` (OpenAI) or `rpm`/`itpm`/`otpm`
    (Anthropic) are each key's limits per `minute_s` seconds (the stub's scaled
    minute), as the stub enforces them and the peers are told them (ratedeck is
    not told them). `no_quota` keys answer 429 insufficient_quota to everything;
    `overload_share` of Anthropic's answers are 529 overloaded_error; `latency_s`
    is the stub's time per accepted request.
    """

    name: str
    summary: str
    api: str
    keys: tuple[str, ...]
    rpm: int
    tpm: int = 0
    itpm: int = 0
    otpm: int = 0
    minute_s: float = 6.0
    no_quota: tuple[str, ...] = ()
    overload_share: float = 0.0
    latency_s: float = 0.05
    strategies: tuple[str, ...] = ("cookbook", "litellm", "ratedeck")

    def stub_options(self) -> dict[str, object]:
        """`start_openai` / `start_anthropic` options."""
        common: dict[str, object] = {
            "keys": self.keys,
            "rpm": self.rpm,
            "minute_s": self.minute_s,
            "latency": self.latency_s,
        }
        if self.api == "anthropic":
            return {**common, "itpm": self.itpm, "otpm": self.otpm, "overload_share": self.overload_share}
        return {**common, "tpm": self.tpm, "no_quota": self.no_quota}

    @property
    def quota_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.keys if k not in self.no_quota)

    @property
    def token_limit(self) -> int:
        """Each key's token limit per minute the share is taken of (Anthropic: output tokens)."""
        return self.otpm if self.api == "anthropic" else self.tpm

    def told(self) -> dict[str, float]:
        """Each key's limits per `minute_s`, as the peers are told them."""
        if self.api == "anthropic":
            return {"requests": self.rpm, "input": self.itpm, "output": self.otpm}
        return {"requests": self.rpm, "tokens": self.tpm}

    def prompt_count(self, duration_s: float) -> int:
        """Enough prompts that no strategy runs out: three times what every key allows at a small cost."""
        minutes = 1.0 + duration_s / self.minute_s
        if self.api == "anthropic":
            per_key = min(self.rpm, self.otpm / 50.0, self.itpm / 5.0)
        else:
            per_key = min(self.rpm, self.tpm / 100.0)
        return int(3 * len(self.keys) * per_key * minutes) + 200


#: Strategy name -> what it is, for the llm group.
LLM_STRATEGIES: dict[str, str] = {
    "cookbook": "OpenAI cookbook api_request_parallel_processor: one instance per key at 0.75 of the told "
    "RPM/TPM, 1 ms polling, 15 s pause after a rate-limit error, 5 attempts",
    "litellm": "LiteLLM Router, usage-based routing on told RPM/TPM in per-minute windows, 5 s cooldown "
    "of a deployment on a 429, retried on another",
    "ratedeck": "ratedeck's CLI with --preset openai|anthropic (budgets from the answers' headers; not told the limits)",
}

LLM_TABLE: tuple[LLMScenario, ...] = (
    LLMScenario(
        "llm-openai",
        "OpenAI stub: 3 keys x 500 RPM / 30,000 TPM (one with no quota: insufficient_quota), "
        "minute = 6 s, prompts of 20..2,000 characters, max_tokens 50..400",
        "openai",
        ("sk-bench-openai-a", "sk-bench-openai-b", "sk-bench-openai-noquota"),
        rpm=500,
        tpm=30_000,
        no_quota=("sk-bench-openai-noquota",),
    ),
    LLMScenario(
        "llm-anthropic",
        "Anthropic stub: 3 keys x 1,000 RPM / 30,000 ITPM / 8,000 OTPM (output tokens bind), 3% 529 overloaded, "
        "minute = 6 s, prompts of 20..2,000 characters, max_tokens 50..400",
        "anthropic",
        ("sk-ant-bench-a", "sk-ant-bench-b", "sk-ant-bench-c"),
        rpm=1000,
        itpm=30_000,
        otpm=8_000,
        overload_share=0.03,
    ),
)
LLM_SCENARIOS: dict[str, LLMScenario] = {s.name: s for s in LLM_TABLE}
GROUPS["llm"] = tuple(LLM_SCENARIOS)
