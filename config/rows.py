"""The settings schema: one row per setting, the only place a setting is declared.

A row holds the setting's path in the config file ("engine.in_flight_per_key"),
its kind (what the reference and the JSON schema call its type), the parser that
checks a value (core/numbers and `parsers`), the help line, the layer that
reads it and its command-line flag, if any. Its default is the field's default
in the settings object that layer receives (`FIELDS`), so it is written once.

From the rows come the run command's flags (`flags.py`), TOML loading and
saving (`load.py`, `save.py`), `ratedeck config show` and the generated
reference and JSON schema (`docs.py`). Adding a setting is one row here, plus
the field in its layer's settings object and the code that reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratedeck.core.numbers import MAX_COUNT, MAX_MS, fraction, parse_duration, parse_rate
from ratedeck.core.vocab import AccessLogForm, ApiStyle, Arrival, Excess, HttpClient, MessagePattern, Pacing
from ratedeck.engine.api_rules import parse_outcome_rules, rules_to_toml
from ratedeck.engine.settings import (
    CostConfig,
    EngineConfig,
    EngineSettings,
    MessagesConfig,
    TargetConfig,
    WorkloadConfig,
)

from . import parsers as p
from .settings import ConsoleSettings, GatewaySettings, RunnerSettings

#: `Flag.switch` of a flag that takes a value (any other `switch`: a flag with none that sets it).
NO_SWITCH = object()
#: The default of a row that has no field (a table the layer reads whole).
NO_DEFAULT = object()
#: The commands that take setting flags (`Flag.commands`): a run (`ratedeck`, and `replay` and
#: `config show`, which take a run's flags) and `ratedeck gateway`.
RUN, GATEWAY = "run", "gateway"


def _split_keys(text: str) -> list[str]:
    """`--keys k1,k2` as a list; `@FILE` and `env:VAR` stay one entry, resolved later."""
    return [text] if text.startswith(("@", "env:")) else [k for k in text.split(",") if k.strip()]


def _header_lines(lines: list[str]) -> dict[str, str]:
    return dict(p.header_line(line) for line in lines)


@dataclass(frozen=True)
class Flag:
    """How a setting is given on the run command's line."""

    name: str  # "--in-flight"
    metavar: str | None = None
    help: str | None = None  # the --help line when it differs from the row's
    check: bool = False  # parse the value at once, so a bad one names the flag
    switch: Any = NO_SWITCH  # a flag without a value that sets the setting to this
    repeat: bool = False  # may be given several times; the values make a list
    choices: tuple[str, ...] | None = None
    convert: Callable[[Any], Any] | None = None  # the flag's text as the setting's value
    keep_empty: bool = False  # "" is a value (else "" leaves the setting alone)
    group: str | None = None  # flags of one group exclude each other
    also: tuple[tuple[str, Any], ...] = ()  # other settings the flag sets with it
    commands: tuple[str, ...] = (RUN, GATEWAY)  # the commands that take it (their --help lists it)
    bare: str | None = None  # the value when given with none ("--access-log" alone: "text")

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Row:
    """One setting: where it sits in the file, how it is checked, shown, given as a flag and saved."""

    path: str  # "engine.in_flight_per_key"; a top-level name ("pools") for a whole table
    kind: str  # a name in docs.KINDS: its type in the reference and the JSON schema
    parse: Callable[[Any], Any] | None  # None: the section's own parser reads it (`[keys]`)
    help: str
    layer: str  # the layer that reads it: engine, runner, console, store or server
    flag: Flag | None = None
    optional: bool = False  # "" switches it off (None)
    save: str = "set"  # "set": written unless None; "changed": unless the default; "never"
    dump: Callable[[Any], Any] | None = None  # the value as TOML (None from it: left out)
    choices: tuple[str, ...] = ()  # a choice's values, for the reference and schema
    fallback: Any = NO_DEFAULT  # the default of a setting with no field of its own

    @property
    def section(self) -> str:
        return self.path.partition(".")[0] if "." in self.path else ""

    @property
    def key(self) -> str:
        return self.path.rpartition(".")[2]

    def read(self, value: Any) -> Any:
        """A config file's value checked; ValueError naming the problem."""
        if self.optional and value == "":
            return None
        assert self.parse is not None, self.path
        return self.parse(value)

    @property
    def default(self) -> Any:
        for cls in FIELDS.get(self.section, ()):
            for f in dataclasses.fields(cls):
                if f.name == self.key:
                    if f.default is not dataclasses.MISSING:
                        return f.default
                    if f.default_factory is not dataclasses.MISSING:
                        return f.default_factory()
        return self.fallback


def _choice(enum: Any) -> dict[str, Any]:
    return {"parse": p.choice(enum), "kind": "choice", "choices": tuple(str(o) for o in enum)}


def _flag(name: str, metavar: str | None = None, **kw: Any) -> Flag:
    return Flag(name, metavar, **kw)


ROWS: tuple[Row, ...] = (
    Row(
        "preset",
        "string",
        p.nonempty,
        "built-in settings to start from (`ratedeck presets`); --preset wins",
        "runner",
    ),
    # ---------------------------------------------------------------- [target]
    Row(
        "target.url",
        "url",
        p.url,
        "endpoint to call; unset: the embedded simulator",
        "engine",
        _flag("--target", "URL", help="endpoint to call (a run with none calls the embedded simulator)"),
        optional=True,
    ),
    Row(
        "target.method",
        "choice",
        p.method,
        "HTTP method",
        "engine",
        _flag("--method", choices=("GET", "POST"), commands=(RUN,)),
        choices=("GET", "POST"),
    ),
    Row(
        "target.key_param",
        "string",
        p.nonempty,
        "query/form parameter carrying the key",
        "engine",
        _flag(
            "--key-param",
            "NAME",
            help="send the key in this query/form parameter",
            group="key",
            also=(("target.key_header", ""),),
        ),
        optional=True,
    ),
    Row(
        "target.key_header",
        "string",
        p.header_name,
        "header carrying the key; wins over key_param when set",
        "engine",
        _flag(
            "--key-header",
            "NAME",
            help="send the key in this header",
            group="key",
            also=(("target.key_param", ""),),
        ),
        optional=True,
    ),
    Row(
        "target.key_format",
        "string",
        p.key_format,
        'how the key is written in its header, like "Bearer {key}"; "": Bearer in Authorization, else as is',
        "engine",
        _flag(
            "--key-format",
            "TEXT",
            help='how the key is written in its header, like "Bearer {key}" (default: Bearer in Authorization)',
        ),
    ),
    Row(
        "target.nonce_param",
        "string",
        p.nonempty,
        "parameter for a strictly increasing nonce, for targets that check one",
        "engine",
        _flag(
            "--nonce-param",
            "NAME",
            help="parameter for a strictly increasing nonce; 'none' for targets without one",
            convert=lambda v: "" if v.lower() == "none" else v,
        ),
        optional=True,
    ),
    Row("target.id_param", "string", p.nonempty, "parameter for a request id", "engine", optional=True),
    Row("target.params", "table", p.params, "parameters sent with every request", "engine"),
    Row(
        "target.headers",
        "table",
        p.headers,
        "headers sent with every request",
        "engine",
        _flag(
            "--header",
            '"NAME: VALUE"',
            help="a header to send with every request; repeat for several",
            repeat=True,
            convert=_header_lines,
        ),
    ),
    Row("target.user_agent", "string", p.text, 'the User-Agent header; "": ratedeck/<version>', "engine"),
    Row(
        "target.signing",
        "string",
        p.signing,
        'sign requests: "binance", "kraken" or a hook "module:function" (engine/http/signing.py)',
        "engine",
        optional=True,
    ),
    Row(
        "target.idempotency",
        "boolean",
        p.boolean,
        "an Idempotency-Key per logical request on POST, kept across retries",
        "engine",
    ),
    Row(
        "target.rules",
        "rules",
        parse_outcome_rules,
        "what answers mean beyond their status: [[target.rules]] tables (engine/api_rules.py)",
        "engine",
        dump=lambda rules: rules_to_toml(rules) if rules else None,
    ),
    Row(
        "target.timeout_s",
        "duration",
        p.seconds(p.MAX_TIMEOUT_S),
        "seconds to wait for an answer",
        "engine",
        _flag("--timeout", "S", keep_empty=True),
    ),
    Row(
        "target.delay_field",
        "string",
        p.nonempty,
        'JSON path in error bodies holding a retry delay ("error.retryDelay")',
        "engine",
        optional=True,
    ),
    Row(
        "target.host_limit_match",
        "string",
        p.nonempty,
        "a 429 whose body says this closes the host-wide gate",
        "engine",
    ),
    Row(
        help='"reqwest": pyreqwest (Rust), the leanest per request; "aiohttp": aiohttp\'s client, which'
        " also re-sends an idempotent request once on a kept-alive connection found closed and reads"
        " 1xx answers such as 103",
        layer="engine",
        path="target.http_client",
        flag=_flag("--http-client", choices=tuple(str(o) for o in HttpClient)),
        **_choice(HttpClient),
    ),
    Row(
        "target.follow_redirects",
        "boolean",
        p.boolean,
        "follow 3xx to the same origin only; never sends the key elsewhere",
        "engine",
    ),
    Row(
        "target.probe_url",
        "url",
        p.url,
        "a cheap, unlimited endpoint of the target's host (time, health) polled to measure the network alone; no key is sent",
        "engine",
        _flag(
            "--probe-url",
            "URL",
            help="a cheap endpoint of the target's host (time, health) polled to measure the network alone",
            check=True,
        ),
        optional=True,
    ),
    Row(
        "target.probe_rate",
        "rate",
        lambda v: parse_rate(v, allow_zero=False, high=p.MAX_PROBE_RATE),
        "probes per second, on their own connection",
        "engine",
        _flag("--probe-rate", "N", help="probes per second with --probe-url", check=True),
    ),
    # The HTTP client's network settings (engine/http/client.py; docs/configuration.md#the-network).
    Row(
        "target.connect_timeout_s",
        "duration",
        p.seconds(p.MAX_TIMEOUT_S),
        "seconds to open a connection (TCP, TLS, a proxy's tunnel); unset: timeout_s bounds it",
        "engine",
        _flag("--connect-timeout", "S", help="seconds to open a connection (default: timeout_s bounds it)"),
        optional=True,
    ),
    Row(
        "target.read_timeout_s",
        "duration",
        p.seconds(p.MAX_TIMEOUT_S),
        "the longest silence while reading an answer, in seconds; unset: timeout_s bounds it",
        "engine",
        optional=True,
    ),
    Row(
        "target.proxy",
        "url",
        p.url,
        "a proxy for every request (http://host:port, credentials in the URL); unset: HTTP_PROXY, HTTPS_PROXY and NO_PROXY",
        "engine",
        _flag(
            "--proxy", "URL", help="send every request through this proxy (default: HTTP(S)_PROXY, NO_PROXY)"
        ),
        optional=True,
    ),
    Row(
        "target.ca_file",
        "path",
        p.path,
        "trust this CA (PEM) for the target instead of the system's store (which honours SSL_CERT_FILE)",
        "engine",
        optional=True,
    ),
    Row(
        "target.client_cert",
        "path",
        p.path,
        "a client certificate (PEM) for mutual TLS; its key in the same file or in client_key",
        "engine",
        optional=True,
    ),
    Row(
        "target.client_key",
        "path",
        p.path,
        "the client certificate's private key (PEM)",
        "engine",
        optional=True,
    ),
    Row(
        "target.max_body_mb",
        "integer",
        p.count(1, 4096),
        "a 2xx body over this many MiB once decompressed fails the request, unread (a gzip bomb stops here)",
        "engine",
    ),
    Row(
        "target.request_id_headers",
        "strings",
        p.strings("header names"),
        "answer headers that carry the server's id of a request (the first present is reported"
        " with an uncertain request)",
        "engine",
        dump=list,
    ),
    Row(
        "target.replayed_header",
        "string",
        p.text,
        'the answer header a server sets to "true" on a replayed idempotent answer ("": none)',
        "engine",
    ),
    Row(
        "target.safe_writes",
        "boolean",
        p.boolean,
        "POSTs here do nothing twice when repeated (an LLM completion): a failed one is retried "
        "like a GET, on any key, and never ends uncertain",
        "engine",
    ),
    Row(
        "target.free_statuses",
        "statuses",
        p.statuses,
        "statuses the API documents as charging the key nothing (Anthropic's 529 overloaded): "
        "what their attempt reserved from the key's budgets is given back",
        "engine",
        dump=list,
    ),
    Row(
        "target.stream_usage",
        "boolean",
        p.boolean,
        "the API's streamed answers carry their usage only when asked (OpenAI's "
        "stream_options.include_usage): the gateway asks for it on a client's streamed request, "
        "so token budgets settle on the real count, and drops the usage event the client did not ask for",
        "engine",
    ),
    Row(
        "target.model_field",
        "string",
        p.nonempty,
        'the dotted JSON body field naming a request\'s model, for limits with scope "key+model"',
        "engine",
    ),
    Row(
        help='"plain": a request\'s path goes as it is; "azure": OpenAI\'s /v1/... goes as Azure '
        "OpenAI's /openai/v1/... with the deployment as the body's model, or, with target.api_version, "
        "as /openai/deployments/{deployment}/...?api-version=...",
        layer="engine",
        path="target.api_style",
        **_choice(ApiStyle),
    ),
    Row(
        "target.api_version",
        "string",
        p.nonempty,
        'the api-version an Azure OpenAI deployments path carries (like "2024-10-21"); unset: the v1 path',
        "engine",
        optional=True,
    ),
    Row(
        "target.path_required",
        "boolean",
        p.boolean,
        "the API answers nothing at the root of its URL (an LLM API: every call names its "
        "endpoint): a job line without _path, sent to a target URL without a path, is refused "
        "before anything is sent, with its line number, instead of drawing a 404",
        "engine",
    ),
    # ---------------------------------------------------------------- [keys]
    Row(
        "keys.secrets",
        "strings",
        None,
        "API keys: literal, env:VAR (comma-separated keys) or @FILE (one per line); "
        '"KEY SECRET" for APIs that sign',
        "engine",
        _flag(
            "--keys",
            "KEYS",
            help="API keys: k1,k2,...  or @FILE (one per line) or env:VAR",
            convert=_split_keys,
            keep_empty=True,
        ),
    ),
    Row(
        "keys.limits",
        "limits",
        None,
        'every key\'s limits, all of which must hold, like ["20/1s", "600/1m"]',
        "engine",
        _flag(
            "--limit",
            "N/W",
            help="per-key limit like 20/1s; repeat for several (all must hold)",
            repeat=True,
        ),
        fallback=(),
    ),
    Row("keys.limits_by_key", "table", None, 'one key\'s own limits, like k2 = ["10/1s"]', "engine"),
    Row("keys.host_limits", "limits", None, "limits shared by all keys (one budget for the host)", "engine"),
    Row(
        "keys.unit",
        "choice",
        None,
        '"weight": a key\'s own limits count request weight ([paths]) instead of requests',
        "engine",
        choices=("requests", "weight"),
        fallback="requests",
    ),
    Row(
        "keys.scope",
        "choice",
        None,
        "\"key+model\": a key's own limits hold per model (target.model_field), as OpenAI's and "
        "Anthropic's do",
        "engine",
        choices=("key", "key+model"),
        fallback="key",
    ),
    # ---------------------------------------------------------------- [engine]
    Row(
        "engine.in_flight_per_key",
        "in_flight",
        p.in_flight,
        '"auto": as many as the key\'s rate times its measured round trip needs (up to'
        " in_flight_max; fewer when answers slow down or fail); a number pins it",
        "engine",
        _flag("--in-flight", "N|auto", check=True),
    ),
    Row(
        "engine.in_flight_max",
        "integer",
        p.count(1, p.MAX_IN_FLIGHT),
        'the most requests a key keeps in flight when in_flight_per_key is "auto"',
        "engine",
    ),
    Row(
        "engine.headroom",
        "headroom",
        p.headroom,
        '"adaptive" (learned from the answers) or fixed milliseconds',
        "engine",
        _flag("--headroom", "MS|adaptive", help="fixed headroom in ms, or 'adaptive'", check=True),
    ),
    Row(
        "engine.headroom_initial_ms",
        "milliseconds",
        p.ms(p.MAX_HEADROOM_MS),
        "adaptive headroom to start from",
        "engine",
    ),
    Row(
        "engine.headroom_min_ms",
        "milliseconds",
        p.ms(p.MAX_HEADROOM_MS),
        "the least adaptive headroom (timers have about 1 ms grain)",
        "engine",
    ),
    Row(
        "engine.headroom_max_ms",
        "milliseconds",
        p.ms(p.MAX_HEADROOM_MS),
        "the most adaptive headroom",
        "engine",
    ),
    Row(
        "engine.rejection_budget",
        "integer",
        p.count(0, MAX_COUNT),
        "429s the run may spend narrowing its headroom (0: never probe; keep 0 where a server bans)",
        "engine",
        _flag("--rejection-budget", "N", check=True),
    ),
    Row(
        help='"auto": "burst" for a job fed as fast as the limits allow, else "even"; "even": spread'
        ' sends across the window; "burst": send as soon as the window has room',
        layer="engine",
        path="engine.pacing",
        **_choice(Pacing),
    ),
    Row(
        "engine.max_attempts",
        "integer",
        p.count(1, p.MAX_ATTEMPTS),
        "tries per request, the first included",
        "engine",
    ),
    Row(
        "engine.backoff_base_ms", "milliseconds", p.ms(MAX_MS), "first retry backoff after an error", "engine"
    ),
    Row("engine.backoff_cap_ms", "milliseconds", p.ms(MAX_MS), "the longest retry backoff", "engine"),
    Row(
        "engine.queue_max",
        "integer",
        p.count(1, p.MAX_QUEUE),
        "the main queue's size; unset: 4 x keys x in_flight_per_key (or in_flight_max), at least 1000, so queued work always"
        " waits for every key's limiter",
        "engine",
        optional=True,
    ),
    Row(
        "engine.backpressure",
        "boolean",
        p.boolean,
        "the generator waits while the main queue is full (false: it grows and TTLs expire)",
        "engine",
        _flag("--no-backpressure", help="let the main queue grow (TTLs expire)", switch=False),
    ),
    Row(
        "engine.ttl_s",
        "duration",
        p.seconds(),
        "request time-to-live, for data that goes stale; unset: work never expires",
        "engine",
        _flag(
            "--ttl",
            "S",
            help="request time-to-live: seconds, or 500ms, 30s, 5m (default: none, work never expires)",
            check=True,
        ),
        optional=True,
    ),
    Row(
        "engine.drain_timeout_s",
        "duration",
        p.seconds(p.MAX_TIMEOUT_S, allow_zero=True),
        "how long the end waits for requests in flight; unset: the request timeout + 1s, so each is"
        " answered or times out",
        "engine",
        optional=True,
    ),
    Row(
        "engine.graveyard_path",
        "path",
        p.path_or_off,
        'JSONL file for requests that used up their attempts; "auto": a run\'s next to the report'
        " (REPORT-graveyard.jsonl), else under $XDG_STATE_HOME/ratedeck/, one per run; a gateway"
        ' writes none (its clients\' requests are theirs); "": none',
        "engine",
        _flag(
            "--graveyard",
            "FILE",
            help="JSONL file for requests that used up their attempts (default: a run's next to"
            " --report, else under ~/.local/state/ratedeck/; a gateway's none)",
            keep_empty=True,
        ),
        optional=True,
    ),
    Row(
        "engine.record_path",
        "path",
        p.path,
        "JSONL file: each answer's send and answer times, status and rate-limit headers (no key, no"
        " body), for replaying the limit estimate and the headroom in a test",
        "engine",
        _flag("--record", "FILE", commands=(RUN,)),
        optional=True,
        save="never",
    ),
    Row(
        "engine.learn_policy",
        "boolean",
        p.boolean,
        "adopt tighter limits the server advertises (RateLimit-Policy)",
        "engine",
    ),
    Row(
        "engine.slow_start",
        "boolean",
        p.boolean,
        "trust a told limit only as far as the server accepts it: sends beyond three quarters of it go one "
        "at a time until answered (a wrong limit's first 429 then has no company in a cooldown)",
        "engine",
    ),
    Row(
        "engine.learn_first",
        "boolean",
        p.boolean,
        "send one request per key until its first answer, whose rate-limit headers then set the "
        "key's limits and token budgets, lower or higher than the ones given (LLM tiers)",
        "engine",
    ),
    # ---------------------------------------------------------------- [workload]
    Row(
        "workload.rate",
        "rate",
        lambda v: parse_rate(v, allow_zero=True),
        "arrival rate: requests/s, or N/W like 20/1s; unset: the keys' capacity",
        "engine",
        _flag(
            "--rate",
            "R",
            help="arrival rate: requests/s, or N/W like 20/1s (default: capacity)",
            check=True,
            commands=(RUN,),
        ),
        optional=True,
    ),
    Row(
        help='"constant": evenly spaced arrivals; "poisson": Poisson arrivals',
        layer="engine",
        path="workload.arrival",
        flag=_flag(
            "--poisson", help="Poisson arrivals instead of evenly spaced", switch="poisson", commands=(RUN,)
        ),
        **_choice(Arrival),
    ),
    Row(
        "workload.file",
        "path",
        p.path,
        "JSONL file of requests (one object of parameters per line) instead of generating",
        "engine",
        _flag(
            "--workload",
            "FILE",
            help="JSONL file of requests (one object of parameters per line)",
            commands=(RUN,),
        ),
        optional=True,
    ),
    Row(
        "workload.total",
        "integer",
        p.count(0, MAX_COUNT),
        "stop generating after this many requests",
        "engine",
        _flag("--total", "N", help="stop generating after N requests", check=True, commands=(RUN,)),
        optional=True,
    ),
    # ---------------------------------------------------------------- [messages]
    Row(
        "messages.calls",
        "integer",
        p.count(1, p.MAX_CALLS),
        "calls a message needs; it completes only when all succeed",
        "engine",
    ),
    Row(
        help='"parallel": all calls at once; "sequential": each after the previous one succeeded',
        layer="engine",
        path="messages.pattern",
        **_choice(MessagePattern),
    ),
    Row(
        "messages.throttle",
        "throttle",
        p.throttle,
        '"off", "auto" (live capacity / calls) or messages per second',
        "engine",
    ),
    Row(
        help='what the throttle does with the rest: "queue", "shed" or "sample"',
        layer="engine",
        path="messages.excess",
        **_choice(Excess),
    ),
    Row(
        "messages.sample_fraction",
        "fraction",
        fraction,
        'with excess = "sample": the fraction of arrivals processed',
        "engine",
    ),
    Row("messages.shed_path", "path", p.path, "one JSON line per shed message", "engine", optional=True),
    Row(
        "messages.backlog_max",
        "integer",
        p.count(1, p.MAX_QUEUE),
        "messages queued at the entry before the source waits",
        "engine",
    ),
    # ---------------------------------------------------------------- [costs]
    Row(
        "costs.estimate",
        "string",
        p.cost_estimate,
        "a request's input tokens for token budgets: \"chars/4\" (a quarter of the prompt's "
        'characters) or a hook "module:function" that gets the JSON body (engine/limits/costs.py)',
        "engine",
    ),
    Row(
        "costs.max_tokens",
        "integer",
        p.count(1, p.MAX_COUNT),
        "output tokens reserved for a body that names no max_tokens",
        "engine",
    ),
    # ---------------------------------------------------------------- tables
    Row(
        "budgets",
        "budgets",
        None,
        "[[budgets]]: named limits beyond each key's own (engine/api_rules.py)",
        "engine",
    ),
    Row(
        "paths",
        "paths",
        None,
        "[paths]: weight, budgets and signing per request path (engine/api_rules.py)",
        "engine",
    ),
    Row(
        "endpoints",
        "budgets",
        None,
        "[[endpoints]]: one pool over several endpoints, each with a name, a preset, a url, its keys"
        " and the models it serves (docs/endpoints.md)",
        "engine",
    ),
    Row("pools", "pools", None, "[pools] name = connections: connection pools a request can name", "engine"),
    Row(
        "prices",
        "prices",
        None,
        '[prices."model"]: USD per million tokens (input, output; cached_input, cache_write,'
        " cache_write_1h), over the shipped config/prices tables (docs/money.md)",
        "engine",
    ),
    Row("server", "server", None, "the embedded simulator's settings (`ratedeck serve --help`)", "server"),
    # ---------------------------------------------------------------- [run]
    Row(
        "run.duration_s",
        "duration",
        p.seconds(),
        "stop after this long: seconds, or 30s, 5m, 1h",
        "runner",
        _flag("--duration", "S", check=True),
        optional=True,
        save="changed",
    ),
    Row(
        "run.report",
        "path",
        p.path,
        "write the JSON report here at the end; '-' writes it to stdout (other output goes to stderr)",
        "runner",
        _flag("--report", "FILE"),
        optional=True,
        save="changed",
    ),
    Row(
        "run.plot",
        "boolean",
        p.boolean,
        "print TPS and latency charts at the end (headless)",
        "runner",
        _flag("--plot", switch=True, commands=(RUN,)),
    ),
    Row(
        "run.max_cost",
        "dollars",
        p.dollars,
        "stop admitting requests before what was spent plus what the requests in flight may cost would"
        " pass this many US dollars; in-flight ones finish (docs/money.md)",
        "engine",
        _flag("--max-cost", "DOLLARS", check=True),
        optional=True,
        save="changed",
    ),
    Row(
        "run.dry_run",
        "boolean",
        p.boolean,
        "read and check the whole workload, print per model the requests, tokens, the cost range and"
        " the least time the limits allow; send nothing",
        "runner",
        _flag("--dry-run", switch=True, commands=(RUN,)),
        save="never",
    ),
    Row(
        "run.seed",
        "integer",
        p.count(None, None),
        "random seed for jitter and arrivals",
        "engine",
        _flag("--seed", "N", check=True),
        save="changed",
    ),
    Row(
        "run.fail_on",
        "strings",
        p.strings('threshold expressions like "rejected_429>0"'),
        "exit 99 when an expression holds over the report, like rejected_429>0, latency_ms.p99>500, "
        "throughput_tps<90 (operators > >= < <= == !=)",
        "runner",
        _flag(
            "--fail-on",
            "EXPR",
            help="exit 99 when EXPR holds over the report, like rejected_429>0, latency_ms.p99>500, "
            "throughput_tps<90 (repeatable; operators > >= < <= == !=)",
            repeat=True,
        ),
        save="changed",
        dump=list,
    ),
    Row(
        "run.results",
        "path",
        p.path,
        "JSONL file: one line per request (ending, key, status, timings, params), flushed as they end",
        "runner",
        _flag("--results", "FILE"),
        optional=True,
        save="changed",
    ),
    Row(
        "run.errors",
        "path",
        p.path,
        "JSONL file: the results lines of the requests that did not succeed, kept out of --results"
        " (a Batch API's error file)",
        "runner",
        _flag("--errors", "FILE"),
        optional=True,
        save="changed",
    ),
    Row(
        "run.results_body",
        "boolean",
        p.boolean,
        "with the response body in each results line",
        "runner",
        _flag("--results-body", switch=True),
        save="changed",
    ),
    Row(
        "run.results_id",
        "string",
        p.results_id,
        "the workload field whose value links a results line (its line_id) to its workload line:"
        ' "_id", or a line\'s own field like "custom_id" (never sent with an object _body)',
        "runner",
        _flag("--results-id", "FIELD"),
        save="changed",
    ),
    Row(
        "run.store",
        "string",
        p.path,
        "where the work lives: memory, sqlite:PATH (durable), redis://host:port/db (shared); "
        "fill it with 'ratedeck enqueue'",
        "store",
        _flag("--store", "URL", keep_empty=True),
        save="changed",
    ),
    Row(
        "run.resume",
        "boolean",
        p.boolean,
        "with a durable store: take back the jobs a killed run held (those it may have sent go again"
        " only with an Idempotency-Key or where a repeat does nothing twice, target.safe_writes; else"
        " they end uncertain); a run still at work keeps its own",
        "store",
        _flag(
            "--resume",
            help="with a durable --store: take back the jobs a killed run held (those it may have sent go"
            " again only with an Idempotency-Key or target.safe_writes, else they end uncertain); a run"
            " still at work keeps its own",
            switch=True,
        ),
        save="never",
    ),
    Row(
        "run.procs",
        "procs",
        p.procs,
        'engine processes, the keys shared out among them; "auto": one per core',
        "runner",
        _flag("--procs", "N|auto", check=True, commands=(RUN,)),
        save="changed",
    ),
    Row(
        "run.interval_s",
        "duration",
        lambda v: parse_duration(v, low=0.05, low_open=False, high=86_400.0),
        "headless: print the metrics every this many seconds (or 500ms)",
        "runner",
        _flag("--interval", "S", check=True),
        save="changed",
    ),
    Row(
        "run.metrics_port",
        "integer",
        p.count(0, 65535),
        "serve Prometheus metrics at http://HOST:PORT/metrics during the run (0: any free port)",
        "runner",
        _flag("--metrics-port", "PORT", check=True),
        save="changed",
    ),
    Row(
        "run.metrics_host",
        "string",
        p.text,
        "the address metrics_port listens on",
        "runner",
        _flag("--metrics-host", "HOST", keep_empty=True),
        save="changed",
    ),
    Row(
        "run.metrics_linger_s",
        "duration",
        lambda v: parse_duration(v, low=0.0, low_open=False, high=86_400.0),
        "after the run, keep serving the final metrics this long (30s, 2m) or until Ctrl-C",
        "runner",
        _flag("--metrics-linger", "S", check=True),
        save="changed",
    ),
    # ---------------------------------------------------------------- [gateway]
    # `ratedeck gateway` only: its flags are on no other command.
    Row(
        "gateway.listen",
        "string",
        p.nonempty,
        "HOST:PORT the gateway serves on; beyond loopback only with a token",
        "gateway",
        _flag("--listen", "HOST:PORT", help="where the gateway serves", check=True, commands=(GATEWAY,)),
        save="changed",
    ),
    Row(
        "gateway.token",
        "string",
        p.nonempty,
        "what clients present (Authorization: Bearer, x-api-key or the preset's key header):"
        " env:VAR or @FILE; unset: none asked, on loopback only",
        "gateway",
        _flag(
            "--gateway-token",
            "env:VAR|@FILE",
            help="the token clients present (Authorization: Bearer, x-api-key or the preset's key header);"
            " needed to listen beyond loopback",
            check=True,
            commands=(GATEWAY,),
        ),
        optional=True,
        save="changed",
        dump=lambda v: v if v.strip().startswith(("env:", "@")) else None,  # a literal token is never saved
    ),
    Row(
        "gateway.max_wait_s",
        "duration",
        p.seconds(),
        "how long a request may wait for the limits before a 503 with Retry-After"
        " (a client may lower it: header ratedeck-max-wait)",
        "gateway",
        _flag(
            "--max-wait",
            "S",
            help="longest a request waits for the limits, then 503 + Retry-After",
            check=True,
            commands=(GATEWAY,),
        ),
        save="changed",
    ),
    Row(
        "gateway.max_body_mb",
        "integer",
        p.count(1, 4096),
        "a request body over this many MiB is answered 413",
        "gateway",
        _flag(
            "--max-body-mb",
            "N",
            help="a request body over N MiB is answered 413",
            check=True,
            commands=(GATEWAY,),
        ),
        save="changed",
    ),
    Row(
        "gateway.header_timeout_s",
        "duration",
        p.seconds(),
        "a connection that sends no whole request head in this long (or idles that long) is closed",
        "gateway",
        _flag(
            "--header-timeout",
            "S",
            help="close a connection whose request head has not come in S",
            check=True,
            commands=(GATEWAY,),
        ),
        save="changed",
    ),
    Row(
        "gateway.body_timeout_s",
        "duration",
        p.seconds(),
        "a request body not received whole in this long is answered 408",
        "gateway",
        _flag(
            "--body-timeout",
            "S",
            help="answer 408 to a body not received in S",
            check=True,
            commands=(GATEWAY,),
        ),
        save="changed",
    ),
    Row(
        "gateway.fail_fast",
        "boolean",
        p.boolean,
        "answer 429 with Retry-After at once instead of queueing (a client may ask: header ratedeck-fail-fast: 1)",
        "gateway",
        _flag("--fail-fast", switch=True, commands=(GATEWAY,)),
        save="changed",
    ),
    Row(
        help='a line per answered request on stderr: "off", "text" or "json" (JSON lines); never a'
        " query string, keys and the gateway token masked (headless only)",
        layer="gateway",
        path="gateway.access_log",
        flag=_flag(
            "--access-log",
            choices=tuple(str(o) for o in AccessLogForm),
            help="a line per answered request on stderr: text, or json (JSON lines); --access-log alone: text",
            commands=(GATEWAY,),
            bare="text",
            check=True,
        ),
        save="changed",
        **_choice(AccessLogForm),
    ),
    # ---------------------------------------------------------------- [console]
    Row(
        "console.theme",
        "string",
        p.nonempty,
        "console theme (ratedeck-dark, ratedeck-light, ratedeck-high-contrast, or a user theme)",
        "console",
        _flag(
            "--theme", "NAME", help="console theme (ratedeck-dark, ratedeck-light, ratedeck-high-contrast)"
        ),
        optional=True,
        save="changed",
    ),
    Row(
        "console.keymap",
        "table",
        p.keymap,
        'keys for the console\'s actions: action = "key"',
        "console",
        save="changed",
    ),
)

#: The settings object each section's values land in (the rows' defaults are its fields').
FIELDS: dict[str, tuple[type, ...]] = {
    "target": (TargetConfig,),
    "engine": (EngineConfig,),
    "workload": (WorkloadConfig,),
    "messages": (MessagesConfig,),
    "costs": (CostConfig,),
    "console": (ConsoleSettings,),
    "gateway": (GatewaySettings,),
    "run": (RunnerSettings, EngineSettings),  # [run] seed is the engine's
}

BY_PATH: dict[str, Row] = {row.path: row for row in ROWS}


def section_rows(section: str) -> dict[str, Row]:
    """A section's rows by key, in the order they are declared."""
    return {row.key: row for row in ROWS if row.section == section}
