"""Saving: the settings in force as a TOML-ready dict that loads back to the same settings."""

from __future__ import annotations

from enum import Enum
from typing import Any

from ratedeck.core.policy import format_policy
from ratedeck.engine.api_rules import budgets_to_toml, paths_to_toml

from .load import PRESETS
from .rows import Row, section_rows
from .settings import RunConfig


def _value(row: Row, value: Any) -> Any:
    if row.dump is not None:
        return row.dump(value)
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _section(section: str, obj: Any) -> dict[str, Any]:
    """A section's settings as a TOML table, by its rows.

    TOML has no null: an optional setting that is off is left out when off is
    its default, and written as "" (which switches it off) when it is not, so
    a saved `nonce_param = None` never comes back as "nonce". A row saved
    "changed" is left out at its default; "never" is never written.
    """
    out: dict[str, Any] = {}
    for key, row in section_rows(section).items():
        value = getattr(obj, key)
        if row.save == "never" or (row.save == "changed" and value == row.default):
            continue
        if value is None:
            if row.default is not None:
                out[key] = ""
            continue
        shown = _value(row, value)
        if shown is not None:
            out[key] = shown
    return out


def to_toml_dict(cfg: RunConfig, *, include_secrets: bool = False) -> dict[str, Any]:
    """The effective config as a TOML-ready dict that `load_config` reads back to the same settings.

    Keys given as `env:VAR` or `@FILE` are saved as written; literal keys are
    saved as `env:RATEDECK_KEYS` unless `include_secrets`, so a saved profile
    never leaks a key. A run on a preset's keys saves `preset = NAME` instead.
    Limits are written exactly (`1/1.0005s`), never rounded.
    """
    default = cfg.keys[0].policies if cfg.keys else ()
    preset_keys = PRESETS.get(cfg.preset or "", {}).get("keys", {}).get("secrets")
    secrets: list[str] | None
    if include_secrets:
        secrets = [k.secret for k in cfg.keys]
    elif preset_keys is not None and list(cfg.key_sources) == list(preset_keys):
        secrets = None  # the preset supplies them
    elif cfg.key_sources and all(s.strip().startswith(("env:", "@")) for s in cfg.key_sources):
        secrets = list(cfg.key_sources)
    else:
        secrets = ["env:RATEDECK_KEYS"]
    # No limit given: none is written (none is invented on loading either).
    keys: dict[str, Any] = {"limits": [format_policy(p) for p in default]} if default else {}
    if cfg.key_weighted:
        keys["unit"] = "weight"
    if secrets is not None:
        keys["secrets"] = secrets
    by_key = {k.label: [format_policy(p) for p in k.policies] for k in cfg.keys if k.policies != default}
    if by_key:
        keys["limits_by_key"] = by_key
    if cfg.host_policies:
        keys["host_limits"] = [format_policy(p) for p in cfg.host_policies]
    out: dict[str, Any] = {"preset": cfg.preset} if cfg.preset else {}
    out |= {
        "target": _section("target", cfg.target),
        "keys": keys,
        "engine": _section("engine", cfg.engine),
        "workload": _section("workload", cfg.workload),
    }
    if cfg.server:
        out["server"] = dict(cfg.server)
    if cfg.pools:
        out["pools"] = dict(cfg.pools)
    if cfg.budgets:
        out["budgets"] = budgets_to_toml(cfg.budgets)
    if cfg.paths:
        out["paths"] = paths_to_toml(cfg.paths)
    run = _section("run", cfg)
    if run:
        out["run"] = run
    console = _section("console", cfg.console)
    if console:
        out["console"] = console
    gateway = _section("gateway", cfg.gateway)
    if gateway:
        out["gateway"] = gateway
    if cfg.messages is not None:
        out["messages"] = _section("messages", cfg.messages)
    return out
