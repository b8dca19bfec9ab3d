"""Python opcodes per succeeded request on a fixed virtual-time run (deterministic CPU proxy).

Run from a ratedeck checkout with its venv:  .venv/bin/python -m tests.perf.opcodes [TOTAL] [openai]
Scenarios: `study` (the study preset on the simulator: plain keys, requests spend alike) and
`openai` (3,000 prompts through the openai preset on 5 keys against the in-memory OpenAI stub,
tokens binding: routed budgets and model lanes, so every request goes through `admit`).
Counts every opcode of Python code (sys.settrace with f_trace_opcodes) from engine.run's start to its end.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

count = 0


def local(frame, event, arg):
    global count
    if event == "opcode":
        count += 1
    return local


def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    return local


def traced(coro):
    sys.settrace(tracer)
    try:
        return run_virtual(coro)
    finally:
        sys.settrace(None)


def openai() -> None:
    global count
    from tests.engine.test_progress import STUB_DEFAULT, openai_job

    async def main(engine):
        engine.start()
        await engine.finished.wait()
        return await engine.stop()

    with tempfile.TemporaryDirectory() as tmp:
        engine = openai_job(Path(tmp), {"gpt-4o-mini": STUB_DEFAULT}, 100, 0.2)
        count = 0
        snap = traced(main(engine))
    ok = snap.succeeded
    print(
        f"openai 3000 prompts: succeeded={ok} 429s={snap.rejected_429}"
        f" elapsed={snap.makespan.elapsed_s:.3f}s opcodes={count} per ok={count / max(ok, 1):.1f}"
    )


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    if len(sys.argv) > 2 and sys.argv[2] == "openai":
        openai()
        return
    with tempfile.TemporaryDirectory() as tmp:
        engine, _ = seed_engine(Path(tmp), workload={"total": total})
        coro = engine.run(60.0)
        sys.settrace(tracer)
        try:
            snap = run_virtual(coro)
        finally:
            sys.settrace(None)
    ok = snap.succeeded
    print(
        f"study total={total}: succeeded={ok} 429s={snap.rejected_429}"
        f" elapsed={snap.elapsed_s:.3f}s opcodes={count} per ok={count / max(ok, 1):.1f}"
    )


if __name__ == "__main__":
    main()
