"""The bill in the headless output and the report: spend per model and key, and the cost cap.

The engine counts the spend from the answers' usage (engine/observe/spend.py);
this module says it: the summary's lines, the report's `spend` object, and
what the `--max-cost` cap left unsent (a file's lines never read, a store's
jobs still pending).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ratedeck.config import RunConfig
from ratedeck.core.numbers import usd
from ratedeck.engine.snapshot import Snapshot, Spend
from ratedeck.store.work import StoreReport


def spend_lines(spend: Spend) -> list[str]:
    """The summary's spend: one line for the run, one per model and key."""
    lines = [f"spend        {spend.line()}"]
    for r in spend.rows:
        line = (
            f"  {r.key:>4} {r.model}: {r.answers:,} answers, {r.input_tokens:,} in / {r.output_tokens:,}"
            f" out tokens, {usd(r.usd)}"
        )
        if r.unmetered:
            line += f" (+{r.unmetered:,} answers that reported no usage, not counted)"
        lines.append(line)
    return lines


def workload_lines(path: str | None) -> int | None:
    """The lines of a workload file that hold a request (not blank); None without a readable file."""
    if path is None:
        return None
    try:
        with Path(path).open(encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except (OSError, UnicodeDecodeError):
        return None


def not_sent(cfg: RunConfig, snap: Snapshot, store: StoreReport | None) -> str:
    """What the cost cap left: "40 of 100 lines not sent", or "40 jobs still pending in the store"."""
    if store is not None:
        return f"{store.counts.pending:,} jobs still pending in the store ({store.url}; --resume goes on)"
    total = workload_lines(cfg.engine_settings.workload.file)
    if total is None:
        return "the rest not sent"
    return f"{max(0, total - snap.generated):,} of {total:,} lines not sent"


def cap_line(cfg: RunConfig, snap: Snapshot, store: StoreReport | None) -> str | None:
    """The verdict's line when the cost cap stopped admission, else None."""
    spend = snap.spend
    if spend is None or not spend.capped or spend.cap_usd is None:
        return None
    return (
        f"ratedeck: cost cap {usd(spend.cap_usd)} reached: {usd(spend.total_usd)} spent,"
        f" {not_sent(cfg, snap, store)}"
    )


def spend_report(spend: Spend | None) -> dict[str, Any] | None:
    """The report's `spend`: totals, per model, per model and key (usd null: no price)."""
    if spend is None:
        return None
    return {
        "total_usd": spend.total_usd,
        "by_model": spend.by_model(),
        "unpriced": list(spend.unpriced),
        "rows": [
            {
                "model": r.model,
                "key": r.key,
                "answers": r.answers,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "usd": r.usd,
                "unmetered": r.unmetered,
            }
            for r in spend.rows
        ],
        "cap_usd": spend.cap_usd,
        "capped": spend.capped,
        "reserved_usd": spend.reserved_usd,
    }
