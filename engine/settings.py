"""The engine's settings: frozen dataclasses, enums for choices, no I/O.

The config layer (`ratedeck.config`) reads TOML files, presets, flags, key files
and environment variables, checks every value and builds these; the engine never
imports it. `EngineSettings` is the whole of what one engine needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

from ratedeck.core.errors import RatedeckError
from ratedeck.core.numbers import MAX_RATE
from ratedeck.core.policy import Policy
from ratedeck.core.secrets import redact
from ratedeck.core.vocab import ApiStyle, Arrival, Excess, HeadroomMode, MessagePattern, Pacing, Priority
from ratedeck.engine.api_rules import BudgetSpec, OutcomeRule, PathRule

if TYPE_CHECKING:
    from ratedeck.engine.llm.prices import Price


class ConfigError(RatedeckError, ValueError):
    """A setting that cannot be used; `str()` is the whole user-facing message."""

    def __init__(self, source: str, key: str, problem: str):
        self.source, self.key, self.problem = source, key, problem
        super().__init__(_one_line(f"{source}: {key}: {problem}"))


def _one_line(text: str) -> str:
    """`text` with every unprintable character escaped, so a message is always one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


@dataclass(frozen=True)
class TargetConfig:
    """Where requests go and how a key, nonce and request id travel ([target]).

    The defaults are neutral, for a target the user names with no preset: the
    key as `Authorization: Bearer <key>`, no nonce, no request id, only the
    parameters asked for, a 10 s timeout. The study preset sets the study's
    server's conventions. What each field means: the rows of `ratedeck.config`.
    """

    url: str | None = None
    method: str = "GET"
    key_param: str | None = None
    key_header: str | None = "Authorization"
    key_format: str = ""
    nonce_param: str | None = None
    id_param: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    user_agent: str = ""
    signing: str | None = None
    idempotency: bool = False
    rules: tuple[OutcomeRule, ...] = ()
    timeout_s: float = 10.0
    delay_field: str | None = None
    host_limit_match: str = "host"
    http_client: str = "reqwest"  # the HTTP client (engine/http): "reqwest" or "aiohttp"
    follow_redirects: bool = False
    probe_url: str | None = None
    probe_rate: float = 10.0
    # The HTTP client's network settings (engine/http/client.py, reqwest_client.py).
    connect_timeout_s: float | None = (
        None  # opening a connection (TCP, TLS, proxy); None: timeout_s bounds it
    )
    read_timeout_s: float | None = (
        None  # the longest silence while reading an answer; None: timeout_s bounds it
    )
    proxy: str | None = None  # an explicit proxy URL; None: HTTP(S)_PROXY / NO_PROXY from the environment
    ca_file: str | None = None  # trust this CA (PEM) for the target instead of the system's store
    client_cert: str | None = None  # a client certificate (PEM) for mutual TLS
    client_key: str | None = None  # its private key, when not in the certificate's file
    max_body_mb: int = 32  # a 2xx body past this many MiB once decompressed fails, unread
    # The server's id of a request, read from the first of these answer headers there is.
    request_id_headers: tuple[str, ...] = ("X-Request-Id",)
    # The header a server sets on an answer it replayed for an Idempotency-Key ("" none).
    replayed_header: str = "Idempotent-Replayed"
    # POSTs that do nothing twice when repeated (an LLM completion): a failed one is retried
    # like a GET, on any key, never "uncertain".
    safe_writes: bool = False
    # Statuses the API documents as charging the key nothing (Anthropic's 529 overloaded):
    # what their attempt reserved is given back.
    free_statuses: tuple[int, ...] = ()
    # The API's streamed answers carry usage only when asked (OpenAI's stream_options.include_usage):
    # the gateway asks for it, so token budgets settle on the real count.
    stream_usage: bool = False
    # The dotted JSON body field naming a request's model, for limits per key and model
    # (`[keys] scope = "key+model"`, budgets with `scope = "key+model"`).
    model_field: str = "model"
    # How a request's path reaches the API: "plain" as it is; "azure": OpenAI's /v1/... as Azure
    # OpenAI's /openai/v1/... (the deployment as the body's model), or with `api_version`, as
    # /openai/deployments/{deployment}/...?api-version=... (engine/http/endpoints.py).
    api_style: ApiStyle = ApiStyle.PLAIN
    api_version: str | None = None
    # The API answers nothing at the root of its URL (an LLM API: every call names its endpoint):
    # a job line with no `_path`, to a URL with no path, is refused before it is sent.
    path_required: bool = False


@dataclass(frozen=True)
class ModelRoute:
    """How one endpoint serves a model clients name: under its own name there (`deployment`,
    Azure's; None: the same name), and the limits told for it per key (`requests`, and
    `budgets` by budget name); none told: learned from the answers."""

    deployment: str | None = None
    requests: tuple[Policy, ...] = ()
    budgets: Mapping[str, tuple[Policy, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class EndpointSpec:
    """One endpoint of a pool (`[[endpoints]]`): its name (shown everywhere), the preset it
    speaks, its target (URL, how the key travels, its API's rules) and the models it
    serves (None: whatever model a request names)."""

    name: str
    preset: str
    target: TargetConfig
    models: Mapping[str, ModelRoute] | None = None
    learn_first: bool = False  # its answers' headers tell each model's limits: one first
    # Each budget's starting limits on this endpoint (its preset's), where no model's are told.
    starts: Mapping[str, tuple[Policy, ...]] = field(default_factory=dict)
    # USD per million tokens by model at this endpoint, over the run's ([[endpoints]] prices):
    # Azure's and OpenAI's prices for one model may differ.
    prices: Mapping[str, Price] = field(default_factory=dict)

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def route(self, model: str) -> ModelRoute | None:
        return self.models.get(model) if self.models is not None else None

    def told(self, budget: str | None = None) -> tuple[Policy, ...]:
        """Its keys' limits as told for a model in `models`: the requests limit (`budget` None)
        or a budget's, else the budget's start from its preset; () when none is told."""
        for route in (self.models or {}).values():
            told = route.requests if budget is None else route.budgets.get(budget, ())
            if told:
                return told
        return self.starts.get(budget, ()) if budget is not None else ()


@dataclass(frozen=True)
class FlowSpec:
    """One flow of work with its own place in the queue (a gateway client, `[[gateway.clients]]`):
    its `priority`, its `weight` among flows of that priority, and its quotas, each over any
    60 s (`usd_per_day` over any 24 h) in what admission charges. `refuse`: over a quota, a new
    request is refused (the gateway's 429) instead of waiting. engine/flows.py schedules them."""

    name: str
    priority: Priority = Priority.STANDARD
    weight: float = 1.0
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    usd_per_day: float | None = None
    refuse: bool = False

    @property
    def quotas(self) -> bool:
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.usd_per_day is not None
        )


@dataclass(frozen=True)
class KeySpec:
    """One API key: its id ("k1"), secret, and the policies that bind it; in a pool of
    endpoints, the endpoint it belongs to."""

    label: str
    secret: str = field(repr=False)
    policies: tuple[Policy, ...]
    api_secret: str | None = field(default=None, repr=False)  # the signing secret that goes with the key
    endpoint: EndpointSpec | None = field(default=None, repr=False, compare=False)


#: `graveyard_path`'s default: the runner places the file next to the report, else under
#: the XDG state directory (core/paths.run_graveyard_path); never the working directory.
GRAVEYARD_AUTO = "auto"

#: The main queue's least size when `queue_max` is unset, and how many sends of every
#: key's in-flight allowance it holds beyond that (`EngineSettings.main_queue_max`).
QUEUE_MAX_FLOOR = 1000
QUEUE_ROUNDS = 4

#: `in_flight_per_key`'s default: each key keeps as many in flight as its rate times its
#: measured round trip needs, within `in_flight_max` (engine/limits/in_flight.py).
AUTO_IN_FLIGHT = "auto"

#: How much longer than the request timeout the end waits when `drain_timeout_s` is unset.
DRAIN_MARGIN_S = 1.0


@dataclass(frozen=True)
class EngineConfig:
    """How the engine paces, retries and queues ([engine]).

    The defaults fit a job against a real API; the study preset sets the study's
    own (a 1 s TTL, a queue of 50, a 2 s drain). `queue_max` and
    `drain_timeout_s` unset are derived from the run (`EngineSettings`).
    """

    in_flight_per_key: int | str = AUTO_IN_FLIGHT  # "auto": rate x round trip (limits/in_flight.py)
    in_flight_max: int = 64  # the most "auto" keeps in flight per key
    headroom: HeadroomMode | float = HeadroomMode.ADAPTIVE  # or fixed milliseconds
    headroom_initial_ms: float = 100.0
    headroom_min_ms: float = 1.0  # timers and server stamps have about 1 ms grain
    headroom_max_ms: float = 500.0
    rejection_budget: int = 0
    pacing: Pacing = Pacing.AUTO
    max_attempts: int = 5
    backoff_base_ms: float = 50.0
    backoff_cap_ms: float = 2000.0
    queue_max: int | None = None  # None: EngineSettings.main_queue_max
    backpressure: bool = True
    ttl_s: float | None = None  # None: a request never expires
    drain_timeout_s: float | None = None  # None: EngineSettings.drain_s
    graveyard_path: str | None = GRAVEYARD_AUTO  # None writes none
    # JSONL file of every answer's timing and rate-limit headers, for replay (engine/observe/recording.py)
    record_path: str | None = None
    learn_policy: bool = True
    slow_start: bool = True  # sends beyond 3/4 of a told limit go one at a time until it holds (study: off)
    # One request per key until its first answer, whose rate-limit headers then set the key's
    # limits and token budgets, lower or higher than the ones given (LLM APIs' tiers).
    learn_first: bool = False


@dataclass(frozen=True)
class CostConfig:
    """How a request's tokens are estimated from its body ([costs], engine/limits/costs.py)."""

    estimate: str = "chars/4"  # or a hook "module:function" returning the input tokens
    max_tokens: int = 1024  # output tokens reserved when the body names no max_tokens


@dataclass(frozen=True)
class WorkloadConfig:
    """Where requests come from ([workload])."""

    rate: float | None = None  # requests/s; None: the keys' total capacity
    arrival: Arrival = Arrival.CONSTANT
    file: str | None = None
    total: int | None = None


@dataclass(frozen=True)
class MessagesConfig:
    """Messages that need several calls each, behind an entry throttle ([messages], engine/sources/multicall.py)."""

    calls: int = 1
    pattern: MessagePattern = MessagePattern.PARALLEL
    throttle: str | float = "off"  # "off", "auto" (live capacity / calls) or messages per second
    excess: Excess = Excess.QUEUE
    sample_fraction: float = 1.0
    shed_path: str | None = "ratedeck-shed.jsonl"
    backlog_max: int = 1000


@dataclass(frozen=True)
class EngineSettings:
    """Everything one engine needs. `keys` hold secrets: never print them."""

    target: TargetConfig = field(default_factory=TargetConfig)
    keys: tuple[KeySpec, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    messages: MessagesConfig | None = None  # [messages]: multi-call messages instead of requests
    budgets: tuple[BudgetSpec, ...] = ()  # [[budgets]]: named limits beyond each key's own
    costs: CostConfig = field(default_factory=CostConfig)  # [costs]: token estimates for token budgets
    paths: tuple[PathRule, ...] = ()  # [paths]: weight, budgets and signing per request path
    pools: dict[str, int] = field(default_factory=dict)  # connection pool name -> capacity
    host_policies: tuple[Policy, ...] = ()  # limits shared by all keys (one budget for the host)
    key_weighted: bool = False  # [keys] unit = "weight": a key's own limits count request weight
    key_per_model: bool = False  # [keys] scope = "key+model": a key's own limits hold per model
    seed: int | None = None  # random seed for jitter and arrivals
    # USD per million tokens by model, checked (engine/llm/prices.py): config/prices and [prices]
    prices: Mapping[str, Price] = field(default_factory=dict)
    max_cost: float | None = None  # USD: admission stops before spent + reserved would pass it
    # [[endpoints]]: the pool's endpoints, each key's own in `KeySpec.endpoint` (empty: one target)
    endpoints: tuple[EndpointSpec, ...] = ()
    # The flows work comes in (gateway clients), each with its priority, weight and quotas
    # (engine/flows.py); empty: one first-come queue.
    flows: tuple[FlowSpec, ...] = ()

    @property
    def per_model(self) -> bool:
        """Some limit is per key and model: each key keeps a lane of buckets per model."""
        return self.key_per_model or any(b.per_model for b in self.budgets)

    @property
    def capacity_tps(self) -> float:
        """Requests per second all keys allow together (tightest policy per key, and the host's)."""
        total = sum(min(p.rate for p in _key_policies(k)) for k in self.keys if _key_policies(k))
        if self.host_policies:
            total = min(total, min(p.rate for p in self.host_policies))
        return total

    @property
    def main_queue_max(self) -> int:
        """The main queue's size: `queue_max`, or enough to keep every key's limiter busy,
        `QUEUE_ROUNDS` times all keys' in-flight allowance and at least `QUEUE_MAX_FLOOR`."""
        e = self.engine
        if e.queue_max is not None:
            return e.queue_max
        return max(QUEUE_MAX_FLOOR, QUEUE_ROUNDS * len(self.keys) * self.in_flight_ceiling)

    @property
    def in_flight_pinned(self) -> int | None:
        """The in-flight number the user (or a preset) pinned per key; None for "auto"."""
        n = self.engine.in_flight_per_key
        return n if isinstance(n, int) else None

    @property
    def in_flight_ceiling(self) -> int:
        """The most requests a key may have in flight: the pinned number, or `in_flight_max`."""
        pinned = self.in_flight_pinned
        return pinned if pinned is not None else self.engine.in_flight_max

    @property
    def drain_s(self) -> float:
        """How long the end waits for requests in flight: `drain_timeout_s`, or long enough
        for every one to be answered or time out (the request timeout and a margin)."""
        e = self.engine
        if e.drain_timeout_s is not None:
            return e.drain_timeout_s
        return self.target.timeout_s + DRAIN_MARGIN_S

    @property
    def arrival_rate(self) -> float:
        """Requests per second to generate: the workload's rate, or the keys' capacity, at most `MAX_RATE`."""
        rate = self.workload.rate if self.workload.rate is not None else self.capacity_tps
        return min(rate, MAX_RATE)

    def __repr__(self) -> str:
        """The fields, with every form of every key masked (a key may hide in a URL or params)."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"EngineSettings({shown})", [k.secret for k in self.keys])


def _key_policies(key: KeySpec) -> tuple[Policy, ...]:
    """A key's request limits: told for its endpoint's models in a pool, else its own."""
    return (key.endpoint.told() if key.endpoint is not None else ()) or key.policies


class HoldsEngineSettings(Protocol):
    """Whatever carries an engine's settings among others' (the config layer's `EngineSettings`)."""

    @property
    def engine_settings(self) -> EngineSettings: ...


def engine_settings(cfg: EngineSettings | HoldsEngineSettings) -> EngineSettings:
    """The engine's own part of `cfg`: the engine takes either."""
    return cfg if isinstance(cfg, EngineSettings) else cfg.engine_settings
