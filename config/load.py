"""Loading: presets, the TOML file and flag overrides merged, then checked row by row.

Precedence, lowest first: built-in defaults, `--preset`, the `--config` file,
command-line flags. Every problem is raised as a `ConfigError` that names the
source, the key and the value, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ratedeck.core.numbers import SettingError, check_simulator_numbers, show
from ratedeck.core.policy import Policy
from ratedeck.core.secrets import safe_url
from ratedeck.core.study_server import STUDY, current_name
from ratedeck.engine.api_rules import BudgetSpec, PathRule, parse_budgets, parse_paths
from ratedeck.engine.settings import (
    ConfigError,
    CostConfig,
    EndpointSpec,
    EngineConfig,
    EngineSettings,
    KeySpec,
    MessagesConfig,
    TargetConfig,
    WorkloadConfig,
)

from . import parsers
from .clients import parse_clients
from .endpoints import build_endpoints, endpoint_presets
from .pricing import load_prices
from .rows import BY_PATH, ROWS, section_rows
from .settings import ConsoleSettings, GatewayClient, GatewaySettings, RunConfig, RunnerSettings

# ---------------------------------------------------------------- presets

#: The presets: one TOML file each, a `description` line, whether it `speaks_simulator`
#: (the embedded simulator's conventions) and config tables; "study" first.
PRESET_DIR = Path(__file__).parent / "presets"
#: The preset a run starts from when it names no target: the embedded simulator's.
DEMO_PRESET = STUDY
#: What a preset file says of itself, beside its settings.
PRESET_META = ("description", "speaks_simulator")


def _load_presets() -> tuple[dict[str, dict[str, Any]], dict[str, str], frozenset[str]]:
    """Every preset by name, a line saying what each is, and those that speak the embedded
    simulator's conventions (the files ship with the package)."""
    presets: dict[str, dict[str, Any]] = {}
    descriptions: dict[str, str] = {}
    simulator: set[str] = set()
    files = sorted(PRESET_DIR.glob("*.toml"), key=lambda f: (f.stem != DEMO_PRESET, f.stem))
    for file in files:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
        descriptions[file.stem] = str(data.pop("description", ""))
        if data.pop("speaks_simulator", False) is True:
            simulator.add(file.stem)
        presets[file.stem] = data
    return presets, descriptions, frozenset(simulator)


PRESETS, PRESET_DESCRIPTIONS, SIMULATOR_PRESETS = _load_presets()


# ---------------------------------------------------------------- loading
def load_config(
    path: str | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    keys_needed: bool = True,
) -> RunConfig:
    """Build a `RunConfig` from a preset, a TOML file and flag overrides.

    With no target named (by a flag or the file) and no preset, the "seed"
    preset is the base, so the first run, and a first small config file, work
    against the embedded simulator. The seed preset's demo keys are never sent
    to a target the user named unless the user chose that preset: a target
    with no keys is a `ConfigError` ("no API keys given"). A bad `--target` is
    reported as such before the keys are looked at. `keys_needed=False` (for
    `ratedeck enqueue`, which sends nothing) reads no keys at all.
    """
    data: dict[str, Any] = {}
    file_data = read_toml(path) if path is not None else {}
    preset_flag = preset is not None
    if preset is None:
        preset = file_data.pop("preset", None)
        if preset is not None and not isinstance(preset, str):
            raise ConfigError(str(path), "preset", f'must be a preset name like "seed", got {show(preset)}')
    else:
        file_data.pop("preset", None)
    preset = current_name("preset", preset)
    presets: list[str] = []
    if "endpoints" in file_data:  # a pool of endpoints: the first one's preset is the base
        presets = endpoint_presets(file_data["endpoints"], str(path), PRESETS)
        _check_pool_flags(file_data, overrides, str(path), preset, presets[0], preset_flag=preset_flag)
        preset = presets[0]
    named_target = isinstance(overrides, dict) and bool((overrides.get("target") or {}).get("url"))
    file_target = file_data.get("target")
    file_names_target = isinstance(file_target, dict) and bool(file_target.get("url"))
    # With no target named (by a flag or the file), the seed preset drives the
    # embedded simulator, under whatever the file sets; a target the user names
    # with no preset gets the neutral defaults instead (no nonce, no request id,
    # the key as a Bearer token), never the seed server's ways.
    implicit = preset is None and not named_target and not file_names_target
    if implicit:
        preset = DEMO_PRESET
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ConfigError(
                "--preset", "preset", f"unknown preset {show(preset)}; known: {', '.join(PRESETS)}"
            )
        _merge(data, PRESETS[preset])
    source = "command line"
    if path is not None:
        source = str(path)
        _merge(data, file_data)
    if overrides:
        if not isinstance(overrides, dict):
            raise ConfigError("command line", "overrides", f"must be a table, got {show(overrides)}")
        _merge(data, overrides)
    if named_target:
        try:
            parsers.url(overrides["target"]["url"])  # type: ignore[index]
        except ValueError as exc:
            raise ConfigError("command line", "--target", str(exc)) from None
    user_target = None  # the file's and flags' own [target], for each endpoint of a pool
    if "endpoints" in data:
        user_target = {**(file_data.get("target") or {}), **((overrides or {}).get("target") or {})}
        user_costs = {**(file_data.get("costs") or {}), **((overrides or {}).get("costs") or {})}
        if "max_tokens" not in user_costs:  # a body without max_tokens: the largest any endpoint reserves
            reserved = [(PRESETS[p].get("costs") or {}).get("max_tokens") for p in presets]
            counts = [n for n in reserved if isinstance(n, int)]
            if counts and len(counts) == len(reserved):
                data.setdefault("costs", {})["max_tokens"] = max(counts)
    elif keys_needed and named_target and not (data.get("keys") or {}).get("secrets"):
        raise ConfigError(
            "command line",
            "--keys",
            f"no API keys given for {safe_url(data['target']['url'])}; pass --keys "
            "(the study demo keys are only for the embedded simulator or --preset study)",
        )
    cfg = build_config(data, source, keys_needed=keys_needed, user_target=user_target)
    return cfg.replace(
        preset=preset, preset_needs_target=preset is not None and preset not in SIMULATOR_PRESETS
    )


def _check_pool_flags(
    file_data: dict[str, Any],
    overrides: dict[str, Any] | None,
    source: str,
    preset: str | None,
    first: str,
    *,
    preset_flag: bool = False,
) -> None:
    """With [[endpoints]], each endpoint names its URL and keys: a --target, --keys, [target]
    url or [keys] secrets would be a second, unnamed one."""
    given = overrides if isinstance(overrides, dict) else {}
    if (given.get("target") or {}).get("url"):
        raise ConfigError(
            "command line", "--target", f"{source} lists [[endpoints]]: give each its url there"
        )
    if (given.get("keys") or {}).get("secrets"):
        raise ConfigError("command line", "--keys", f"{source} lists [[endpoints]]: give each its keys there")
    if (file_data.get("target") or {}).get("url") if isinstance(file_data.get("target"), dict) else False:
        raise ConfigError(source, "target.url", "the config lists [[endpoints]]: give each endpoint its url")
    if (file_data.get("keys") or {}).get("secrets") if isinstance(file_data.get("keys"), dict) else False:
        raise ConfigError(
            source, "keys.secrets", "the config lists [[endpoints]]: give each endpoint its keys"
        )
    if preset is not None and preset != first:
        raise ConfigError(
            "command line" if preset_flag else source,
            "--preset" if preset_flag else "preset",
            f"{source} lists [[endpoints]]: the pool's presets are its endpoints' ({first} first), not {preset!r}",
        )


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file, turning every failure into a `ConfigError`."""
    try:
        p = Path(path)
        shown = str(p)
    except (TypeError, ValueError):
        raise ConfigError(show(path), "file", "is not a file name") from None
    try:
        if p.is_dir():
            raise ConfigError(shown, "file", "is a directory, not a TOML file")
        if p.exists() and not p.is_file():
            raise ConfigError(shown, "file", "is not a regular file")
        if p.exists() and p.stat().st_size > _MAX_FILE_BYTES:
            raise ConfigError(
                shown, "file", f"is larger than {_MAX_FILE_BYTES // 1_000_000} MB; not a config"
            )
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(shown, "file", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(shown, "file", "is a directory, not a TOML file") from None
    except PermissionError:
        raise ConfigError(shown, "file", "permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(shown, "file", f"not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(shown, "file", "not valid UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(shown, "file", f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the name
        raise ConfigError(shown, "file", f"cannot read: {exc}") from None


_MAX_FILE_BYTES = 10_000_000


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


#: The config file's top-level names: every row's section (or the row, for a whole table).
_SECTIONS = {row.section or row.path for row in ROWS}


def parse_setting(key: str, value: Any) -> Any:
    """One setting ("engine.ttl_s", "run.duration_s", ...) checked as the config file checks it.

    For flags that set one config value: the same parser, range and message.
    Raises ValueError with the problem; the caller names the flag. An empty
    string switches an optional [run] or [console] setting off.
    """
    row = BY_PATH.get(key)
    if row is None or row.parse is None:
        raise KeyError(key)
    if row.section in ("run", "console"):
        return row.read(value)
    return row.parse(value)


def _table(data: dict[str, Any], section: str, source: str) -> dict[str, Any]:
    """A section's values checked by its rows; an unknown name is a `ConfigError` listing the known."""
    rows = section_rows(section)
    out = {}
    for name, value in data.get(section, {}).items():
        row = rows.get(name)
        where = f"{section}.{name}"
        if row is None:
            listed = ", ".join(rows)
            problem = f"unknown setting; expected {listed}" if section in ("run", "console") else None
            raise ConfigError(source, where, problem or f"unknown setting; known: {listed}")
        try:
            out[name] = row.read(value)
        except ValueError as exc:
            raise ConfigError(source, where, str(exc)) from None
    return out


def build_config(
    data: dict[str, Any],
    source: str = "config",
    *,
    keys_needed: bool = True,
    user_target: dict[str, Any] | None = None,
) -> RunConfig:
    """Validate a plain dict (as read from TOML) into a `RunConfig`.

    Any value of any type in any field gives a `RunConfig` or one `ConfigError`.
    `keys_needed=False`: the [keys] secrets are neither read nor required (no keys).
    `user_target`: with [[endpoints]], the [target] settings the user gave (not a preset's),
    which go on every endpoint (None: those in `data`, less the url).
    """
    _check_sections(data, source)
    endpoints: tuple[EndpointSpec, ...] = ()
    pool_keys: tuple[KeySpec, ...] = ()
    if "endpoints" in data:
        endpoint_presets(data["endpoints"], source, PRESETS)
        if user_target is None:
            user_target = {k: v for k, v in data.get("target", {}).items() if k != "url"}
        endpoints, pool_keys = build_endpoints(
            data["endpoints"], source, PRESETS, user_target, _target, keys_needed=keys_needed
        )
        data = {**data, "target": {**data.get("target", {}), "url": endpoints[0].target.url}}
    target = endpoints[0].target if endpoints else _target(data, source)
    engine = EngineConfig(**_table(data, "engine", source))
    _check_engine(engine, source)
    workload = WorkloadConfig(**_table(data, "workload", source))
    if workload.file is not None and not _is_file(workload.file):
        raise ConfigError(source, "workload.file", f"no such file: {workload.file}")
    keys_table = data.get("keys", {}) if keys_needed else {}
    if endpoints:
        keys = pool_keys
    elif keys_needed:
        keys = parsers.keys(keys_table, source, BY_PATH["keys.limits"].default)
    else:
        keys = ()
    key_sources = keys_table.get("secrets", [])
    key_sources = (key_sources,) if isinstance(key_sources, str) else tuple(key_sources)
    run = _table(data, "run", source)
    console = _table(data, "console", source)
    server = _server(data, source)
    host_policies: tuple[Policy, ...] = ()
    if "host_limits" in keys_table and keys_table["host_limits"] != []:
        host_policies = parsers.policies(keys_table["host_limits"], source, "keys.host_limits")
    pools = parsers.pools(data.get("pools", {}), source)
    budgets, paths = _budgets_and_paths(data, source)
    if endpoints and (host_policies or any(b.scope == "host" for b in budgets)):
        raise ConfigError(
            source,
            "keys.host_limits" if host_policies else "budgets",
            "a limit for the whole host holds for one host; the pool's endpoints are several "
            "(give each endpoint's limits in its models)",
        )
    _check_signing(target, keys, source)
    costs = CostConfig(**_table(data, "costs", source))
    messages = None
    if "messages" in data:
        messages = MessagesConfig(**_table(data, "messages", source))
    seed = run.pop("seed", None)
    max_cost = run.pop("max_cost", None)
    prices = dict(load_prices(data, source).prices)
    return RunConfig(
        engine_settings=EngineSettings(
            target=target,
            keys=keys,
            engine=engine,
            workload=workload,
            messages=messages,
            budgets=budgets,
            costs=costs,
            paths=paths,
            pools=pools,
            host_policies=host_policies,
            key_weighted=keys_table.get("unit") == "weight",
            key_per_model=keys_table.get("scope") == "key+model",
            seed=seed,
            prices=prices,
            max_cost=max_cost,
            endpoints=endpoints,
        ),
        runner=RunnerSettings(key_sources=key_sources, **run),
        console=ConsoleSettings(**console),
        gateway=_gateway(data, source, budgets, prices),
        server=server,
    )


def _gateway(
    data: dict[str, Any], source: str, budgets: tuple[BudgetSpec, ...], prices: dict[str, Any]
) -> GatewaySettings:
    """[gateway], with its `[[gateway.clients]]` (config/clients.py)."""
    table = data.get("gateway", {})
    clients: tuple[GatewayClient, ...] = ()
    if "clients" in table:
        table = dict(table)
        clients = parse_clients(
            table.pop("clients"), source, counts_tokens=any(b.tokens for b in budgets), priced=bool(prices)
        )
    return GatewaySettings(**_table({"gateway": table}, "gateway", source), clients=clients)


def _check_sections(data: Any, source: str) -> None:
    """`data` is a table of known sections, each a table (`[[budgets]]` a list of them)."""
    if not isinstance(data, dict):
        raise ConfigError(source, "config", f"must be a table, got {show(data)}")
    for name in data:
        if name not in _SECTIONS:
            raise ConfigError(
                source, str(name), f"unknown section; expected one of {', '.join(sorted(_SECTIONS))}"
            )
        if name in ("preset", "budgets", "endpoints"):  # [[budgets]], [[endpoints]]: lists of tables
            continue
        if not isinstance(data[name], dict):
            raise ConfigError(source, name, "must be a table, like [" + name + "]")


def _target(data: dict[str, Any], source: str) -> TargetConfig:
    """[target], checked: the key reaches the server one way, the probe and TLS files make sense."""
    target = TargetConfig(**_table(data, "target", source))
    if not target.key_header and not target.key_param:
        raise ConfigError(source, "target", "set key_param or key_header so the key reaches the server")
    _check_probe(target, source)
    _check_tls(target, source)
    if target.url and target.key_header and target.key_header.lower() == "authorization":
        creds = urlsplit(target.url)
        if creds.username or creds.password:
            raise ConfigError(
                source,
                "target.url",
                "carries user:password and the key goes in the Authorization header; "
                "use one (--key-header/--key-param to send the key elsewhere)",
            )
    return target


def _server(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The embedded simulator's [server] table, its numbers checked (the simulator reads the rest)."""
    server = data.get("server", {})
    if isinstance(server, dict) and "mode" in server:
        server = {**server, "mode": current_name("mode", server["mode"])}
    try:
        check_simulator_numbers(server)
    except SettingError as exc:
        raise ConfigError(source, f"server.{exc.name}", exc.problem) from None
    return dict(server)


def _budgets_and_paths(
    data: dict[str, Any], source: str
) -> tuple[tuple[BudgetSpec, ...], tuple[PathRule, ...]]:
    """[[budgets]] and [paths]; a path may name only the budgets declared."""
    try:
        budgets = parse_budgets(data.get("budgets", []))
    except ValueError as exc:
        raise ConfigError(source, "budgets", str(exc)) from None
    try:
        paths = parse_paths(data.get("paths", {}), {b.name for b in budgets})
    except ValueError as exc:
        raise ConfigError(source, "paths", str(exc)) from None
    return budgets, paths


def _check_signing(target: TargetConfig, keys: tuple[KeySpec, ...], source: str) -> None:
    """A signing recipe needs a secret with every key ("KEY SECRET" lines)."""
    if target.signing is None:
        return
    missing = [k.label for k in keys if not k.api_secret]
    if missing:
        raise ConfigError(
            source,
            "keys.secrets",
            f'signing {target.signing!r} needs a secret with every key (write "KEY SECRET"); '
            f"{', '.join(missing[:5])} {'has' if len(missing) == 1 else 'have'} none",
        )


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _check_probe(t: TargetConfig, source: str) -> None:
    """A probe never goes to the rate-limited path: it would spend the budget it measures for."""
    if t.probe_url is None or t.url is None:
        return
    probe, target = urlsplit(t.probe_url), urlsplit(t.url)
    same = (probe.scheme, probe.hostname, probe.port, probe.path.rstrip("/")) == (
        target.scheme,
        target.hostname,
        target.port,
        target.path.rstrip("/"),
    )
    if same:
        raise ConfigError(
            source,
            "target.probe_url",
            "is the rate-limited target itself; give a cheap endpoint that costs nothing, like /health",
        )


def _check_tls(t: TargetConfig, source: str) -> None:
    """The TLS files load now, so a wrong path or a key that does not match is one line
    naming the setting, not an error on every attempt."""
    import ssl

    if t.client_key and not t.client_cert:
        raise ConfigError(source, "target.client_key", "is set without target.client_cert")
    try:
        context = ssl.create_default_context(cafile=t.ca_file) if t.ca_file else None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(source, "target.ca_file", f"cannot load {show(t.ca_file)}: {_why(exc)}") from None
    if t.client_cert:
        try:
            (context or ssl.create_default_context()).load_cert_chain(t.client_cert, t.client_key or None)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                source, "target.client_cert", f"cannot load {show(t.client_cert)}: {_why(exc)}"
            ) from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return getattr(exc, "reason", None) or type(exc).__name__


def _check_engine(e: EngineConfig, source: str) -> None:
    if not e.headroom_min_ms <= e.headroom_initial_ms <= e.headroom_max_ms:
        raise ConfigError(
            source,
            "engine.headroom_initial_ms",
            "need headroom_min_ms <= headroom_initial_ms <= headroom_max_ms, got "
            f"{e.headroom_min_ms:g}, {e.headroom_initial_ms:g} and {e.headroom_max_ms:g}",
        )
    if e.backoff_cap_ms < e.backoff_base_ms:
        raise ConfigError(
            source,
            "engine.backoff_cap_ms",
            f"need backoff_base_ms <= backoff_cap_ms, got {e.backoff_base_ms:g} and {e.backoff_cap_ms:g}",
        )
