"""Saving: the settings in force as a TOML-ready dict that loads back to the same settings."""

from __future__ import annotations

from enum import Enum
from typing import Any

from ratedeck.core.policy import format_policy
from ratedeck.engine.api_rules import budgets_to_toml, paths_to_toml

from .load import PRESETS
from .pricing import user_prices
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


def _section(section: str, *objs: Any) -> dict[str, Any]:
    """A section's settings as a TOML table, by its rows.

    TOML has no null: an optional setting that is off is left out when off is
    its default, and written as "" (which switches it off) when it is not, so
    a saved `nonce_param = None` never comes back as "nonce". A row saved
    "changed" is left out at its default; "never" is never written. A section
    whose values land in several settings objects (`[run]`: `FIELDS`) reads each
    from the first of `objs` that has it.
    """
    out: dict[str, Any] = {}
    for key, row in section_rows(section).items():
        value = getattr(next(o for o in objs if hasattr(o, key)), key)
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
    es, runner = cfg.engine_settings, cfg.runner
    default = es.keys[0].policies if es.keys else ()
    preset_keys = PRESETS.get(runner.preset or "", {}).get("keys", {}).get("secrets")
    secrets: list[str] | None
    if include_secrets:
        secrets = [k.secret for k in es.keys]
    elif preset_keys is not None and list(runner.key_sources) == list(preset_keys):
        secrets = None  # the preset supplies them
    elif runner.key_sources and all(s.strip().startswith(("env:", "@")) for s in runner.key_sources):
        secrets = list(runner.key_sources)
    else:
        secrets = ["env:RATEDECK_KEYS"]
    # No limit given: none is written (none is invented on loading either).
    keys: dict[str, Any] = {"limits": [format_policy(p) for p in default]} if default else {}
    if es.key_weighted:
        keys["unit"] = "weight"
    if es.key_per_model:
        keys["scope"] = "key+model"
    if secrets is not None:
        keys["secrets"] = secrets
    by_key = {k.label: [format_policy(p) for p in k.policies] for k in es.keys if k.policies != default}
    if by_key:
        keys["limits_by_key"] = by_key
    if es.host_policies:
        keys["host_limits"] = [format_policy(p) for p in es.host_policies]
    out: dict[str, Any] = {"preset": runner.preset} if runner.preset else {}
    out |= {
        "target": _section("target", es.target),
        "keys": keys,
        "engine": _section("engine", es.engine),
        "workload": _section("workload", es.workload),
    }
    if cfg.server:
        out["server"] = dict(cfg.server)
    if es.pools:
        out["pools"] = dict(es.pools)
    if es.budgets:
        out["budgets"] = budgets_to_toml(es.budgets)
    prices = user_prices(es.prices)
    if prices:
        out["prices"] = prices
    if es.paths:
        out["paths"] = paths_to_toml(es.paths)
    run = _section("run", runner, es)
    if run:
        out["run"] = run
    console = _section("console", cfg.console)
    if console:
        out["console"] = console
    gateway = _section("gateway", cfg.gateway)
    if gateway:
        out["gateway"] = gateway
    if es.messages is not None:
        out["messages"] = _section("messages", es.messages)
    return out
