"""Measure the LLM presets on their loopback stubs (wall time), as docs/measurements.md's LLM runs are made.

    .venv/bin/python -m ratedeck.bench.measure_llm openai 40      # 3 keys, one with no quota, a 6 s minute
    .venv/bin/python -m ratedeck.bench.measure_llm anthropic 40   # 3 keys, 3% 529s, a 6 s minute

Each run is a workload of prompts of many sizes with no --rate (fed as fast as the limits
allow), through the preset as shipped and with no tier told: the keys' limits come from the
answers' headers. Prints what the stub's ledger says: tokens charged against the capacity
(a full bucket at the start plus its refill, over the time the run was sending: from the
first request's arrival at the stub to the last one's, so the process's start and the drain
of the last answers are not counted against it), 429s by code, duplicates.
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass

from ratedeck.bench.measure_jobs import run_job
from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.openai import start_openai

OPENAI_KEYS = [
    "sk-proj-alpha000000000000000001",
    "sk-proj-bravo000000000000000002",
    "sk-proj-nocash00000000000000003",
]
ANTHROPIC_KEYS = [
    "sk-ant-api03-alpha0000000000001",
    "sk-ant-api03-bravo0000000000002",
    "sk-ant-api03-charlie000000000003",
]
MINUTE_S = 6.0


def prompts(n: int, path: str, seed: int = 7) -> list[dict]:
    """`n` prompt lines of many sizes (20..2,000 characters, max_tokens 50..400)."""
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while rate limits hold".split()
    lines = []
    for i in range(n):
        size = int(20 * (100 ** rng.random()))  # 20..2,000, as many small as large
        text = " ".join(rng.choice(words) for _ in range(size // 4 + 1))[:size]
        body: dict = {
            "messages": [{"role": "user", "content": f"#{i} {text}"}],
            "max_tokens": rng.randint(50, 400),
        }
        body["model"] = "gpt-4o-mini" if "chat" in path else "claude-3-5-haiku-latest"
        lines.append({"_id": f"p{i}", "_path": path, "_body": body})
    return lines


@dataclass
class Result:
    snap: object
    used: float  # the units the capacity counts, served
    capacity: float
    rate_429: int
    quota_429: int
    overloaded: int
    duplicates: int
    stub_ok: int

    @property
    def share(self) -> float:
        return self.used / self.capacity

    def line(self, name: str) -> str:
        s = self.snap
        return (
            f"{name}: {self.used:,.0f} of {self.capacity:,.0f} ({self.share:.3f}); "
            f"rate-limit 429s {self.rate_429}, insufficient_quota {self.quota_429}, 529s {self.overloaded}, "
            f"duplicates {self.duplicates}; stub ok {self.stub_ok}, engine succeeded {s.succeeded}"  # type: ignore[attr-defined]
        )


async def run(
    preset: str, url: str, lines: list[dict], seconds: float | None, keys: list[str], **overrides
) -> object:
    """`measure_jobs.run_job` with these keys: the preset as shipped, a workload file of `lines`."""
    return await run_job(preset, url, lines, seconds, keys={"secrets": keys}, **overrides)


def sending_window(stub, started: float) -> tuple[float, float]:
    """From the first request's arrival to the last one's (the stub's start if none came)."""
    arrivals = stub.ledger.arrivals()
    return (min(arrivals), max(arrivals)) if arrivals else (started, started)


async def openai(seconds: float, latency: float = 0.3) -> Result:
    live = OPENAI_KEYS[:2]
    async with await start_openai(
        keys=OPENAI_KEYS, rpm=500, tpm=30_000, minute_s=MINUTE_S, no_quota=OPENAI_KEYS[2:], latency=latency
    ) as stub:
        start = stub.now()
        snap = await run("openai", stub.url, prompts(6000, "/v1/chat/completions"), seconds, OPENAI_KEYS)
        start, end = sending_window(stub, start)
        used = sum(stub.ledger.units(key=k) for k in live)
        cap = sum(stub.allowed_capacity(start, end, key=k) for k in live)
        book = stub.state.book
        rate = sum(c["rate_limit_exceeded"] for c in book.refusals.values())
        quota = sum(c["insufficient_quota"] for c in book.refusals.values())
        ok = len(stub.ledger.accepted())
        return Result(snap, used, cap, rate, quota, 0, book.duplicates(), ok)


async def anthropic(seconds: float, latency: float = 0.3) -> Result:
    async with await start_anthropic(
        keys=ANTHROPIC_KEYS,
        rpm=500,
        itpm=60_000,
        otpm=12_000,
        minute_s=MINUTE_S,
        overload_share=0.03,
        latency=latency,
    ) as stub:
        start = stub.now()
        snap = await run("anthropic", stub.url, prompts(6000, "/v1/messages"), seconds, ANTHROPIC_KEYS)
        start, end = sending_window(stub, start)
        used = sum(stub.state.output_used.values())
        cap = sum(stub.allowed_capacity(start, end, key=k, bucket="output-tokens") for k in ANTHROPIC_KEYS)
        book = stub.state.book
        rate = sum(c["rate_limit_error"] for c in book.refusals.values())
        over = sum(c["overloaded_error"] for c in book.refusals.values())
        ok = len(stub.ledger.accepted())
        return Result(snap, used, cap, rate, 0, over, book.duplicates(), ok)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "openai"
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
    result = asyncio.run(openai(secs) if which == "openai" else anthropic(secs))
    print(result.line(which))
