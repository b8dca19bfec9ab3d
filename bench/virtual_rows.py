"""Issue 44's rows on virtual time: many seeds in seconds, scored as an independent server scores.

    python -m ratedeck.bench.virtual_rows jitter+timing --seeds 17-56 [--by-second]

Each row is the engine against the in-memory simulator (`server/simulated.py`) for 60
virtual seconds: 5 keys x 20/1s moving window counted at arrival, 5..45 ms each way,
20..80 ms of server time, offered the whole capacity, with the engine's default slow start
(as a named target runs it, and as the live bench runs its rows: `scenarios.engine_extra`).
The figure is the sustained efficiency from the simulator's own accept stamps
(`sustained.run_sustained`); the rows with another user score accepted / what they left.

A run costs about half a second of CPU, so forty seeds show what one live minute cannot: how
often a row draws a 429 at all. Live runs stay the measure of record (`ratedeck bench
--scenarios live`); these are where a change is tried first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ratedeck.bench.sustained import run_sustained
from ratedeck.config import load_config
from ratedeck.core.policy import Policy
from ratedeck.engine import Engine
from ratedeck.server.settings import ServerSettings, standard_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual

LIMIT, WINDOW_S, SECONDS, KEYS = 20, 1.0, 60.0, 5
#: Pairs of arrivals are also scored by the second they start in (`--by-second`): these spans.
SPANS = ((0, 1), (1, 2), (2, 3), (3, 12), (12, 60))


@dataclass(frozen=True)
class Row:
    """One row: what the server does, what the client is told and runs with."""

    name: str
    about: str
    server: dict[str, Any]
    target: dict[str, Any]
    engine: dict[str, Any]
    told: str | None = None  # the per-key limit the client is told ("25/1s"); None: the server's
    rate: float = 100.0  # offered, per second, all keys
    other_share: bool = False  # scored as accepted / what another user left


_PLAIN = {"ratelimit_headers": False, "retry_after": False}
ROWS = {
    r.name: r
    for r in (
        Row("jitter+timing", "jitter + Server-Timing", {**_PLAIN, "server_timing": True}, {}, {}),
        Row(
            "jitter+probe",
            "jitter + a probe of /health",
            {**_PLAIN, "health": True},
            {"probe_url": "http://simulator/health"},
            {},
        ),
        Row(
            "jitter+budget",
            "jitter + a budget of 10 rejections",
            dict(_PLAIN),
            {},
            {"rejection_budget": 10, "learn_policy": False},
        ),
        Row("jitter", "jitter, no hints", dict(_PLAIN), {}, {}),
        Row(
            "steady+timing",
            "100..104 ms each way + Server-Timing",
            {**_PLAIN, "server_timing": True, "latency_in_ms": (100, 104), "latency_out_ms": (100, 104)},
            {},
            {},
        ),
        Row(
            "told-wrong",
            "told 25/1s, the server allows 20/1s and escalates",
            {"ratelimit_headers": False, "escalation": True},
            {},
            {},
            told="25/1s",
            rate=125.0,
        ),
        Row(
            "told-wrong+remaining",
            "told 30/1s, the server says X-RateLimit-*",
            {"ratelimit_headers": True},
            {},
            {},
            told="30/1s",
            rate=125.0,
        ),
        Row(
            "shared-keys",
            "another user takes 8/s of each key from 10 s to 30 s",
            {**_PLAIN, "other_load": "8/1s@10s-30s"},
            {},
            {},
            told="20/1s",
            rate=125.0,
            other_share=True,
        ),
    )
}


@dataclass(frozen=True)
class Result:
    seed: int
    figure: float
    rejected: int  # 429s the client saw
    in_cooldown: int  # requests the server refused inside a cooldown it had set
    by_second: dict[str, float]


def _server(row: Row, seed: int) -> ServerSettings:
    base = replace(
        standard_settings(),
        keys=tuple(f"key-00{i}" for i in range(KEYS)),
        policies=(Policy(LIMIT, WINDOW_S),),
        latency_in_ms=(5, 45),
        latency_out_ms=(5, 45),
        processing_ms=(20, 80),
        seed=seed,
    )
    return replace(base, **row.server)


def run_row(row: Row, seed: int) -> Result:
    """One seed of a row: its figure, its 429s and its pairs by the second they start in."""
    server = _server(row, seed)
    keys: dict[str, Any] = {"secrets": list(server.keys)}
    if row.told is not None:
        keys["limits"] = [row.told]
    cfg = load_config(
        preset="study",
        overrides={
            "target": {"nonce_param": "", **row.target},
            "keys": keys,
            "engine": {
                "graveyard_path": "",
                "slow_start": True,
                "ttl_s": 60.0,
                "max_attempts": 20,
                **row.engine,
            },
            "workload": {"rate": row.rate},
            "run": {"seed": seed},
        },
    )
    transport = SimulatedTransport(server, seed=seed)
    snap = run_virtual(Engine(cfg, transport).run(SECONDS))
    rules = transport.rules
    stamps = [sorted(t / 1000.0 for t in key) for key in rules.arrivals_ms()]
    if row.other_share:
        theirs = sum(k["other_accepted"] for k in rules.stats()["keys"])
        figure = snap.succeeded / (KEYS * LIMIT * SECONDS / WINDOW_S - theirs)
    else:
        sustained = run_sustained(stamps, LIMIT, WINDOW_S).mean
        figure = sustained if sustained is not None else 0.0
    return Result(
        seed,
        figure,
        snap.rejected_429,
        rules.stats()["totals"]["requests_during_cooldown"],
        by_second(stamps),
    )


def by_second(stamps: Sequence[Sequence[float]]) -> dict[str, float]:
    """W / the mean gap of the pairs (i, i+N) whose first arrival falls in each of `SPANS`
    (seconds from the first arrival), over every key."""
    if not any(stamps):
        return {}
    start = min(t[0] for t in stamps if t)
    gaps: dict[tuple[int, int], list[float]] = {span: [] for span in SPANS}
    for t in stamps:
        for i in range(len(t) - LIMIT):
            at = t[i] - start
            for span in SPANS:
                if span[0] <= at < span[1]:
                    gaps[span].append(t[i + LIMIT] - t[i])
                    break
    return {f"{a}-{b}s": round(WINDOW_S / statistics.fmean(g), 4) for (a, b), g in gaps.items() if g}


def _seeds(text: str) -> list[int]:
    try:
        if "-" in text:
            a, b = (int(x) for x in text.split("-", 1))
            if a > b:
                raise ValueError
            return list(range(a, b + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are A-B or A,B,C (whole numbers, A <= B), got {text!r}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ratedeck.bench.virtual_rows",
        description="Issue 44's rows on virtual time, seed by seed: sustained efficiency from the "
        "simulator's accept stamps, 429s, and the runs that drew any. Rows: "
        + ", ".join(f"{r.name} ({r.about})" for r in ROWS.values()),
    )
    p.add_argument("rows", nargs="+", metavar="ROW", help="one or more of: " + ", ".join(ROWS))
    p.add_argument("--seeds", type=_seeds, default=_seeds("17-56"), help="A-B or A,B,C (default 17-56)")
    p.add_argument("--by-second", action="store_true", help="also score pairs by the second they start in")
    args = p.parse_args(argv)
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown row {unknown[0]!r}; rows: {', '.join(ROWS)}")
    for name in args.rows:
        row = ROWS[name]
        results = []
        for seed in args.seeds:
            r = run_row(row, seed)
            results.append(r)
            extra = f"  {r.by_second}" if args.by_second else ""
            print(
                f"{name} seed {seed}: {r.figure:.4f}, 429s {r.rejected}, into a cooldown {r.in_cooldown}{extra}",
                flush=True,
            )
        hit = [r.seed for r in results if r.rejected]
        what = "of what they left" if row.other_share else "sustained"
        print(
            f"{name}: mean {statistics.fmean(r.figure for r in results):.4f} {what} over {len(results)} seeds; "
            f"runs with a 429: {len(hit)}{' (' + ', '.join(map(str, hit)) + ')' if 0 < len(hit) <= 10 else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
