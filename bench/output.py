"""The bench's results as a text table, plotext bar charts and a JSON report."""

from __future__ import annotations

import json
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The columns of a result row, in report order (stable names).
ROW_FIELDS = (
    "strategy",
    "ok_per_s",
    "pct_capacity",
    "rejected_429",
    "rejected_nonce",
    "expired",
    "p50_ms",
    "p99_ms",
    "cpu_s",
    "cpu_us_per_ok",
    "peak_rss_mb",
)


@dataclass
class ScenarioResult:
    """One scenario's rows, one per strategy, in the order they ran."""

    name: str
    summary: str
    capacity_tps: float
    rows: list[dict[str, Any]] = field(default_factory=list)


def make_row(
    strategy: str,
    client: dict[str, Any],
    server: dict[str, Any],
    duration_s: float,
    capacity_tps: float,
    *,
    policy: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """A result row: successes from the client, 429s and nonce rejections as the server counted them.

    Every HTTP 429 counts, including the study's server's "blocked" answers.
    Extra fields after the stable ones help explain a row. With `policy` (the
    scenario's per-key limit and window, as the server enforces them) and the
    server's accept stamps (`arrivals_ms`), `sustained` is the run's sustained
    efficiency (`bench/sustained.py`: the mean over keys of W / the mean gap
    between accepted arrivals i and i+N), `sustained_by_key` each key's.
    """
    totals = server.get("totals", {})
    host = server.get("host", {})
    share = server.get("share", {})
    ok_per_s = client["succeeded"] / duration_s
    row = {
        "strategy": strategy,
        "ok_per_s": round(ok_per_s, 2),
        "pct_capacity": round(100.0 * ok_per_s / capacity_tps, 1) if capacity_tps else 0.0,
        "rejected_429": int(
            totals.get("rejected_429", 0) + totals.get("blocked_answers", 0) + host.get("rejected_429", 0)
        ),
        "rejected_nonce": int(totals.get("rejected_nonce", 0)),
        "expired": int(client.get("expired", 0)),
        "p50_ms": round(float(client.get("p50_ms", 0.0)), 1),
        "p99_ms": round(float(client.get("p99_ms", 0.0)), 1),
        "cpu_s": round(float(client.get("cpu_s", 0.0)), 2),
        # the client's CPU (every process it ran) per accepted request: is the client the bottleneck?
        "cpu_us_per_ok": round(1e6 * float(client.get("cpu_s", 0.0)) / client["succeeded"], 1)
        if client["succeeded"]
        else None,
        "peak_rss_mb": round(float(client.get("peak_rss_mb", 0.0)), 1),
        # extras, not part of the stable set
        "succeeded": int(client["succeeded"]),
        "generated": int(client.get("generated", 0)),
        "sent": int(client.get("sent", 0)),
        "graveyard": int(client.get("graveyard", 0)),
        "failed": int(client.get("failed", 0)),
        "server_ok": int(totals.get("ok", 0)),
        "server_audit_ok": bool(server.get("audit_ok", True)),
        # the server's own view: W / mean gap between accepted arrivals i and i+N of a key
        "share": share.get("sustained"),
        "share_all": share.get("all"),
        # how the server's cooldowns went: sends into a closed gate, cooldowns doubled
        "server_in_cooldown": int(totals.get("requests_during_cooldown", 0)),
        "server_escalations": int(totals.get("escalations", 0)),
        "rejected_429_by_key": [int(k.get("rejected_429", 0)) for k in server.get("keys", [])],
    }
    # Another user on the same keys (`--other-load`): the share of what they left, as the
    # engine's virtual-clock test of the case measures it (succeeded / (capacity - theirs)).
    theirs = sum(int(k.get("other_accepted", 0)) for k in server.get("keys", []))
    if theirs:
        left = capacity_tps * duration_s - theirs
        row["other_accepted"] = theirs
        row["share_of_left"] = round(client["succeeded"] / left, 4) if left > 0 else None
    arrivals = server.get("arrivals_ms")
    if policy is not None and arrivals is not None:
        from .sustained import run_sustained

        limit, window_s = policy
        run = run_sustained(([t / 1000.0 for t in stamps] for stamps in arrivals), limit, window_s)
        row["sustained"] = None if run.mean is None else round(run.mean, 4)
        row["sustained_by_key"] = [None if v is None else round(v, 4) for v in run.by_key]
        row["sustained_keys"] = run.scored
        left_share = row.get("share_of_left")
        if theirs and left_share is not None and run.mean is not None:
            # Sustained over our own stamps counts the slots the other user took as gaps, so it
            # can reach only the share of the capacity they left: scaled by that share, it is
            # "of what they left" in the server's measure (1.0 when every slot they left is ours).
            left = 1.0 - theirs / (capacity_tps * duration_s)
            row["sustained_of_left"] = round(run.mean / left, 4) if left > 0 else None
        if server.get("arrivals_dropped"):
            row["sustained_stamps_dropped"] = int(server["arrivals_dropped"])
    # what a ratedeck strategy's headroom was made of
    for name in (
        "headroom_ms",
        "headroom_source",
        "rtt_spread_ms",
        "network_spread_ms",
        "server_time_ms",
        "rejection_budget",
        "rejections_spent",
        "probe_sent",
    ):
        if name in client:
            row[name] = client[name]
    return row


def cpu_ratio_line(rows: list[dict[str, Any]], peer: str = "aiolimiter", ours: str = "ratedeck") -> str:
    """ratedeck's client CPU per accepted request over the peer's, measured in the same run."""
    by_name = {r["strategy"]: r for r in rows}
    a, b = by_name.get(ours, {}).get("cpu_us_per_ok"), by_name.get(peer, {}).get("cpu_us_per_ok")
    if not a or not b:
        return ""
    return (
        f"CPU per accepted request: {ours} {a:.0f} µs, {peer} {b:.0f} µs = {a / b:.2f}x "
        f"({by_name[ours]['succeeded']:,} vs {by_name[peer]['succeeded']:,} accepted; side by side, one run)"
    )


def scenario_table(result: ScenarioResult, duration_s: float) -> str:
    """A fixed-width table of one scenario's rows."""
    if result.rows and "ratio" in result.rows[0]:
        return jobs_table(result)
    if any("added_p50_ms" in r for r in result.rows):
        from .gateway import gateway_table

        return gateway_table(result)
    if any("prompts_ok" in r or "skipped" in r for r in result.rows):
        return llm_table(result)
    # `sustained` only where the rows have it (reports saved before it render as they did)
    sustained = any("sustained" in r for r in result.rows)
    head = (
        f"{'strategy':<17}{'ok/s':>8}{'%cap':>7}{'share':>7}"
        + (f"{'sustained':>10}" if sustained else "")
        + f"{'429s':>7}{'nonce':>7}{'expired':>8}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'CPU s':>7}{'µs/ok':>7}{'RSS MB':>8}"
    )
    lines = [
        f"{result.name}: {result.summary}",
        f"capacity {result.capacity_tps:g} req/s, {duration_s:g} s per strategy",
        head,
        "-" * len(head),
    ]
    for r in result.rows:
        share = r.get("share")
        per_ok = r.get("cpu_us_per_ok")
        held = r.get("sustained")
        lines.append(
            f"{r['strategy']:<17}{r['ok_per_s']:>8.1f}{r['pct_capacity']:>6.1f}%"
            f"{'-' if share is None else f'{share:.3f}':>7}"
            + (f"{'-' if held is None else f'{held:.3f}':>10}" if sustained else "")
            + f"{r['rejected_429']:>7}"
            f"{r['rejected_nonce']:>7}{r['expired']:>8}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}"
            f"{r['cpu_s']:>7.2f}{'-' if per_ok is None else f'{per_ok:.0f}':>7}"
            f"{r['peak_rss_mb']:>8.1f}"
        )
    ratio = cpu_ratio_line(result.rows)
    if ratio:
        lines.append("  " + ratio)
    for r in result.rows:
        if "headroom_source" in r:
            lines.append("  " + _headroom_note(r))
    for r in result.rows:
        if r.get("share_of_left") is not None:
            scaled = (
                f"; sustained over its own stamps {r['sustained']:.3f}, {r['sustained_of_left']:.3f} of"
                " the share they left"
                if r.get("sustained_of_left") is not None
                else ""
            )
            lines.append(
                f"  {r['strategy']} got {r['share_of_left']:.3f} of what the other user left"
                f" (they were accepted {r['other_accepted']:,} times){scaled}"
            )
    for r in result.rows:
        if r["rejected_429"] and r.get("rejected_429_by_key"):
            lines.append(
                f"  {r['strategy']} 429s by key {','.join(map(str, r['rejected_429_by_key']))};"
                f" sent during a cooldown {r['server_in_cooldown']}; escalations {r['server_escalations']}"
            )
    return "\n".join(lines)


def jobs_table(result: ScenarioResult) -> str:
    """A jobs scenario's rows (`bench/jobs.py`): jobs done, elapsed to the last, the least time, the ratio."""
    head = f"{'strategy':<17}{'jobs':>7}{'elapsed s':>11}{'least s':>9}{'ratio':>8}{'429s':>7}{'units':>8}"
    lines = [f"{result.name}: {result.summary}", head, "-" * len(head)]
    for r in result.rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(
            f"{r['strategy']:<17}{r['jobs']:>7}{r['elapsed_s']:>11.2f}{r['least_s']:>9.2f}{ratio:>8}"
            f"{r['rejected_429']:>7}{r['units']:>8}"
        )
    return "\n".join(lines)


def llm_table(result: ScenarioResult) -> str:
    """An llm scenario's rows (`bench/llm.py`), every count from the stub's ledger."""
    head = (
        f"{'strategy':<10}{'prompts':>9}{'tok/min':>10}{'share':>8}{'429s':>7}{'quota':>7}{'529s':>6}"
        f"{'dups':>6}{'µs/ok':>8}"
    )
    done = [r for r in result.rows if "skipped" not in r]
    minute = done[0]["minute_s"] if done else None
    unit = done[0]["share_of"] if done else "tokens"
    lines = [
        f"{result.name}: {result.summary}",
        f"capacity {result.capacity_tps:,.0f} {unit}/min over the keys with a quota"
        + (f" (a minute is {minute:g} s); " if minute else "; ")
        + "tok/min = tokens the stub charged per its minute; share = "
        + unit
        + " served / what the stub allowed; the peers' pauses are real seconds (cookbook 15 s, LiteLLM 5 s)",
        head,
        "-" * len(head),
    ]
    for r in result.rows:
        if "skipped" in r:
            lines.append(f"{r['strategy']:<10}skipped: {r['skipped']}")
            continue
        share = "-" if r["share_tokens"] is None else f"{r['share_tokens']:.3f}"
        per_ok = "-" if r["cpu_us_per_ok"] is None else f"{r['cpu_us_per_ok']:.0f}"
        lines.append(
            f"{r['strategy']:<10}{r['prompts_ok']:>9}{r['tokens_per_min']:>10,.0f}{share:>8}"
            f"{r['rejected_429']:>7}{r['insufficient_quota']:>7}{r['overloaded_529']:>6}"
            f"{r['duplicates']:>6}{per_ok:>8}"
        )
    return "\n".join(lines)


def _headroom_note(row: dict[str, Any]) -> str:
    """What a ratedeck row's headroom was made of, in one short phrase."""
    parts = [f"{row['headroom_ms']:g} ms from {row['headroom_source']}"]
    if row.get("network_spread_ms") is not None:
        parts.append(f"network spread {row['network_spread_ms']:g} ms")
    if row.get("rtt_spread_ms") is not None:
        parts.append(f"round trips {row['rtt_spread_ms']:g} ms")
    if row.get("server_time_ms") is not None:
        parts.append(f"server time {row['server_time_ms']:g} ms")
    if row.get("rejection_budget"):
        parts.append(f"spent {row['rejections_spent']} of {row['rejection_budget']} rejections")
    if row.get("probe_sent"):
        parts.append(f"{row['probe_sent']} probes")
    return f"{row['strategy']} headroom: " + ", ".join(parts)


def micro_table(micro: list[dict[str, Any]]) -> str:
    """Micro and scaling numbers, one per line."""
    if not micro:
        return ""
    width = max(len(m["name"]) for m in micro)
    return "\n".join(f"{m['name']:<{width}}  {m['value']:>12,.3f} {m['unit']}" for m in micro)


def bar_charts(results: list[ScenarioResult], color: bool, width: int | None = None) -> str:
    """One horizontal plotext bar chart of successful req/s per scenario."""
    import plotext as plt

    width = width or min(100, shutil.get_terminal_size((100, 30)).columns)
    out = []
    for result in results:
        if not result.rows:
            continue
        plt.clear_figure()
        plt.plotsize(width, 2 * len(result.rows) + 6)
        plt.theme("clear")
        llm = any("tokens_per_min" in r for r in result.rows)  # an llm scenario: tokens, not requests
        rows = [r for r in result.rows if "skipped" not in r] if llm else result.rows
        if not rows:
            continue
        plt.bar(
            [r["strategy"] for r in rows],
            [r["tokens_per_min" if llm else "ok_per_s"] for r in rows],
            orientation="horizontal",
            width=0.6,
        )
        if llm:
            plt.title(f"{result.name}: tokens per stub minute (capacity {result.capacity_tps:,.0f})")
        else:
            plt.title(f"{result.name}: successful req/s (capacity {result.capacity_tps:g})")
        out.append(plt.build())
    text = "\n".join(out)
    return text if color else plt.uncolorize(text)


def report_dict(
    results: list[ScenarioResult],
    micro: list[dict[str, Any]],
    *,
    duration_s: float,
    loop: str,
    command: str,
    scaling: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON report: `scenarios` and `micro` with stable names, plus run context."""
    import os
    import sys

    return {
        "command": command,
        "duration_s": duration_s,
        "loop": loop,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "scenarios": [
            {"name": r.name, "summary": r.summary, "capacity_tps": r.capacity_tps, "rows": r.rows}
            for r in results
        ],
        "micro": micro,
        "scaling": scaling or [],
    }


def write_report(data: dict[str, Any], path: str) -> str | None:
    """Write the report; returns an error text instead of raising."""
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        return f"cannot write report {path}: {exc.strerror or exc}"
    return None
