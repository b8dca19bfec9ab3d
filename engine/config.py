"""Run configuration: dataclasses, TOML loading, presets and validation.

Precedence, lowest first: built-in defaults, `--preset`, the `--config` file,
command-line flags. Every problem is raised as a `ConfigError` that names the
source, the key and the value, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ratedeck.core.errors import RatedeckError
from ratedeck.core.policy import Policy, PolicyError, format_policy, parse_policy
from ratedeck.core.seed_server import SEED_KEYS
from ratedeck.core.throttle import parse_throttle


class ConfigError(RatedeckError, ValueError):
    """A setting that cannot be used; `str()` is the whole user-facing message."""

    def __init__(self, source: str, key: str, problem: str):
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}")


@dataclass(frozen=True)
class TargetConfig:
    """Where requests go and how a key, nonce and request id travel."""

    url: str | None = None  # None: start the embedded simulator
    method: str = "GET"
    key_param: str | None = "api_key"  # query/form parameter carrying the key
    key_header: str | None = None  # or a header; wins over key_param when set
    nonce_param: str | None = "nonce"  # None: the target needs no nonce
    id_param: str | None = "req_id"
    params: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 1.0
    delay_field: str | None = None  # JSON path in error bodies holding a retry delay ("error.retryDelay")
    host_limit_match: str = "host"  # a 429 whose body says this closes the host-wide gate


@dataclass(frozen=True)
class KeySpec:
    """One API key: its id ("k1"), secret, and the policies that bind it."""

    label: str
    secret: str = field(repr=False)
    policies: tuple[Policy, ...]


@dataclass(frozen=True)
class EngineConfig:
    """How the engine paces, retries and queues."""

    in_flight_per_key: int = 8
    headroom: str | float = "adaptive"  # "adaptive" or fixed milliseconds
    headroom_initial_ms: float = 100.0
    headroom_min_ms: float = 1.0  # timers and server stamps have about 1 ms grain
    headroom_max_ms: float = 500.0
    rejection_budget: int = 0  # 429s the user can afford while learning headroom
    pacing: str = "even"  # "even": spread sends across the window; "burst": window only
    max_attempts: int = 5
    backoff_base_ms: float = 50.0
    backoff_cap_ms: float = 2000.0
    queue_max: int = 50
    backpressure: bool = True
    ttl_s: float = 1.0
    drain_timeout_s: float = 2.0
    graveyard_path: str = "ratedeck-graveyard.jsonl"
    cooldown: str = "shared"  # "shared": a delay pauses every sender of the budget; "per-request": only the rejected request waits (the pre-actor design, for comparison)
    learn_policy: bool = True  # adopt tighter limits the server advertises (RateLimit-Policy)


@dataclass(frozen=True)
class WorkloadConfig:
    """Where requests come from."""

    rate: float | None = None  # requests/s; None: the keys' total capacity
    arrival: str = "constant"  # or "poisson"
    file: str | None = None  # JSONL of requests (one object per line) instead of generating
    total: int | None = None  # stop generating after this many


@dataclass(frozen=True)
class MessagesConfig:
    """Messages that need several calls each, behind an entry throttle (see engine/messages.py)."""

    calls: int = 1  # calls a message needs; it completes only when all succeed
    pattern: str = "parallel"  # or "sequential": each call after the previous one succeeded
    throttle: str | float = "off"  # "off", "auto" (live capacity / calls) or messages per second
    excess: str = "queue"  # what the throttle does with the rest: "queue", "shed" or "sample"
    sample_fraction: float = 1.0  # with excess = "sample": the fraction of arrivals processed
    shed_path: str | None = "ratedeck-shed.jsonl"  # one JSON line per shed message
    backlog_max: int = 1000  # messages queued at the entry before the source waits


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs. `keys` hold secrets: never print them."""

    target: TargetConfig = field(default_factory=TargetConfig)
    keys: tuple[KeySpec, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    server: dict[str, Any] = field(default_factory=dict)  # embedded simulator settings
    duration_s: float | None = None
    report: str | None = None
    plot: bool = False
    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    preset: str | None = None
    key_sources: tuple[str, ...] = ()  # as written: literal, env:VAR or @FILE
    host_policies: tuple[Policy, ...] = ()  # limits shared by all keys (one budget for the host)
    pools: dict[str, int] = field(default_factory=dict)  # connection pool name -> capacity
    messages: MessagesConfig | None = None  # [messages]: multi-call messages instead of requests

    @property
    def capacity_tps(self) -> float:
        """Requests per second all keys allow together (tightest policy per key, and the host's)."""
        total = sum(min(p.rate for p in k.policies) for k in self.keys if k.policies)
        if self.host_policies:
            total = min(total, min(p.rate for p in self.host_policies))
        return total

    @property
    def arrival_rate(self) -> float:
        return self.workload.rate if self.workload.rate is not None else self.capacity_tps


# ---------------------------------------------------------------- presets

PRESETS: dict[str, dict[str, Any]] = {
    # Behaves like the seed's client setup, against the seed-compatible simulator.
    "seed": {
        "target": {
            "method": "GET",
            "key_param": "api_key",
            "nonce_param": "nonce",
            "id_param": "req_id",
            "timeout_s": 1.0,
        },
        "keys": {"secrets": list(SEED_KEYS), "limits": ["20/1s"]},
        "engine": {"ttl_s": 1.0, "rejection_budget": 0, "queue_max": 50},
        "server": {"mode": "seed"},
    },
}


# ---------------------------------------------------------------- loading


def load_config(
    path: str | None = None, preset: str | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Build a `RunConfig` from a preset, a TOML file and flag overrides.

    With nothing given, the "seed" preset is used, so the first run works
    against the embedded simulator.
    """
    data: dict[str, Any] = {}
    file_data = read_toml(path) if path is not None else {}
    if preset is None:
        preset = file_data.pop("preset", None)
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(str(path), "preset", f'must be a preset name like "seed", got {preset!r}')
    else:
        file_data.pop("preset", None)
    if preset is None and path is None:
        preset = "seed"
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError("--preset", "preset", f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        _merge(data, PRESETS[preset])
    source = "command line"
    if path is not None:
        source = str(path)
        _merge(data, file_data)
    if overrides:
        _merge(data, overrides)
    return replace(build_config(data, source), preset=preset)


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file, turning every failure into a `ConfigError`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(p), "file", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(str(p), "file", "is a directory, not a TOML file") from None
    except PermissionError:
        raise ConfigError(str(p), "file", "permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), "file", f"not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(str(p), "file", "not valid UTF-8 text") from None


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Deep-merge `new` into `into`, copying so the sources (presets) never change."""
    for k, v in new.items():
        if isinstance(v, dict):
            if not isinstance(into.get(k), dict):
                into[k] = {}
            _merge(into[k], v)
        elif isinstance(v, list):
            into[k] = list(v)
        else:
            into[k] = v


_SECTIONS = {
    "preset",
    "target",
    "keys",
    "engine",
    "workload",
    "server",
    "run",
    "console",
    "messages",
    "pools",
}


def build_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a plain dict (as read from TOML) into a `RunConfig`."""
    for name in data:
        if name not in _SECTIONS:
            raise ConfigError(
                source, name, f"unknown section; expected one of {', '.join(sorted(_SECTIONS))}"
            )
        if name == "preset":
            continue
        if not isinstance(data[name], dict):
            raise ConfigError(source, name, "must be a table, like [" + name + "]")
    v = _Validator(source)
    target = v.dataclass_from(TargetConfig, data.get("target", {}), "target")
    if target.method.upper() not in ("GET", "POST"):
        raise ConfigError(source, "target.method", f"must be GET or POST, got {target.method!r}")
    target = replace(target, method=target.method.upper())
    if target.url is not None and not target.url.startswith(("http://", "https://")):
        raise ConfigError(source, "target.url", f"must start with http:// or https://, got {target.url!r}")
    if target.timeout_s <= 0:
        raise ConfigError(source, "target.timeout_s", f"must be above 0, got {target.timeout_s}")
    if not target.key_header and not target.key_param:
        raise ConfigError(source, "target", "set key_param or key_header so the key reaches the server")
    engine = v.dataclass_from(EngineConfig, data.get("engine", {}), "engine")
    _check_engine(engine, source)
    workload = v.dataclass_from(WorkloadConfig, data.get("workload", {}), "workload")
    if workload.rate is not None and workload.rate < 0:
        raise ConfigError(source, "workload.rate", f"must be 0 or more, got {workload.rate}")
    if workload.arrival not in ("constant", "poisson"):
        raise ConfigError(
            source, "workload.arrival", f"must be 'constant' or 'poisson', got {workload.arrival!r}"
        )
    if workload.file is not None and not Path(workload.file).is_file():
        raise ConfigError(source, "workload.file", f"no such file: {workload.file}")
    if workload.total is not None and workload.total < 0:
        raise ConfigError(source, "workload.total", f"must be 0 or more, got {workload.total}")
    keys = _keys(data.get("keys", {}), source)
    key_sources = data.get("keys", {}).get("secrets", [])
    key_sources = (key_sources,) if isinstance(key_sources, str) else tuple(key_sources)
    run = data.get("run", {})
    console = data.get("console", {})
    for k in run:
        if k not in ("duration_s", "report", "plot", "seed"):
            raise ConfigError(
                source, f"run.{k}", "unknown setting; expected duration_s, report, plot or seed"
            )
    for k in console:
        if k not in ("theme", "keymap"):
            raise ConfigError(source, f"console.{k}", "unknown setting; expected theme or keymap")
    duration = run.get("duration_s")
    if duration is not None and (
        not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0
    ):
        raise ConfigError(source, "run.duration_s", f"must be a number of seconds above 0, got {duration!r}")
    keymap = console.get("keymap", {})
    if not isinstance(keymap, dict) or not all(isinstance(x, str) for x in keymap.values()):
        raise ConfigError(source, "console.keymap", 'must be a table of action = "key" strings')
    server = data.get("server", {})
    host_raw = data.get("keys", {}).get("host_limits", [])
    host_policies = _policies(host_raw, source, "keys.host_limits") if host_raw else ()
    pools = _pools(data.get("pools", {}), source)
    messages = None
    if "messages" in data:
        messages = v.dataclass_from(MessagesConfig, data["messages"], "messages")
        _check_messages(messages, source)
    return RunConfig(
        target=target,
        keys=keys,
        engine=engine,
        workload=workload,
        server=dict(server),
        duration_s=float(duration) if duration is not None else None,
        report=run.get("report"),
        plot=bool(run.get("plot", False)),
        theme=console.get("theme"),
        keymap=dict(keymap),
        seed=run.get("seed"),
        key_sources=key_sources,
        messages=messages,
        host_policies=host_policies,
        pools=pools,
    )


def _check_engine(e: EngineConfig, source: str) -> None:
    def bad(key: str, problem: str):
        raise ConfigError(source, f"engine.{key}", problem)

    if e.in_flight_per_key < 1:
        bad("in_flight_per_key", f"must be at least 1, got {e.in_flight_per_key}")
    if isinstance(e.headroom, str) and e.headroom != "adaptive":
        bad("headroom", f'must be "adaptive" or milliseconds, got {e.headroom!r}')
    if not isinstance(e.headroom, str) and e.headroom < 0:
        bad("headroom", f"must be 0 ms or more, got {e.headroom}")
    if not 0 <= e.headroom_min_ms <= e.headroom_max_ms:
        bad(
            "headroom_min_ms",
            f"need 0 <= headroom_min_ms <= headroom_max_ms, got {e.headroom_min_ms} and {e.headroom_max_ms}",
        )
    if e.rejection_budget < 0:
        bad("rejection_budget", f"must be 0 or more, got {e.rejection_budget}")
    if e.pacing not in ("even", "burst"):
        bad("pacing", f"must be 'even' or 'burst', got {e.pacing!r}")
    if e.max_attempts < 1:
        bad("max_attempts", f"must be at least 1, got {e.max_attempts}")
    if e.backoff_base_ms < 0 or e.backoff_cap_ms < e.backoff_base_ms:
        bad("backoff_cap_ms", "need 0 <= backoff_base_ms <= backoff_cap_ms")
    if e.queue_max < 1:
        bad("queue_max", f"must be at least 1, got {e.queue_max}")
    if e.ttl_s <= 0:
        bad("ttl_s", f"must be above 0 seconds, got {e.ttl_s}")
    if e.drain_timeout_s < 0:
        bad("drain_timeout_s", f"must be 0 or more, got {e.drain_timeout_s}")
    if e.cooldown not in ("shared", "per-request"):
        bad("cooldown", f"must be 'shared' or 'per-request', got {e.cooldown!r}")


def _check_messages(m: MessagesConfig, source: str) -> None:
    def bad(key: str, problem: str):
        raise ConfigError(source, f"messages.{key}", problem)

    if m.calls < 1:
        bad("calls", f"must be at least 1, got {m.calls}")
    if m.pattern not in ("parallel", "sequential"):
        bad("pattern", f"must be 'parallel' or 'sequential', got {m.pattern!r}")
    try:
        parse_throttle(m.throttle)
    except ValueError as exc:
        bad("throttle", str(exc))
    if m.excess not in ("queue", "shed", "sample"):
        bad("excess", f"must be 'queue', 'shed' or 'sample', got {m.excess!r}")
    if not 0.0 < m.sample_fraction <= 1.0:
        bad("sample_fraction", f"must be above 0 and at most 1, got {m.sample_fraction}")
    if m.backlog_max < 1:
        bad("backlog_max", f"must be at least 1, got {m.backlog_max}")


class _Validator:
    """Turns a TOML table into a dataclass, checking names and types."""

    def __init__(self, source: str):
        self.source = source

    def dataclass_from(self, cls, table: dict[str, Any], section: str):
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in table.items():
            if name not in known:
                raise ConfigError(
                    self.source, f"{section}.{name}", f"unknown setting; known: {', '.join(known)}"
                )
            values[name] = self._coerce(known[name], value, f"{section}.{name}")
        return cls(**values)

    def _coerce(self, f, value, where: str):
        kind = str(f.type)
        default = f.default
        if value == "" and "None" in kind:
            return None  # an empty string switches an optional setting off
        if kind.startswith("dict"):
            if not isinstance(value, dict):
                raise ConfigError(self.source, where, f"must be a table, got {value!r}")
            return {str(k): str(v) for k, v in value.items()}
        if isinstance(default, bool) or kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(self.source, where, f"must be true or false, got {value!r}")
            return value
        if "str | float" in kind:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):
                return value
        elif "float" in kind:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise ConfigError(self.source, where, f"must be a number, got {value!r}")
        elif "int" in kind:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise ConfigError(self.source, where, f"must be a whole number, got {value!r}")
        elif "str" in kind:
            if isinstance(value, str):
                return value
            raise ConfigError(self.source, where, f"must be a string, got {value!r}")
        raise ConfigError(self.source, where, f"has an unusable value {value!r}")


def _keys(table: dict[str, Any], source: str) -> tuple[KeySpec, ...]:
    for k in table:
        if k not in ("secrets", "limits", "limits_by_key", "host_limits"):
            raise ConfigError(
                source, f"keys.{k}", "unknown setting; expected secrets, limits, limits_by_key or host_limits"
            )
    raw = table.get("secrets", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise ConfigError(source, "keys.secrets", "must be a list of strings (literal, env:VAR or @FILE)")
    secrets: list[str] = []
    for i, item in enumerate(raw):
        secrets.extend(resolve_secrets(item, source, f"keys.secrets[{i}]"))
    if not secrets:
        raise ConfigError(source, "keys.secrets", "no API keys given; set keys.secrets or --keys")
    if len(set(secrets)) != len(secrets):
        raise ConfigError(source, "keys.secrets", "the same key is listed twice")
    default = _policies(table.get("limits", ["20/1s"]), source, "keys.limits")
    by_key = table.get("limits_by_key", {})
    if not isinstance(by_key, dict):
        raise ConfigError(source, "keys.limits_by_key", 'must be a table like k2 = ["10/1s"]')
    labels = [f"k{i + 1}" for i in range(len(secrets))]
    for label in by_key:
        if label not in labels:
            raise ConfigError(
                source, f"keys.limits_by_key.{label}", f"no such key; keys are k1..k{len(secrets)}"
            )
    return tuple(
        KeySpec(
            label,
            secret,
            _policies(by_key[label], source, f"keys.limits_by_key.{label}") if label in by_key else default,
        )
        for label, secret in zip(labels, secrets, strict=False)
    )


def _pools(table: dict[str, Any], source: str) -> dict[str, int]:
    """[pools] name = capacity: connection pools a request can name."""
    pools = {}
    for name, capacity in table.items():
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(
                source, f"pools.{name}", f"must be a whole number of connections >= 1, got {capacity!r}"
            )
        pools[str(name)] = capacity
    return pools


def _policies(value: Any, source: str, where: str) -> tuple[Policy, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(source, where, 'must be a list of limits like ["20/1s", "600/1m"]')
    try:
        return tuple(parse_policy(v) for v in value)
    except PolicyError as exc:
        raise ConfigError(source, where, str(exc)) from None


def resolve_secrets(item: str, source: str, where: str) -> list[str]:
    """A literal key, `env:VAR` (comma-separated keys in it) or `@FILE` (one per line)."""
    item = item.strip()
    if item.startswith("env:"):
        var = item[4:]
        value = os.environ.get(var)
        if not value:
            raise ConfigError(source, where, f"environment variable {var} is not set or empty")
        return [s.strip() for s in value.split(",") if s.strip()]
    if item.startswith("@"):
        path = Path(item[1:])
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(source, where, f"cannot read key file {path}: {exc.strerror or exc}") from None
        keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not keys:
            raise ConfigError(source, where, f"key file {path} has no keys")
        return keys
    if not item:
        raise ConfigError(source, where, "an empty key")
    return [item]


# ---------------------------------------------------------------- saving


def to_toml_dict(cfg: RunConfig, *, include_secrets: bool = False) -> dict[str, Any]:
    """The effective config as a TOML-ready dict that `load_config` reads back.

    Keys given as `env:VAR` or `@FILE` are saved as written; literal keys are
    saved as `env:RATEDECK_KEYS` unless `include_secrets`, so a saved profile
    never leaks a key. A run on a preset's keys saves `preset = NAME` instead.
    """
    target = {k: v for k, v in asdict(cfg.target).items() if v is not None}
    engine = asdict(cfg.engine)
    workload = {k: v for k, v in asdict(cfg.workload).items() if v is not None}
    default = cfg.keys[0].policies if cfg.keys else ()
    preset_keys = PRESETS.get(cfg.preset or "", {}).get("keys", {}).get("secrets")
    if include_secrets:
        secrets = [k.secret for k in cfg.keys]
    elif preset_keys is not None and list(cfg.key_sources) == list(preset_keys):
        secrets = None  # the preset supplies them
    elif cfg.key_sources and all(s.startswith(("env:", "@")) for s in cfg.key_sources):
        secrets = list(cfg.key_sources)
    else:
        secrets = ["env:RATEDECK_KEYS"]
    keys: dict[str, Any] = {"limits": [format_policy(p) for p in default]}
    if secrets is not None:
        keys["secrets"] = secrets
    by_key = {k.label: [format_policy(p) for p in k.policies] for k in cfg.keys if k.policies != default}
    if by_key:
        keys["limits_by_key"] = by_key
    if cfg.host_policies:
        keys["host_limits"] = [format_policy(p) for p in cfg.host_policies]
    out: dict[str, Any] = {"preset": cfg.preset} if cfg.preset else {}
    out |= {"target": target, "keys": keys, "engine": engine, "workload": workload}
    if cfg.server:
        out["server"] = dict(cfg.server)
    if cfg.pools:
        out["pools"] = dict(cfg.pools)
    run = {
        k: v
        for k, v in (
            ("duration_s", cfg.duration_s),
            ("report", cfg.report),
            ("plot", cfg.plot),
            ("seed", cfg.seed),
        )
        if v is not None
    }
    if run:
        out["run"] = run
    console = {k: v for k, v in (("theme", cfg.theme), ("keymap", cfg.keymap or None)) if v is not None}
    if console:
        out["console"] = console
    if cfg.messages is not None:
        out["messages"] = {k: v for k, v in asdict(cfg.messages).items() if v is not None}
    return out
