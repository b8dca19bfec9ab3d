"""`--fail-on EXPR`: a run fails (exit 99) when an expression over its report holds.

An expression is `FIELD OP VALUE`: FIELD a dotted path into the report
(`requests.rejected_429`, `latency_ms.p99`, `server.totals.escalations`) or a
short alias (`rejected_429`, `graveyard`, `p99`, `tps`); OP one of
`> >= < <= == !=`; VALUE a number (or true/false for a yes/no field).
`rejected_429>0` fails a run that met any 429. Fields and their meaning are
the report schema's (`report.schema.json`), so an unknown field is found
before the run, with the nearest names offered.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .report import schema

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_EXPR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=|==|!=|>|<)\s*(\S.*?)\s*")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")

#: Short names for the fields people check most.
ALIASES = {
    "tps": "throughput_tps",
    "throughput": "throughput_tps",
    "capacity": "capacity_tps",
    "p50": "latency_ms.p50",
    "p90": "latency_ms.p90",
    "p99": "latency_ms.p99",
    "p999": "latency_ms.p999",
}


class ThresholdError(ValueError):
    """A malformed expression or an unknown field; the message is one line."""


@dataclass(frozen=True)
class Threshold:
    expression: str  # as given
    field: str  # the report path it reads
    op: str
    value: float

    def holds(self, actual: float) -> bool:
        return OPERATORS[self.op](actual, self.value)


@dataclass(frozen=True)
class Verdict:
    threshold: Threshold
    actual: float | bool | None  # None: the field is not in this run's report
    failed: bool

    def line(self) -> str:
        t = self.threshold
        if self.actual is None:
            return f"{t.expression}: {t.field} is not in this run's report"
        return f"{t.expression} ({t.field} = {_show(self.actual)})"


def _show(value: float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------- fields


def _fields() -> tuple[dict[str, str], set[str]]:
    """From the schema: every number or yes/no field by dotted path (-> its type), and the
    paths of open tables (`failures`, `server.totals`) whose names are not known in advance."""
    leaves: dict[str, str] = {}
    open_tables: set[str] = set()

    def walk(node: dict, path: str) -> None:
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "object" in kinds:
            for name, sub in node.get("properties", {}).items():
                walk(sub, f"{path}.{name}" if path else name)
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") in ("integer", "number"):
                open_tables.add(path)
        elif {"integer", "number", "boolean"} & set(kinds) and path != "schema_version":
            leaves[path] = "boolean" if "boolean" in kinds else "number"

    walk(schema(), "")
    return leaves, open_tables


_FIELDS: tuple[dict[str, str], set[str]] | None = None


def fields() -> tuple[dict[str, str], set[str]]:
    global _FIELDS
    if _FIELDS is None:
        _FIELDS = _fields()
    return _FIELDS


def aliases() -> dict[str, str]:
    """Short name -> report path: every `requests.*` counter by its own name, and `ALIASES`."""
    leaves, _ = fields()
    short = {path.split(".", 1)[1]: path for path in leaves if path.startswith("requests.")}
    return short | ALIASES


def resolve(name: str) -> str:
    """The report path `name` reads; raises ThresholdError for an unknown field."""
    leaves, open_tables = fields()
    if name in leaves:
        return name
    short = aliases()
    if name in short:
        return short[name]
    table, _, rest = name.rpartition(".")
    if table in open_tables and rest:
        return name
    known = sorted(set(leaves) | set(short))
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else "; see docs/report.md"
    raise ThresholdError(f"unknown field {name!r}{hint}")


# ---------------------------------------------------------------- parsing


def parse(expression: str) -> Threshold:
    """`"rejected_429>0"` -> Threshold; raises ThresholdError naming what is wrong."""
    if not isinstance(expression, str):
        raise ThresholdError(f"expected text like rejected_429>0, got {expression!r}")
    match = _EXPR.fullmatch(expression)
    if not match:
        raise ThresholdError(
            f"{expression!r} is not FIELD OP VALUE (like rejected_429>0 or latency_ms.p99>=500; "
            "OP one of > >= < <= == !=)"
        )
    name, op, text = match.groups()
    path = resolve(name)
    kind = fields()[0].get(path, "number")
    lowered = text.lower()
    if lowered in ("true", "false"):
        if kind != "boolean":
            raise ThresholdError(f"{expression!r}: {path} is a number, not true/false")
        value = 1.0 if lowered == "true" else 0.0
    elif _NUMBER.fullmatch(text):
        value = float(text)
        if not math.isfinite(value):
            raise ThresholdError(f"{expression!r}: {text!r} is not a finite number")
    else:
        raise ThresholdError(
            f"{expression!r}: {text!r} is not a number (OP one of > >= < <= == !=, then a number)"
        )
    if kind == "boolean" and op not in ("==", "!="):
        raise ThresholdError(f"{expression!r}: {path} is true or false; compare it with == or !=")
    return Threshold(expression.strip(), path, op, value)


def parse_all(expressions: list[str] | tuple[str, ...]) -> list[Threshold]:
    return [parse(e) for e in expressions]


# ---------------------------------------------------------------- evaluating


def lookup(report: dict, path: str) -> Any:
    """The value at `path` in `report`; None when it is not there. A missing name of an open
    table (a failure cause that never happened) is 0."""
    _, open_tables = fields()
    node: Any = report
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return None
        if part not in node:
            table = ".".join(parts[:i])
            return 0 if table in open_tables and i == len(parts) - 1 else None
        node = node[part]
    return node if isinstance(node, int | float | bool) else None


def evaluate(thresholds: list[Threshold], report: dict) -> list[Verdict]:
    """Each threshold against the report: `failed` when its expression holds, or when the
    field is not in this report (a threshold that cannot be checked never passes quietly)."""
    out = []
    for t in thresholds:
        actual = lookup(report, t.field)
        if actual is None:
            out.append(Verdict(t, None, True))
        else:
            out.append(Verdict(t, actual, t.holds(float(actual))))
    return out
