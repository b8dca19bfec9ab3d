"""`ratedeck bench`: rate-limit clients head to head, plus micro and scaling numbers.

Each strategy runs in its own child process against a fresh simulator
(`ratedeck serve`) in another, for the same duration, one after another.
Successes, expirations and latency come from the client; 429s and nonce
rejections from the simulator's own counters. Then: limiter acquire cost
against aiolimiter and pyrate-limiter, the engine's maximum throughput
against a bare aiohttp loop, and how CPU per request and memory grow with
the number of keys and the queue's depth.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ratedeck.core.exits import ExitCode
from ratedeck.core.loops import LOOP_NAMES

if TYPE_CHECKING:
    from .spec import RunSpec

from .scenarios import (
    DEFAULT_SCENARIOS,
    DEFAULT_STRATEGIES,
    GROUPS,
    JOB_SCENARIOS,
    JOB_STRATEGIES,
    LLM_SCENARIOS,
    LLM_STRATEGIES,
    NEEDS_HEALTH,
    SCENARIOS,
    STRATEGIES,
    engine_extra,
)

DEFAULT_DURATION_S = 20.0
QUICK_DURATION_S = 2.0
LLM_DURATION_S = 40.0  # the llm group's default per strategy; --duration overrides it
MICRO_S = 3.0  # each throughput and scaling run
MICRO_IN_FLIGHT = 8  # per key, in the throughput runs
SCALE_KEYS = (5, 50, 500)
SCALE_QUEUE = (1_000, 10_000, 100_000, 1_000_000)
SCALE_TOTAL_TPS = 1000  # keys share this rate in the key-scaling runs
SCALE_QUEUE_DRAIN_TPS = 200  # the queue-scaling runs drain this fast
UNLIMITED = (
    "--mode",
    "standard",
    "--limit",
    "1000/1ms",
    "--latency",
    "0",
    "--no-ratelimit-headers",
    "--no-retry-after",
)


class UsageError(Exception):
    """Bad command-line input; the message is the whole line to print."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line instead of usage + message
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ratedeck bench",
        description="Run rate-limit clients one after another against the same simulator scenarios "
        "and compare successful req/s, the sustained share of the limit the server saw, 429s, "
        "latency, CPU and memory; then micro benchmarks and scaling. Scenarios: "
        + ", ".join(SCENARIOS)
        + "; groups: "
        + ", ".join(f"{g} ({', '.join(names)})" for g, names in GROUPS.items())
        + ". Strategies: "
        + ", ".join(STRATEGIES)
        + " (without --strategies, each scenario runs its own list). The jobs group ("
        + ", ".join(JOB_SCENARIOS)
        + ") works N jobs under each policy kind and prints the makespan ratio (the time to the"
        " last job over the least time the limits allow); its strategies: "
        + ", ".join(JOB_STRATEGIES)
        + ". The llm group ("
        + ", ".join(LLM_SCENARIOS)
        + ") sends prompts through OpenAI and Anthropic keys of loopback stubs at their tokens-per-minute limits"
        " and prints tokens per minute, the share of the token capacity, 429s and duplicates from the stub's"
        " ledger; its strategies: "
        + ", ".join(LLM_STRATEGIES)
        + ". The gateway scenario (opt-in) sends the same"
        " small prompts straight to an OpenAI stub and through `ratedeck gateway`, and prints the latency the"
        " gateway adds and its CPU per proxied request.",
    )
    p.add_argument(
        "--duration",
        metavar="S",
        default=None,
        help=f"seconds each strategy runs per scenario (default {DEFAULT_DURATION_S:g}; "
        f"{LLM_DURATION_S:g} in the llm group)",
    )
    p.add_argument("--scenarios", metavar="A,B", help="only these scenarios (comma-separated)")
    p.add_argument("--strategies", metavar="A,B", help="only these strategies (comma-separated)")
    p.add_argument(
        "--micro",
        choices=("full", "limiter", "none"),
        default=None,
        help="micro benchmarks: full (limiter, throughput, scaling; the default), limiter only, or none",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a tiny run: {QUICK_DURATION_S:g} s per strategy and the limiter micro only",
    )
    p.add_argument("--report", metavar="FILE", help="write the results as JSON")
    p.add_argument(
        "--loop",
        choices=LOOP_NAMES,
        default="uvloop",
        help="event loop for every asyncio client, ratedeck and peers alike (default uvloop, as ratedeck runs)",
    )
    p.add_argument("--seed", metavar="N", default="1", help="seed for latency draws and arrivals")
    p.add_argument("--no-chart", action="store_true", help="print the table without bar charts")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check the options; raises `UsageError` with one line for bad input."""
    args = build_parser().parse_args(list(argv))
    args.duration_given = args.duration is not None
    if args.duration is None:
        args.duration = QUICK_DURATION_S if args.quick else DEFAULT_DURATION_S
    else:
        try:
            args.duration = float(args.duration)
        except ValueError:
            raise UsageError(f"--duration: expected seconds, got {args.duration!r}") from None
        if not args.duration > 0 or args.duration != args.duration or args.duration == float("inf"):
            raise UsageError(f"--duration: must be a number of seconds above 0, got {args.duration:g}")
    args.scenarios = _names(
        "--scenarios",
        args.scenarios,
        {**SCENARIOS, **JOB_SCENARIOS, **LLM_SCENARIOS, "gateway": None},
        GROUPS,
        DEFAULT_SCENARIOS,
    )
    args.strategies_given = args.strategies is not None
    args.strategies = _names(
        "--strategies",
        args.strategies,
        {**STRATEGIES, **JOB_STRATEGIES, **LLM_STRATEGIES},
        {},
        DEFAULT_STRATEGIES,
    )
    if args.micro is None:
        args.micro = "limiter" if args.quick else "full"
    try:
        args.seed = int(args.seed)
    except ValueError:
        raise UsageError(f"--seed: expected a whole number, got {args.seed!r}") from None
    return args


def _names(
    flag: str,
    text: str | None,
    known: dict[str, Any],
    groups: dict[str, tuple[str, ...]],
    default: tuple[str, ...],
) -> list[str]:
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    listed = ", ".join([*known, *groups])
    if not names:
        raise UsageError(f"{flag}: expected names, got {text!r}; known: {listed}")
    out: list[str] = []
    for name in names:
        if name in groups:
            out.extend(groups[name])
        elif name in known:
            out.append(name)
        else:
            raise UsageError(f"{flag}: unknown name {name!r}; known: {listed}")
    return list(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    """`ratedeck bench [options]`: 0 when done, 2 on bad input, 1 if a run failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"ratedeck bench: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    from .output import bar_charts, micro_table, report_dict, scenario_table, write_report
    from .procs import BenchError

    command = "ratedeck bench" + ("" if not argv else " " + shlex.join(argv))
    try:
        results = run_scenarios(args)
        micro, scaling = run_micro(args)
    except BenchError as exc:
        print(f"ratedeck bench: error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        print("ratedeck bench: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(
        f"\n{command}  (loop {args.loop}; every strategy offered each scenario's capacity; "
        "429s and nonce rejections as the simulator counted them; latency = round trip of "
        "successful attempts)\n"
    )
    for result in results:
        print(scenario_table(result, args.duration))
        print()
    if results and not args.no_chart:
        print(bar_charts(results, color=sys.stdout.isatty()))
        print()
    if micro:
        print("micro and scaling")
        print(micro_table(micro))
    if args.report:
        data = report_dict(
            results, micro, duration_s=args.duration, loop=args.loop, command=command, scaling=scaling
        )
        problem = write_report(data, args.report)
        if problem:
            print(f"ratedeck bench: error: {problem}", file=sys.stderr)
            return ExitCode.USAGE
        print(f"\nreport written to {args.report}")
    return ExitCode.OK


def _progress(text: str) -> None:
    print(f"ratedeck bench: {text}", file=sys.stderr, flush=True)


def run_scenarios(args: argparse.Namespace) -> list:
    """Every selected strategy against every selected scenario, each in fresh processes."""
    from .output import ScenarioResult, make_row
    from .procs import Simulator, run_child
    from .spec import RunSpec

    results = []
    for name in args.scenarios:
        if name in JOB_SCENARIOS:
            from .jobs import run_jobs

            chosen = [s for s in args.strategies if s in JOB_STRATEGIES] if args.strategies_given else []
            results.append(run_jobs(name, chosen or list(JOB_STRATEGIES), args.loop, args.seed, _progress))
            continue
        if name == "gateway":  # opt-in: the gateway's own cost beside a direct client
            from .gateway import run_gateway

            results.append(run_gateway(args.duration, _progress))
            continue
        if name in LLM_SCENARIOS:
            from .llm import run_llm

            llm = LLM_SCENARIOS[name]
            chosen = [s for s in args.strategies if s in LLM_STRATEGIES] if args.strategies_given else []
            seconds = args.duration if args.duration_given or args.quick else LLM_DURATION_S
            results.append(run_llm(name, chosen or list(llm.strategies), seconds, args.seed, _progress))
            continue
        scenario = SCENARIOS[name]
        result = ScenarioResult(name, scenario.summary, scenario.capacity_tps)
        strategies = args.strategies if args.strategies_given else scenario.strategies
        for strategy in (s for s in strategies if s in STRATEGIES):
            if strategy in NEEDS_HEALTH and not scenario.health:
                _progress(f"{name}: {strategy} skipped (this server has no /health to probe)")
                continue
            _progress(f"{name}: {strategy} for {args.duration:g} s")
            with Simulator(scenario.serve_args, seed=args.seed) as sim, _proxied(scenario, sim, args) as base:
                spec = RunSpec(
                    strategy,
                    f"{base}/api/request",
                    scenario.keys,
                    scenario.client_limit,
                    scenario.window_s,
                    scenario.nonce,
                    scenario.offered_tps,
                    args.duration,
                    in_flight=scenario.in_flight,
                    loop=args.loop,
                    seed=args.seed,
                    extra=engine_extra(scenario),
                )
                client = run_child(spec)
                server = sim.stats(arrivals=True)
            result.rows.append(
                make_row(
                    strategy,
                    client,
                    server,
                    args.duration,
                    scenario.capacity_tps,
                    policy=(scenario.limit, scenario.window_s),
                )
            )
        results.append(result)
    return results


@contextlib.contextmanager
def _proxied(scenario: Any, sim: Any, args: argparse.Namespace) -> Iterator[str]:
    """The address the client uses: the simulator's, or a jitter proxy's in front of it."""
    from .procs import JitterProxyProcess

    if scenario.jitter_ms is None:
        yield sim.base
        return
    with JitterProxyProcess(
        sim.base, scenario.jitter_ms, seed=args.seed, max_s=args.duration + 90.0
    ) as proxy:
        yield proxy.base


def run_micro(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Limiter micro (and, with `--micro full`, throughput and scaling runs)."""
    from .micro import limiter_micro

    if args.micro == "none":
        return [], []
    _progress("micro: limiter acquire cost")
    micro = limiter_micro(ops=50_000 if args.quick else 200_000, repeats=3 if args.quick else 7)
    if args.micro == "limiter":
        return micro, []
    seconds = 1.5 if args.quick else MICRO_S
    micro += throughput_runs(args, seconds)
    scaling = scaling_runs(args, seconds)
    for row in scaling:
        tag = f"scale_{row['axis']}_{row['at']}"
        micro.append(
            {"name": f"{tag}_cpu_us_per_req", "value": round(row["cpu_us_per_req"], 1), "unit": "us/req"}
        )
        micro.append({"name": f"{tag}_peak_rss_mb", "value": round(row["peak_rss_mb"], 1), "unit": "MB"})
        if row["axis"] == "queue" and row["at"] >= 100_000:  # smaller depths drown in noise
            micro.append(
                {"name": f"{tag}_bytes_per_queued", "value": round(row["bytes_per_queued"]), "unit": "B"}
            )
    return micro, scaling


def throughput_spec(
    job: str, url: str, keys: Sequence[str], seconds: float, args: argparse.Namespace, **extra: Any
) -> RunSpec:
    """One throughput micro run: a limit that never binds, MICRO_IN_FLIGHT per key."""
    from .spec import RunSpec

    # The offered rate is the config's ceiling: far above what one process sends.
    return RunSpec(
        job, url, tuple(keys), 1_000_000, 1.0, False, 1_000_000.0, seconds,
        in_flight=MICRO_IN_FLIGHT, loop=args.loop, seed=args.seed, extra=extra,
    )  # fmt: skip


def queue_spec(
    url: str, keys: Sequence[str], depth: int, seconds: float, args: argparse.Namespace
) -> RunSpec:
    """One queue-scaling run: `depth` requests queued at once (as fast as the config
    allows), drained at SCALE_QUEUE_DRAIN_TPS."""
    from .spec import RunSpec

    per_key = SCALE_QUEUE_DRAIN_TPS // len(keys)
    extra = {"depth": depth, "workload": {"total": depth, "rate": 1e6}}
    return RunSpec(
        "scale-queue", url, tuple(keys), per_key, 1.0, False, float(SCALE_QUEUE_DRAIN_TPS), seconds,
        loop=args.loop, seed=args.seed, extra=extra,
    )  # fmt: skip


def throughput_runs(args: argparse.Namespace, seconds: float) -> list[dict[str, Any]]:
    """Engine vs a bare aiohttp loop, same concurrency, alternating, best of two each."""
    from ratedeck.server.settings import generated_keys

    from .procs import Simulator, run_child

    keys = generated_keys(5)
    best: dict[str, dict[str, Any]] = {}
    with Simulator((*UNLIMITED, "--keys", str(len(keys))), seed=args.seed) as sim:

        def spec(job: str, **extra: Any) -> RunSpec:
            return throughput_spec(job, sim.url, keys, seconds, args, **extra)

        for _ in range(2):
            for job in ("bare-aiohttp", "engine-max"):
                _progress(f"micro: {job} for {seconds:g} s")
                r = run_child(spec(job))
                if job not in best or r["ok_per_s"] > best[job]["ok_per_s"]:
                    best[job] = r
        # A diagnostic: the same engine with burst pacing (no even spreading of sends).
        _progress(f"micro: engine-max (burst pacing) for {seconds:g} s")
        burst = run_child(spec("engine-max", engine={"pacing": "burst"}))
    bare, eng = best["bare-aiohttp"], best["engine-max"]
    overhead = 100.0 * (1.0 - eng["ok_per_s"] / bare["ok_per_s"]) if bare["ok_per_s"] else 0.0
    cpu_over = (
        100.0 * (eng["cpu_us_per_req"] / bare["cpu_us_per_req"] - 1.0) if bare["cpu_us_per_req"] else 0.0
    )
    c = len(keys) * MICRO_IN_FLIGHT
    return [
        {"name": f"engine_max_tps_c{c}", "value": round(eng["ok_per_s"], 1), "unit": "req/s"},
        {"name": f"bare_aiohttp_max_tps_c{c}", "value": round(bare["ok_per_s"], 1), "unit": "req/s"},
        {"name": "engine_throughput_overhead_pct", "value": round(overhead, 1), "unit": "%"},
        {"name": "engine_cpu_us_per_req", "value": round(eng["cpu_us_per_req"], 1), "unit": "us/req"},
        {"name": "bare_aiohttp_cpu_us_per_req", "value": round(bare["cpu_us_per_req"], 1), "unit": "us/req"},
        {"name": "engine_cpu_overhead_pct", "value": round(cpu_over, 1), "unit": "%"},
        {"name": f"engine_max_tps_burst_pacing_c{c}", "value": round(burst["ok_per_s"], 1), "unit": "req/s"},
    ]


def scaling_runs(args: argparse.Namespace, seconds: float) -> list[dict[str, Any]]:
    """CPU per request and memory as keys (5..500) and queue depth (10^3..10^6) grow."""
    from ratedeck.server.settings import generated_keys

    from .procs import Simulator, run_child
    from .spec import RunSpec

    rows = []
    for n in SCALE_KEYS:
        per_key = max(1, SCALE_TOTAL_TPS // n)
        keys = generated_keys(n)
        _progress(f"scaling: {n} keys x {per_key}/1s for {seconds:g} s")
        serve = (
            "--mode",
            "standard",
            "--keys",
            str(n),
            "--limit",
            f"{per_key}/1s",
            "--latency",
            "0",
            "--no-ratelimit-headers",
        )
        with Simulator(serve, seed=args.seed) as sim:
            r = run_child(
                RunSpec(
                    "scale-keys",
                    sim.url,
                    keys,
                    per_key,
                    1.0,
                    False,
                    float(per_key * n),
                    seconds,
                    loop=args.loop,
                    seed=args.seed,
                )
            )
        rows.append({"axis": "keys", "at": n, **r})
    # A slower drain (200/s) so even the smallest queue lasts the whole window.
    keys = generated_keys(5)
    per_key = SCALE_QUEUE_DRAIN_TPS // len(keys)
    for depth in SCALE_QUEUE:
        _progress(f"scaling: queue of {depth:,} for {seconds:g} s")
        serve = (
            "--mode",
            "standard",
            "--keys",
            str(len(keys)),
            "--limit",
            f"{per_key}/1s",
            "--latency",
            "0",
            "--no-ratelimit-headers",
        )
        with Simulator(serve, seed=args.seed) as sim:
            r = run_child(queue_spec(sim.url, keys, depth, seconds, args), timeout_s=seconds + 120.0)
        rows.append({"axis": "queue", "at": depth, **r})
    return rows
