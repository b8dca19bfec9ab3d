"""The child process that runs one strategy (or one micro job) and reports on stdout.

    python -m ratedeck.bench.child  < spec.json

It reads a `RunSpec` as JSON on stdin and prints one line `RESULT {json}`:
the strategy's counters plus `cpu_s` (user + system CPU of this process
during the run, imports excluded) and `peak_rss_mb` (this process's peak
resident memory, imports included, since a user pays for those too).
One process per run keeps CPU and memory figures per strategy and fair.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from ratedeck.core.loops import loop_factory

from .spec import RunSpec

RESULT_PREFIX = "RESULT "


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    Linux: VmHWM from /proc, the high-water mark of this program's own memory.
    Not ru_maxrss: Linux keeps that across fork and exec, so a child would
    report its parent's peak if that was higher.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def cpu_now() -> float:
    """User + system CPU seconds of this process, all threads (microsecond resolution)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_spec(spec: RunSpec) -> dict[str, Any]:
    """Run one job in this process; returns its JSON-ready result."""
    from . import micro

    if spec.strategy in micro.JOBS:
        with asyncio.Runner(loop_factory=loop_factory(spec.loop)) as runner:
            return runner.run(micro.JOBS[spec.strategy](spec))
    if spec.strategy == "improved-threads":
        from .threaded import run_improved_threads

        runner_fn: Callable[[], dict] = lambda: run_improved_threads(spec).summary()  # noqa: E731
    else:
        if spec.strategy.startswith("ratedeck"):
            from .engine_run import run_engine as coro_fn

            async def job() -> dict:
                return await coro_fn(spec)
        else:
            from .baselines import ASYNC_RUNNERS

            async def job() -> dict:
                return (await ASYNC_RUNNERS[spec.strategy](spec)).summary()

        def runner_fn() -> dict:
            with asyncio.Runner(loop_factory=loop_factory(spec.loop)) as runner:
                return runner.run(job())

    cpu0, t0 = cpu_now(), time.monotonic()
    out = runner_fn()
    # With engine processes of its own (ratedeck --procs), their CPU since their engines
    # started is added: like this process's own figure, it leaves out their imports.
    out["cpu_s"] = cpu_now() - cpu0 + out.pop("engine_procs_cpu_s", 0.0)
    out["wall_s"] = time.monotonic() - t0
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> int:
    spec = RunSpec.from_json(json.load(sys.stdin))
    result = run_spec(spec)
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
