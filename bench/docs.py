"""The docs' benchmark tables, rendered from saved bench reports (never edited by hand).

A documented run saves its results with `ratedeck bench ... --report docs/bench/NAME.json`.
A page marks where that run's tables go, and what is between the markers is generated:

    <!-- bench:NAME -->           the run's tables as `ratedeck bench` prints them
    <!-- /bench:NAME -->

    <!-- bench:NAME share -->     one row per scenario, one column per strategy: the share
    <!-- /bench:NAME -->          of the limit the server saw, and its 429s

NAME is a file `bench/NAME.json` beside the page. `python -m ratedeck.bench.docs
docs/benchmarks.md` rewrites the page; `--check` changes nothing and exits 1 when
the page differs from what its reports render (a stale table).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .output import ScenarioResult, micro_table, scenario_table

FORMATS = ("text", "share")
_BLOCK = re.compile(
    r"(?P<open><!-- bench:(?P<name>[\w.+-]+)(?: (?P<fmt>\w+))? -->\n)(?P<body>.*?)(?P<close><!-- /bench:(?P=name) -->)",
    re.S,
)


class DocsError(Exception):
    """A marker names a report that is missing or unreadable, or an unknown format."""


def load_report(path: Path) -> dict[str, Any]:
    """A saved `ratedeck bench --report` file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DocsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise DocsError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or "scenarios" not in data or "command" not in data:
        raise DocsError(f"{path}: not a ratedeck bench report (no 'scenarios' or 'command')")
    return data


def command(report: dict[str, Any]) -> str:
    """The command that made a report, as typed (`--duration 4`, recorded as `4.0`)."""
    return re.sub(r"(--duration )(\d+)\.0\b", r"\1\2", report["command"])


def _made_by(report: dict[str, Any]) -> str:
    machine = report.get("machine", {})
    return (
        f"Made by `{command(report)}` (loop {report.get('loop', '?')}; "
        f"{machine.get('cpus', '?')} CPUs, Python {machine.get('python', '?')})."
    )


def render_text(report: dict[str, Any]) -> str:
    """The run's scenario tables (and micro numbers) as the bench printed them, in a code block."""
    parts = []
    for s in report["scenarios"]:
        result = ScenarioResult(s["name"], s["summary"], s["capacity_tps"], s["rows"])
        parts.append(scenario_table(result, report["duration_s"]))
    if report.get("micro"):
        parts.append("micro\n" + micro_table(report["micro"]))
    return _made_by(report) + "\n\n```text\n" + "\n\n".join(parts) + "\n```\n"


def _share_cell(row: dict[str, Any]) -> str:
    share = row.get("share")
    head = f"{share:.3f}" if share is not None else f"{row['pct_capacity']:.1f}%*"
    return f"{head}, {row['rejected_429']} 429s"


def render_share(report: dict[str, Any]) -> str:
    """One markdown row per scenario, one column per strategy: the share of the limit the
    server saw (or, without one, successes as a percentage of capacity), then 429s."""
    strategies: list[str] = []
    for s in report["scenarios"]:
        strategies += [r["strategy"] for r in s["rows"] if r["strategy"] not in strategies]
    lines = [
        "| scenario | " + " | ".join(strategies) + " |",
        "| --- |" + " --- |" * len(strategies),
    ]
    for s in report["scenarios"]:
        cells = {r["strategy"]: _share_cell(r) for r in s["rows"]}
        row = [f"{s['name']}: {s['summary']}", *(cells.get(name, "") for name in strategies)]
        lines.append("| " + " | ".join(row) + " |")
    marked = any(r.get("share") is None for s in report["scenarios"] for r in s["rows"])
    note = (
        "\n\n\\* no sustained share (the server leaves each key's first 5 s out, and the run was"
        " shorter or the client never reached the limit): successes as a percentage of capacity."
        if marked
        else ""
    )
    return _made_by(report) + "\n\n" + "\n".join(lines) + note + "\n"


def render_block(name: str, fmt: str, page_dir: Path) -> str:
    """What goes between one pair of markers."""
    report = load_report(page_dir / "bench" / f"{name}.json")
    if fmt == "text":
        return render_text(report)
    if fmt == "share":
        return render_share(report)
    raise DocsError(f"bench:{name}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def render_page(text: str, page_dir: Path) -> str:
    """The page with every marked block rendered again from its report."""

    def one(m: re.Match[str]) -> str:
        body = render_block(m["name"], m["fmt"] or "text", page_dir)
        return m["open"] + "\n" + body + "\n" + m["close"]

    return _BLOCK.sub(one, text)


def blocks(text: str) -> list[str]:
    """The report names a page's markers use, in order."""
    return [m["name"] for m in _BLOCK.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ratedeck.bench.docs [--check] PAGE...`: 0 done (or fresh), 1 stale, 2 bad input."""
    p = argparse.ArgumentParser(
        prog="python -m ratedeck.bench.docs",
        description="Render the benchmark tables of docs pages from their saved bench reports.",
    )
    p.add_argument("pages", nargs="*", metavar="PAGE", default=["docs/benchmarks.md"])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is stale")
    args = p.parse_args(argv)
    stale = []
    for page in map(Path, args.pages):
        try:
            text = page.read_text(encoding="utf-8")
            rendered = render_page(text, page.parent)
        except OSError as exc:
            print(f"ratedeck bench docs: error: {page}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        except DocsError as exc:
            print(f"ratedeck bench docs: error: {page}: {exc}", file=sys.stderr)
            return 2
        if rendered == text:
            continue
        if args.check:
            stale.append(str(page))
        else:
            page.write_text(rendered, encoding="utf-8")
            print(f"rendered {page} ({len(blocks(text))} tables)")
    if stale:
        print(
            f"ratedeck bench docs: stale: {', '.join(stale)}; run python -m ratedeck.bench.docs {' '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
