"""`ratedeck status --store URL`: a store's jobs by state, read without running anything.

A job is pending (enqueued, not yet claimed), sending (claimed by a run: queued,
on the wire, or ended and not yet journaled), done (journaled: succeeded,
expired or shed), uncertain (a killed run may have sent it; never sent again
without an Idempotency-Key) or in the graveyard (done, buried after its last
attempt). A file that is not there is a mistake, not a new store: status
creates nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ratedeck.core.exits import ExitCode
from ratedeck.core.secrets import safe_url
from ratedeck.store import StoreError
from ratedeck.store.base import StoreCounts
from ratedeck.store.open import MEMORY, open_store

from .common import fail, parse_args

#: The states, in the order a job goes through them, as status prints them.
STATES = ("pending", "sending", "done", "uncertain", "graveyard")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck status",
        description="A store's jobs by state (pending, sending, done, uncertain, graveyard), read without"
        " running anything: 'ratedeck enqueue' fills a store, 'ratedeck --store URL' works it.",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        required=True,
        help="sqlite:PATH, redis://host:port/db or redis+cluster://host:port,host:port",
    )
    p.add_argument("--json", action="store_true", help="one JSON object: each state's count, and the total")
    return p


def by_state(counts: StoreCounts) -> dict[str, int]:
    """Each state's count: done is every ending but the graveyard's, which has its own line."""
    graveyard = counts.done.get("graveyard", 0)
    return {
        "pending": counts.pending,
        "sending": counts.claimed,
        "done": sum(counts.done.values()) - graveyard,
        "uncertain": counts.uncertain,
        "graveyard": graveyard,
    }


def status_lines(url: str, counts: StoreCounts) -> list[str]:
    """The store's jobs, a state a line: "pending      1,200", done with its endings."""
    states = by_state(counts)
    width = max(len(f"{n:,}") for n in [counts.total, *states.values()])
    lines = [f"store        {url}"]
    for state in STATES:
        line = f"{state:<12} {states[state]:>{width},}"
        if state == "done" and states["done"]:
            endings = [(e, n) for e, n in sorted(counts.done.items()) if e != "graveyard" and n]
            line += "  (" + ", ".join(f"{e} {n:,}" for e, n in endings) + ")"
        lines.append(line)
    lines.append(f"{'total':<12} {counts.total:>{width},}")
    return lines


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    url = parsed.store.strip()
    shown = safe_url(url) or url
    if url == MEMORY:
        return fail("--store: memory keeps no jobs: name a store, sqlite:PATH or redis://host:port/db")
    if url.startswith("sqlite:"):
        path = Path(url.removeprefix("sqlite:"))
        if not path.is_file() and not path.is_dir():
            return fail(f"--store: {shown}: no such file (ratedeck enqueue --store {shown} FILE makes one)")
    try:
        store = open_store(url)
    except StoreError as exc:
        return fail(f"--store: {shown}: {exc}")
    assert store is not None

    async def read() -> StoreCounts:
        try:
            return await store.counts()
        finally:
            await store.close()

    try:
        counts = asyncio.run(read())
    except StoreError as exc:
        return fail(f"--store: {store.url}: {exc}")
    if parsed.json:
        print(json.dumps({"store": store.url, **by_state(counts), "total": counts.total}))
    else:
        print("\n".join(status_lines(store.url, counts)))
    return ExitCode.OK
