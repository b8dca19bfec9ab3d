"""`[[endpoints]]`: one pool over several endpoints (Azure OpenAI resources, OpenAI orgs, any
OpenAI-compatible API), each with a name, a preset, a URL, its keys and the models it serves.

```toml
[[endpoints]]
name = "east"
preset = "azure-openai"
url = "https://east-res.openai.azure.com"
keys = "env:AZURE_EAST_KEY"
models = { "gpt-4o-mini" = { deployment = "mini", tpm = 20000 } }
```

Each endpoint's target is its preset's `[target]`, under the file's own `[target]`, under the
endpoint's `target` table, with its `url` (and `api_version`). Its keys take every form
`--keys` takes and are labelled after it ("east", or "openai-1", "openai-2"). A `models`
entry is a deployment name, or a table of `deployment`, `rpm` and `tpm` (limits told, per
endpoint and model); without `models` the endpoint serves any model a request names.
`prices` (`{ "gpt-4o-mini" = { input = 0.165, output = 0.66 } }`, as `[prices."model"]`) are
the endpoint's own, over the run's. Every endpoint of a pool speaks one API: their presets'
budgets must be the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ratedeck.core.numbers import show
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import ApiStyle, PolicyKind
from ratedeck.engine.api_rules import parse_budgets
from ratedeck.engine.settings import ConfigError, EndpointSpec, KeySpec, ModelRoute, TargetConfig

from . import parsers
from .pricing import parse_prices

#: What an `[[endpoints]]` table may hold.
FIELDS = ("name", "preset", "url", "keys", "models", "api_version", "target", "prices")
#: Azure OpenAI's chat models: 6 requests per minute for every 1,000 tokens per minute.
AZURE_RPM_PER_1000_TPM = 6
#: Azure enforces requests per minute over 10-second windows (RPM/6 in any 10 s).
AZURE_RPM_WINDOW_S = 10.0


def endpoint_presets(raw: Any, source: str, known: Mapping[str, Any]) -> list[str]:
    """Each endpoint's preset name, checked (the first is the pool's base preset)."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(source, "endpoints", "must be a list of tables, like [[endpoints]] name = ...")
    names = []
    for i, table in enumerate(raw):
        preset = table.get("preset")
        where = f"endpoints[{i}].preset"
        if not isinstance(preset, str) or preset not in known:
            raise ConfigError(
                source, where, f"unknown preset {show(preset)}; known: {', '.join(sorted(known))}"
            )
        names.append(preset)
    return names


def build_endpoints(
    raw: list[dict[str, Any]],
    source: str,
    presets: Mapping[str, dict[str, Any]],
    user_target: dict[str, Any],
    make_target: Callable[[dict[str, Any], str], TargetConfig],
    *,
    keys_needed: bool,
) -> tuple[tuple[EndpointSpec, ...], tuple[KeySpec, ...]]:
    """The endpoints of `raw` (checked by `endpoint_presets` first) and all their keys.

    `user_target` is the file's (and flags') own [target]; `make_target(data, source)`
    checks a target table as `[target]` is checked (config/load.py)."""
    endpoints: list[EndpointSpec] = []
    keys: list[KeySpec] = []
    seen_names: dict[str, int] = {}
    seen_secrets: dict[str, str] = {}
    budget_names: tuple[str, ...] | None = None
    first = ""
    for i, table in enumerate(raw):
        where = f"endpoints[{i}]"
        for field in table:
            if field not in FIELDS:
                raise ConfigError(source, f"{where}.{field}", f"unknown setting; known: {', '.join(FIELDS)}")
        name = parsers.label_name(table.get("name"), source, f"{where}.name")
        if name in seen_names:
            raise ConfigError(source, f"{where}.name", f"{name!r} names endpoints[{seen_names[name]}] too")
        seen_names[name] = i
        where = f"endpoints.{name}"
        preset_name = table["preset"]
        preset = presets[preset_name]
        try:
            budgets = parse_budgets(preset.get("budgets", []))
        except ValueError as exc:  # a shipped preset: not the user's doing, but named
            raise ConfigError(source, f"{where}.preset", str(exc)) from None
        names = tuple(sorted(b.name for b in budgets))
        if budget_names is None:
            budget_names, first = names, f"{name} ({preset_name})"
        elif names != budget_names:
            raise ConfigError(
                source,
                f"{where}.preset",
                f"{preset_name!r} limits {', '.join(names) or 'no budget'}, where {first} limits "
                f"{', '.join(budget_names) or 'no budget'}: one pool serves one API's requests",
            )
        target = _endpoint_target(table, where, source, preset, user_target, make_target)
        models = _models(table.get("models"), where, source, target, {b.name: b for b in budgets})
        spec = EndpointSpec(
            name=name,
            preset=preset_name,
            target=target,
            models=models,
            learn_first=bool((preset.get("engine") or {}).get("learn_first", False)),
            starts={b.name: b.policies for b in budgets},
            prices=parse_prices(table["prices"], source, f"{where}.prices") if "prices" in table else {},
        )
        endpoints.append(spec)
        if not keys_needed:
            continue
        mine = _keys(table.get("keys"), where, source, preset, spec)
        if target.api_style is ApiStyle.AZURE and len(mine) > 1:
            raise ConfigError(
                source,
                f"{where}.keys",
                f"an Azure OpenAI resource's keys share its quota: give one key per endpoint ({len(mine)} given)",
            )
        for key in mine:
            other = seen_secrets.get(key.secret)
            if other is not None:
                raise ConfigError(source, f"{where}.keys", f"a key of {name!r} is also a key of {other!r}")
            seen_secrets[key.secret] = name
        keys.extend(mine)
    return tuple(endpoints), tuple(keys)


def _endpoint_target(
    table: dict[str, Any],
    where: str,
    source: str,
    preset: dict[str, Any],
    user_target: dict[str, Any],
    make_target: Callable[[dict[str, Any], str], TargetConfig],
) -> TargetConfig:
    own = table.get("target", {})
    if not isinstance(own, dict):
        raise ConfigError(source, f"{where}.target", "must be a table of [target] settings")
    for name in ("url", "api_version"):
        if name in own:
            raise ConfigError(source, f"{where}.target.{name}", f"set it as {where}.{name}")
    url = table.get("url")
    try:
        url = parsers.url(url)
    except ValueError as exc:
        raise ConfigError(source, f"{where}.url", str(exc)) from None
    merged: dict[str, Any] = {**(preset.get("target") or {}), **user_target, **own, "url": url}
    if "api_version" in table:
        version = table["api_version"]
        if not isinstance(version, str) or not version.strip() or parsers.CONTROL.search(version):
            raise ConfigError(
                source, f"{where}.api_version", f'must be a version like "2024-10-21", got {show(version)}'
            )
        merged["api_version"] = version
    return make_target({"target": merged}, f"{source}: {where}")


def _keys(
    raw: Any, where: str, source: str, preset: dict[str, Any], endpoint: EndpointSpec
) -> tuple[KeySpec, ...]:
    """The endpoint's keys, labelled after it, with its preset's starting limits."""
    if raw is None:
        raise ConfigError(
            source, f"{where}.keys", 'no API keys given; set keys = "env:VAR", "@FILE" or a list'
        )
    preset_keys = preset.get("keys") or {}
    table = {"secrets": raw, "scope": preset_keys.get("scope", "key")}
    if "limits" in preset_keys:
        table["limits"] = preset_keys["limits"]
    try:
        specs = parsers.keys(table, source, ())
    except ConfigError as exc:
        raise ConfigError(source, f"{where}.keys", exc.problem) from None
    one = len(specs) == 1
    return tuple(
        KeySpec(
            endpoint.name if one else f"{endpoint.name}-{j + 1}", s.secret, s.policies, s.api_secret, endpoint
        )
        for j, s in enumerate(specs)
    )


def _models(
    raw: Any, where: str, source: str, target: TargetConfig, budgets: Mapping[str, Any]
) -> dict[str, ModelRoute] | None:
    """`models`: the name clients use -> a deployment name, or a table of deployment, rpm, tpm."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            source,
            f"{where}.models",
            'must be a table like { "gpt-4o-mini" = "mini" } (a model -> its deployment)',
        )
    azure = target.api_style is ApiStyle.AZURE
    tokens = [name for name, b in budgets.items() if b.unit == "tokens"]
    out: dict[str, ModelRoute] = {}
    for model, entry in raw.items():
        at = f'{where}.models."{model}"'
        if not model or len(model) > 80 or parsers.CONTROL.search(model):
            raise ConfigError(
                source,
                f"{where}.models",
                f"a model name must be 1 to 80 printable characters, got {show(model)}",
            )
        if isinstance(entry, str):
            entry = {"deployment": entry}
        if not isinstance(entry, dict):
            raise ConfigError(
                source, at, f"must be a deployment name or a table of deployment, rpm, tpm; got {show(entry)}"
            )
        for name in entry:
            if name not in ("deployment", "rpm", "tpm"):
                raise ConfigError(source, f"{at}.{name}", "unknown setting; known: deployment, rpm, tpm")
        deployment = entry.get("deployment")
        if deployment is not None and (
            not isinstance(deployment, str) or not deployment.strip() or parsers.CONTROL.search(deployment)
        ):
            raise ConfigError(source, f"{at}.deployment", f"must be a name, got {show(deployment)}")
        rpm, tpm = (_per_minute(entry.get(n), source, f"{at}.{n}") for n in ("rpm", "tpm"))
        if tpm is not None and not tokens:
            split = [name for name, b in budgets.items() if b.tokens]
            raise ConfigError(
                source,
                f"{at}.tpm",
                f"this endpoint's preset counts {' and '.join(split)} apart, which one tpm = {tpm} cannot tell "
                "(they are learned from its answers' headers)"
                if split
                else f"this endpoint's preset counts no tokens (tpm = {tpm}); give rpm only",
            )
        if azure and rpm is None and tpm is not None:
            rpm = max(1, tpm * AZURE_RPM_PER_1000_TPM // 1000)
        requests: tuple[Policy, ...] = ()
        if rpm is not None:
            if azure:  # enforced over 10-second windows: RPM/6 in any 10 s
                requests = (Policy(max(1, rpm * int(AZURE_RPM_WINDOW_S) // 60), AZURE_RPM_WINDOW_S),)
            else:
                requests = (_per_minute_bucket(rpm),)
        told = {name: (_per_minute_bucket(tpm),) for name in tokens} if tpm is not None else {}
        out[model] = ModelRoute(deployment=deployment, requests=requests, budgets=told)
    return out


def _per_minute(value: Any, source: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**12:
        raise ConfigError(
            source, where, f"must be a whole number per minute of at least 1, got {show(value)}"
        )
    return value


def _per_minute_bucket(n: int) -> Policy:
    """N per minute as a bucket that starts full and refills continuously (as OpenAI's and
    Azure's token limits do)."""
    return Policy(n, 60.0, PolicyKind.BUCKET, float(n))
