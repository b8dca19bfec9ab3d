"""What a config says about an API beyond one endpoint: budgets, paths, outcome rules.

- A **budget** is a named limit beyond each key's own: per key (GitHub's
  `search`, 30/min per token) or per host (Binance's request weight, 6000/min
  per IP). A request spends from every budget it belongs to, all-or-nothing:
  its key's, each budget whose `paths` match its path, and any it names.
  A budget in `weight` units spends the request's weight; one in `tokens`,
  `input_tokens` or `output_tokens` what its body is estimated to cost
  (engine/limits/costs.py); else 1. A budget with `settle` gives back, once the
  answer comes, what it reserved beyond the use the answer reports (Anthropic
  settles output tokens to `usage.output_tokens`).
- A **path rule** says what a request to a path costs and needs: its weight,
  extra budgets, whether it is signed.
- An **outcome rule** says what an answer means when the status alone does
  not: GitHub's 403 with `X-RateLimit-Remaining: 0` is a rate limit;
  Binance's 418 is a ban; Kraken's HTTP 200 with `"error":
  ["EAPI:Rate limit exceeded"]` is a rate limit, and with any other error a
  failure. The first rule that matches wins; with none, the status decides.

Parsers take TOML values and raise ValueError with a short reason; the
config loader adds the file and key.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

from ratedeck.core.numbers import parse_duration
from ratedeck.core.policy import Policy, PolicyError, parse_policy
from ratedeck.core.vocab import OutcomeKind

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
MAX_WEIGHT = 1_000_000


#: What a budget may count: requests, a request's weight, or tokens estimated from its body.
BUDGET_UNITS = ("requests", "weight", "tokens", "input_tokens", "output_tokens")
#: Who shares a budget: each key, each key and model (OpenAI's and Anthropic's limits), the host.
BUDGET_SCOPES = ("key", "key+model", "host")
#: The units estimated from a request's body (engine/limits/costs.py).
TOKEN_UNITS = ("tokens", "input_tokens", "output_tokens")


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """A named budget: its limits, who shares it, what a request spends, which paths."""

    name: str
    policies: tuple[Policy, ...]
    scope: str = "key"  # one of BUDGET_SCOPES: per key, per key and model, or one for the host
    unit: str = "requests"  # one of BUDGET_UNITS: what one request spends
    paths: tuple[str, ...] = ()  # globs on the request path; none: every request
    exclusive: bool = False  # its requests do not spend the key's own budget (GitHub's search resource)
    settle: str | None = None  # a success's JSON field with the real use ("usage.output_tokens")

    @property
    def weighted(self) -> bool:
        """Spends a request's weight (else 1 per request, or its tokens)."""
        return self.unit == "weight"

    @property
    def per_model(self) -> bool:
        """One bucket per key and model (the model a request's body names, engine/path/lanes.py)."""
        return self.scope == "key+model"

    @property
    def tokens(self) -> bool:
        """Spends tokens estimated from the request's body."""
        return self.unit in TOKEN_UNITS

    def covers(self, path: str) -> bool:
        return not self.paths or any(fnmatch.fnmatchcase(path, p) for p in self.paths)


@dataclass(frozen=True, slots=True)
class PathRule:
    """What a request to paths matching `pattern` costs and needs."""

    pattern: str
    weight: int = 1
    budgets: tuple[str, ...] = ()
    signed: bool | None = None  # None: as the target says
    method: str | None = None


@dataclass(frozen=True, slots=True)
class OutcomeRule:
    """`kind` when the answer matches every condition given.

    `status`: one of these statuses; `header` with `header_value` (exact,
    case-insensitive); `body_contains`: the text appears in the body;
    `json_field`: the body is JSON and this dotted field is non-empty (a
    non-empty list, a non-empty string, true), with `json_contains` it holds
    that text. `delay_s` is the wait to use when the answer names none (a
    ban without Retry-After).
    """

    kind: OutcomeKind
    status: tuple[int, ...] = ()
    header: str | None = None
    header_value: str | None = None
    body_contains: str | None = None
    json_field: str | None = None
    json_contains: str | None = None
    delay_s: float | None = None

    @property
    def reads_body(self) -> bool:
        return self.body_contains is not None or self.json_field is not None

    def matches(self, status: int, headers: Any, body: str, parsed: list[Any]) -> bool:
        """Whether an answer matches; `parsed` caches the body's JSON ([] unparsed, [value] parsed)."""
        if self.status and status not in self.status:
            return False
        if self.header is not None:
            got = headers.get(self.header)
            if got is None or (
                self.header_value is not None and got.strip().lower() != self.header_value.lower()
            ):
                return False
        if self.body_contains is not None and self.body_contains not in body:
            return False
        if self.json_field is not None:
            if not parsed:
                try:
                    parsed.append(json.loads(body))
                except (ValueError, RecursionError):
                    parsed.append(None)
            value = _field(parsed[0], self.json_field)
            if not value:
                return False
            if self.json_contains is not None and self.json_contains not in json.dumps(value):
                return False
        return True


def _field(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


def first_match(rules: tuple[OutcomeRule, ...], status: int, headers: Any, body: str) -> OutcomeRule | None:
    """The first rule an answer matches, or None."""
    parsed: list[Any] = []
    for rule in rules:
        if rule.matches(status, headers, body, parsed):
            return rule
    return None


# ---------------------------------------------------------------- parsing TOML values


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or not set(value) <= _NAME_CHARS or len(value) > 60:
        raise ValueError(f"{what} must be a short name of letters, digits, _ - or ., got {value!r}")
    return value


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{what} must be a list of strings, got {value!r}")
    return tuple(value)


def _weight(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WEIGHT:
        raise ValueError(f"weight must be a whole number from 1 to {MAX_WEIGHT:,}, got {value!r}")
    return value


def _policies(value: Any) -> tuple[Policy, ...]:
    texts = _strings(value, "limits")
    if not texts:
        raise ValueError('limits must name at least one limit, like ["6000/1m fixed"]')
    try:
        return tuple(parse_policy(t) for t in texts)
    except PolicyError as exc:
        raise ValueError(str(exc)) from None


def _check_keys(table: dict[str, Any], known: set[str], what: str) -> None:
    for key in table:
        if key not in known:
            raise ValueError(f"{what}: unknown setting {key!r}; known: {', '.join(sorted(known))}")


def parse_budgets(value: Any) -> tuple[BudgetSpec, ...]:
    """`[[budgets]]` tables: name, limits, scope ("key", "key+model" or "host"), unit ("requests" or "weight"), paths."""
    if isinstance(value, dict):
        value = [dict(table, name=table.get("name", name)) for name, table in value.items()]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError('must be a list of tables, like [[budgets]] name = "weight" limits = [...]')
    budgets: list[BudgetSpec] = []
    for i, table in enumerate(value):
        where = f"budget {i + 1}"
        _check_keys(table, {"name", "limits", "scope", "unit", "paths", "exclusive", "settle"}, where)
        name = _name(table.get("name"), f"{where}: name")
        if name in {b.name for b in budgets}:
            raise ValueError(f"budget {name!r} is defined twice")
        scope = table.get("scope", "key")
        if scope not in BUDGET_SCOPES:
            scopes = ", ".join(f'"{s}"' for s in BUDGET_SCOPES)
            raise ValueError(f"budget {name!r}: scope must be one of {scopes}, got {scope!r}")
        unit = table.get("unit", "requests")
        if unit not in BUDGET_UNITS:
            units = ", ".join(f'"{u}"' for u in BUDGET_UNITS)
            raise ValueError(f"budget {name!r}: unit must be one of {units}, got {unit!r}")
        settle = table.get("settle")
        if settle is not None and (
            not isinstance(settle, str)
            or not settle
            or not set(settle) <= _NAME_CHARS
            or unit not in TOKEN_UNITS
        ):
            raise ValueError(
                f"budget {name!r}: settle must be the dotted JSON field of the real use in a token "
                f'budget, like "usage.output_tokens", got {settle!r}'
            )
        if "limits" not in table:
            raise ValueError(f'budget {name!r}: needs limits, like ["6000/1m fixed"]')
        try:
            policies = _policies(table["limits"])
            paths = _strings(table.get("paths", []), "paths")
        except ValueError as exc:
            raise ValueError(f"budget {name!r}: {exc}") from None
        exclusive = table.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise ValueError(f"budget {name!r}: exclusive must be true or false, got {exclusive!r}")
        budgets.append(BudgetSpec(name, policies, scope, unit, paths, exclusive, settle))
    return tuple(budgets)


def parse_paths(value: Any, budget_names: set[str]) -> tuple[PathRule, ...]:
    """`[paths."/api/v3/depth"] weight = 5, budgets = ["orders"], signed = true`."""
    if not isinstance(value, dict):
        raise ValueError('must be a table of path = {weight = 5}, like [paths."/api/v3/depth"]')
    rules = []
    for pattern, table in value.items():
        if not isinstance(pattern, str) or not pattern.startswith(("/", "*")):
            raise ValueError(f"path {pattern!r} must start with / (a glob like /api/v3/* is fine)")
        if not isinstance(table, dict):
            raise ValueError(f"path {pattern!r} must be a table like {{weight = 5}}")
        _check_keys(table, {"weight", "budgets", "signed", "method"}, f"path {pattern!r}")
        try:
            weight = _weight(table.get("weight", 1))
            names = _strings(table.get("budgets", []), "budgets")
        except ValueError as exc:
            raise ValueError(f"path {pattern!r}: {exc}") from None
        for name in names:
            if name not in budget_names:
                known = ", ".join(sorted(budget_names)) or "none are defined ([[budgets]])"
                raise ValueError(f"path {pattern!r}: no budget {name!r}; budgets: {known}")
        signed = table.get("signed")
        if signed is not None and not isinstance(signed, bool):
            raise ValueError(f"path {pattern!r}: signed must be true or false, got {signed!r}")
        method = table.get("method")
        if method is not None and (not isinstance(method, str) or method.upper() not in _METHODS):
            raise ValueError(f"path {pattern!r}: method must be one of {', '.join(_METHODS)}, got {method!r}")
        rules.append(PathRule(pattern, weight, names, signed, method.upper() if method else None))
    return tuple(rules)


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_RULE_KINDS = {
    "ok": OutcomeKind.OK,
    "rate_limited": OutcomeKind.RATE_LIMITED,
    "banned": OutcomeKind.BANNED,
    "blocked": OutcomeKind.BLOCKED,
    "failed": OutcomeKind.CLIENT_ERROR,
    "retry": OutcomeKind.SERVER_ERROR,
    "nonce": OutcomeKind.NONCE,
}


def parse_outcome_rules(value: Any) -> tuple[OutcomeRule, ...]:
    """`[[target.rules]]` tables: kind plus conditions (status, header, header_value, body_contains, json_field...)."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError('must be a list of tables, like [[target.rules]] status = 418, kind = "banned"')
    rules = []
    for i, table in enumerate(value):
        where = f"rule {i + 1}"
        _check_keys(
            table,
            {
                "kind",
                "status",
                "header",
                "header_value",
                "body_contains",
                "json_field",
                "json_contains",
                "delay",
            },
            where,
        )
        kind = table.get("kind")
        if kind not in _RULE_KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(_RULE_KINDS)}, got {kind!r}")
        status = table.get("status", [])
        status = [status] if isinstance(status, int) and not isinstance(status, bool) else status
        if not isinstance(status, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in status
        ):
            raise ValueError(
                f"{where}: status must be an HTTP status or a list of them, got {table.get('status')!r}"
            )
        texts = {}
        for name in ("header", "header_value", "body_contains", "json_field", "json_contains"):
            got = table.get(name)
            if got is not None and (not isinstance(got, str) or not got):
                raise ValueError(f"{where}: {name} must be text, got {got!r}")
            texts[name] = got
        if texts["header_value"] is not None and texts["header"] is None:
            raise ValueError(f"{where}: header_value needs header")
        if texts["json_contains"] is not None and texts["json_field"] is None:
            raise ValueError(f"{where}: json_contains needs json_field")
        if not status and not any(texts.values()):
            raise ValueError(
                f"{where}: give at least one condition (status, header, body_contains or json_field)"
            )
        delay = table.get("delay")
        delay_s = None
        if delay is not None:
            delay_s = parse_duration(delay)
        rules.append(OutcomeRule(_RULE_KINDS[kind], tuple(status), delay_s=delay_s, **texts))
    return tuple(rules)


class PathTable:
    """Finds the rule for a request path: an exact pattern first, then the first glob that matches.

    Lookups are cached: a workload uses a handful of paths.
    """

    __slots__ = ("rules", "_exact", "_cache")

    def __init__(self, rules: tuple[PathRule, ...] = ()):
        self.rules = rules
        self._exact = {r.pattern: r for r in rules}
        self._cache: dict[str, PathRule | None] = {}

    def lookup(self, path: str) -> PathRule | None:
        if not self.rules:
            return None
        try:
            return self._cache[path]
        except KeyError:
            pass
        rule = self._exact.get(path) or next(
            (r for r in self.rules if fnmatch.fnmatchcase(path, r.pattern)), None
        )
        if len(self._cache) < 10_000:
            self._cache[path] = rule
        return rule


# ---------------------------------------------------------------- writing TOML values back

_KIND_NAMES = {kind: name for name, kind in _RULE_KINDS.items()}


def budgets_to_toml(budgets: tuple[BudgetSpec, ...]) -> list[dict[str, Any]]:
    from ratedeck.core.policy import format_policy

    out = []
    for b in budgets:
        table: dict[str, Any] = {"name": b.name, "limits": [format_policy(p) for p in b.policies]}
        table |= {"scope": b.scope, "unit": b.unit}
        if b.settle:
            table["settle"] = b.settle
        if b.paths:
            table["paths"] = list(b.paths)
        if b.exclusive:
            table["exclusive"] = True
        out.append(table)
    return out


def paths_to_toml(paths: tuple[PathRule, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in paths:
        table: dict[str, Any] = {"weight": r.weight}
        if r.budgets:
            table["budgets"] = list(r.budgets)
        if r.signed is not None:
            table["signed"] = r.signed
        if r.method:
            table["method"] = r.method
        out[r.pattern] = table
    return out


def rules_to_toml(rules: tuple[OutcomeRule, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rules:
        table: dict[str, Any] = {"kind": _KIND_NAMES[r.kind]}
        if r.status:
            table["status"] = list(r.status)
        for name in ("header", "header_value", "body_contains", "json_field", "json_contains"):
            if getattr(r, name) is not None:
                table[name] = getattr(r, name)
        if r.delay_s is not None:
            table["delay"] = f"{r.delay_s:g}s"
        out.append(table)
    return out
