"""Measure limits per model on the OpenAI stub (wall time), as docs/measurements.md's run is made.

    .venv/bin/python -m ratedeck.bench.measure_models 40

Three keys, two models with their own limits per key, as OpenAI's are (a small one at
60 requests and 30,000 tokens per minute, a large one at 500 and 200,000), the minute
scaled to 6 s as `measure_llm` does. The workload mixes the two models' prompts line by
line, fed with no --rate through the OpenAI preset as shipped, no tier told: each key's
buckets per model come from the answers' headers. Prints, per model, the tokens charged
against that model's capacity over the time the run was sending (a full bucket at the
start plus its refill, per key), its 429s, and the duplicates.
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass

from ratedeck.bench.measure_llm import MINUTE_S, run, sending_window
from ratedeck.server.stubs.openai import start_openai

KEYS = [
    "sk-proj-alpha000000000000000001",
    "sk-proj-bravo000000000000000002",
    "sk-proj-charlie00000000000000003",
]
#: Each model's limits per key, per (scaled) minute.
MODELS = {
    "gpt-small": {"rpm": 60, "tpm": 30_000},
    "gpt-large": {"rpm": 500, "tpm": 200_000},
}
PATH = "/v1/chat/completions"


#: One line in this many is the small model's: about its share of the two models' capacity
#: (a job's queue is one line, so a model given far more work than it can take fills the
#: queue ahead of the other's: see docs/llm.md, "Limits per model").
SMALL_EVERY = 9


def prompts(n: int, seed: int = 11) -> list[dict]:
    """`n` prompt lines, one in `SMALL_EVERY` the small model's: prompts of 20..2,000
    characters, max_tokens 200..800 (large) or 400..1,000 (small), so that each model's
    tokens bind before its requests do."""
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while rate limits hold".split()
    lines = []
    for i in range(n):
        model = "gpt-small" if i % SMALL_EVERY == 0 else "gpt-large"
        size = int(20 * (100 ** rng.random()))
        text = " ".join(rng.choice(words) for _ in range(size // 4 + 1))[:size]
        max_tokens = rng.randint(200, 800) if model == "gpt-large" else rng.randint(400, 1000)
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"#{i} {text}"}],
            "max_tokens": max_tokens,
        }
        lines.append({"_id": f"p{i}", "_path": PATH, "_body": body})
    return lines


@dataclass
class ModelResult:
    model: str
    used: float
    capacity: float
    rate_429: int

    @property
    def share(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0


async def measure(seconds: float, latency: float = 0.3) -> tuple[object, list[ModelResult], int]:
    async with await start_openai(keys=KEYS, models=MODELS, minute_s=MINUTE_S, latency=latency) as stub:
        start = stub.now()
        snap = await run("openai", stub.url, prompts(12_000), seconds, KEYS)
        out = []
        for model in MODELS:
            records = [r for r in stub.ledger.records if r.bucket == model]
            arrivals = [r.at for r in records]
            first, last = (min(arrivals), max(arrivals)) if arrivals else sending_window(stub, start)
            used = sum(r.cost for r in records if r.status == 200)
            cap = sum(stub.state.allowed_capacity(first, last, key=k, model=model) for k in KEYS)
            rejected = sum(1 for r in records if r.status == 429)
            out.append(ModelResult(model, used, cap, rejected))
        return snap, out, stub.state.book.duplicates()


def main(seconds: float) -> None:
    snap, results, duplicates = asyncio.run(measure(seconds))
    for r in results:
        print(
            f"{r.model}: {r.used:,.0f} of {r.capacity:,.0f} tokens ({r.share:.3f}); rate-limit 429s {r.rate_429}"
        )
    print(f"duplicates {duplicates}; engine succeeded {snap.succeeded}")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 40.0)
