"""Issue 44's live rows with ratedeck run as a user runs it: the real CLI, scored by the server.

    python -m ratedeck.bench.cli_rows ROW [ROW ...] [--runs 2] [--duration 60] [--json FILE]

Each run starts the live bench's server for its row (the simulator and the jitter proxy in
front of it, each in its own process: `bench/scenarios.py`, `LIVE_TABLE`), then runs
`ratedeck --no-ui` in a subprocess against the proxy with only what a user gives: the target,
the keys, the limit they were told, the offered rate, the duration (and `--probe-url` or
`--rejection-budget 10` for those rows). No preset, an empty HOME, the defaults. The figure
is the sustained efficiency from the simulator's own accept stamps (`bench/sustained.py`), as
an independent server scores a run; for the shared-keys row, accepted / what the other user
left. With it: 429s, requests refused inside a cooldown, the CLI's exit code, and its CPU per
accepted request (the whole process, its imports and start included).

The CPU rows (`heavy`, `heavy+hints`: `live-heavy`'s 50 keys x 100/1s, the second with every
limit header on every answer) also run the plain peer, on a fresh server of the same kind,
after the CLI on odd runs and before it on even ones (a box whose load drifts favours neither
side over a pair of runs), and measure both as whole processes (imports and start included, as a harness timing a
process sees them): the figure is ratedeck's CPU per accepted request over the peer's.

The scenario bench (`ratedeck bench --scenarios live`) runs the engine in-process on the
study preset with the same server; this is the run an independent harness makes. It found
what the scenario bench had not: a 429 on the jitter + Server-Timing row in 1 run of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

from .procs import JitterProxyProcess, Simulator, run_child
from .scenarios import SCENARIOS, Scenario
from .spec import RunSpec
from .sustained import run_sustained

#: Row -> (the live scenario whose server it runs, what the user adds to the command line).
ROWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "steady+timing": ("live-steady+timing", ()),
    "jitter+timing": ("live-jitter+timing", ()),
    "jitter+probe": ("live-jitter", ("--probe-url", "{base}/health")),
    "jitter+budget": ("live-jitter", ("--rejection-budget", "10")),
    "jitter": ("live-jitter", ()),
    "told-wrong": ("live-told-wrong", ()),
    "told-wrong+remaining": ("live-told-wrong+remaining", ()),
    "shared-keys": ("live-shared-keys", ()),
    # The CPU row, both ways: whole processes, imports and start included, each side's.
    "heavy": ("live-heavy", ()),
    "heavy+hints": ("live-heavy+hints", ()),
}
#: Rows whose figure is CPU per accepted request against the plain peer's (ratedeck / peer).
CPU_ROWS = frozenset({"heavy", "heavy+hints"})


@dataclass(frozen=True)
class CliRun:
    row: str
    run: int
    figure: float | None  # sustained efficiency; accepted / what they left for shared-keys
    rejected_429: int
    in_cooldown: int  # requests the server refused inside a cooldown it had set
    accepted: int
    exit_code: int
    cpu_us_per_ok: float | None  # the CLI process's user + system CPU, imports included
    peer_cpu_us_per_ok: float | None = None  # the plain peer's, as a whole process (`CPU_ROWS`)
    peer_accepted: int | None = None


def command(scenario: Scenario, base: str, extra: tuple[str, ...], duration_s: float) -> list[str]:
    """`ratedeck --no-ui ...` as a user would type it for `scenario`'s server at `base`."""
    told = scenario.told_limit or scenario.limit
    return [
        os.path.join(os.path.dirname(sys.executable), "ratedeck"),
        "--no-ui",
        "--target",
        f"{base}/api/request",
        "--keys",
        ",".join(scenario.keys),
        "--limit",
        f"{told}/{scenario.window_s:g}s",
        "--nonce-param",
        "none",
        "--rate",
        f"{scenario.offered_tps:g}",
        "--duration",
        f"{duration_s:g}",
        *(part.format(base=base) for part in extra),
    ]


def figure(scenario: Scenario, stats: dict[str, Any], accepted: int, duration_s: float) -> float | None:
    """The row's figure from the server's stats (`GET /stats?arrivals=1`)."""
    theirs = sum(k.get("other_accepted", 0) for k in stats["keys"])
    if theirs:
        left = len(scenario.keys) * scenario.limit * duration_s / scenario.window_s - theirs
        return accepted / left if left > 0 else None
    stamps = ([t / 1000.0 for t in key] for key in stats["arrivals_ms"])
    return run_sustained(stamps, scenario.limit, scenario.window_s).mean


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_peer(scenario: Scenario, duration_s: float, seed: int) -> tuple[float | None, int]:
    """The plain peer (one `AsyncLimiter` per key over one aiohttp session, `bench/baselines.py`)
    on `scenario`'s server, as a whole process: its CPU per accepted request, imports and start
    included as the CLI's are (a finished child's, by `RUSAGE_CHILDREN`), and its accepted."""
    assert scenario.jitter_ms is not None
    with (
        Simulator(scenario.serve_args, seed=seed) as sim,
        JitterProxyProcess(sim.base, scenario.jitter_ms, seed=seed, max_s=duration_s + 90.0) as proxy,
    ):
        spec = RunSpec(
            "aiolimiter",
            f"{proxy.base}/api/request",
            scenario.keys,
            scenario.client_limit,
            scenario.window_s,
            scenario.nonce,
            scenario.offered_tps,
            duration_s,
            in_flight=scenario.in_flight,
            seed=seed,
        )
        before = _children_cpu_s()
        run_child(spec)
        cpu_s = _children_cpu_s() - before
        accepted = sum(k["accepted"] for k in sim.stats()["keys"])
    return (round(cpu_s / accepted * 1e6, 1) if accepted else None), accepted


def run_row(row: str, run: int, duration_s: float, seed: int) -> CliRun:
    """One run of `row`: its server up, the CLI against it, the server's account read; for
    `CPU_ROWS`, then the plain peer on a fresh server of the same kind."""
    name, extra = ROWS[row]
    scenario = SCENARIOS[name]
    assert scenario.jitter_ms is not None
    peer: tuple[float | None, int | None] = (None, None)
    peer_first = row in CPU_ROWS and run % 2 == 0
    if peer_first:  # alternate: a box whose load drifts favours neither side across runs
        peer = run_peer(scenario, duration_s, seed)
    with (
        Simulator(scenario.serve_args, seed=seed) as sim,
        JitterProxyProcess(sim.base, scenario.jitter_ms, seed=seed, max_s=duration_s + 90.0) as proxy,
        tempfile.TemporaryDirectory(prefix="ratedeck-cli-row-") as home,
    ):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "RATEDECK_"))}
        env.update(HOME=home, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            command(scenario, proxy.base, extra, duration_s),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=duration_s + 120.0,
            check=False,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stats = sim.stats(arrivals=True)
    if done.returncode not in (0, 1):  # 1: the run ended with failures a user is told of
        sys.stderr.write(done.stderr[-2000:])
    accepted = sum(k["accepted"] for k in stats["keys"])
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    totals = stats["totals"]
    mine = round(cpu_s / accepted * 1e6, 1) if accepted else None
    if row in CPU_ROWS and not peer_first:
        peer = run_peer(scenario, duration_s, seed)
    return CliRun(
        row,
        run,
        (mine / peer[0] if mine and peer[0] else None)
        if row in CPU_ROWS
        else figure(scenario, stats, accepted, duration_s),
        int(totals.get("rejected_429", 0)),
        int(totals.get("requests_during_cooldown", 0)),
        accepted,
        done.returncode,
        mine,
        *peer,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ratedeck.bench.cli_rows",
        description="Issue 44's live rows with the real CLI run as a user runs it, scored from the "
        "server's accept stamps. Rows: " + ", ".join(ROWS),
    )
    p.add_argument("rows", nargs="+", metavar="ROW", help="one or more of: " + ", ".join(ROWS))
    p.add_argument("--runs", type=int, default=2, help="runs of each row (default 2)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds a run (default 60)")
    p.add_argument("--seed", type=int, default=1, help="the server's and the proxy's seed (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write every run here")
    args = p.parse_args(argv)
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown row {unknown[0]!r}; rows: {', '.join(ROWS)}")
    if not 1 <= args.runs <= 10 or not 5 <= args.duration <= 600:
        p.error(f"--runs must be 1 to 10 and --duration 5 to 600 s, got {args.runs} and {args.duration:g}")
    results: list[CliRun] = []
    for row in args.rows:
        mine = []
        for n in range(1, args.runs + 1):
            r = run_row(row, n, args.duration, args.seed + n - 1)
            mine.append(r)
            shown = "-" if r.figure is None else f"{r.figure:.4f}"
            if row in CPU_ROWS:
                shown = (
                    f"CPU {r.cpu_us_per_ok} µs per accepted request against the peer's "
                    f"{r.peer_cpu_us_per_ok} = {'-' if r.figure is None else f'{r.figure:.2f}x'} "
                    f"({r.accepted:,} vs {r.peer_accepted or 0:,} accepted)"
                )
            print(
                f"{row} run {n}: {shown}, 429s {r.rejected_429}, into a cooldown {r.in_cooldown}, "
                f"exit {r.exit_code}, CPU {r.cpu_us_per_ok} µs per accepted request",
                flush=True,
            )
        figures = [r.figure for r in mine if r.figure is not None]
        what = (
            "of what they left"
            if row == "shared-keys"
            else "CPU against the peer (x)"
            if row in CPU_ROWS
            else "sustained"
        )
        if figures:
            print(f"{row}: mean {statistics.fmean(figures):.4f}, least {min(figures):.4f} {what}")
        results.extend(mine)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in results], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
