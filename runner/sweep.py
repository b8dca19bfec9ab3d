"""`ratedeck sweep`: goodput against arrival rate, with the entry throttle off and on.

For each arrival rate the engine runs messages of `--calls` calls against the
simulator twice, once with no entry throttle and once with the auto throttle
(live capacity / calls), and the sweep prints a table, a plotext chart and,
with `--report`, a JSON document with stable names.

By default each point runs on a virtual clock against the simulator's own
rules (no sockets), so a sweep of many points takes seconds; `--live` runs
against the embedded HTTP simulator in real time instead.

The baseline ("off") lets every message in, as a service whose queue and
workers scale without limit would: the engine's call queue has no
backpressure, so calls wait and expire at their TTL. (With backpressure on, a
full call queue refuses a parallel message's calls all together, which is
itself an entry throttle; `--backpressure` shows that.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass

from ratedeck.config import ConfigError, load_config
from ratedeck.core.exits import ExitCode
from ratedeck.core.files import private_write_text
from ratedeck.core.numbers import parse_duration
from ratedeck.core.policy import PolicyError, format_policy, parse_policy
from ratedeck.engine.engine import Engine
from ratedeck.engine.snapshot import Snapshot

# A quick API: small network jitter, so the learned headroom (and the capacity
# it costs) stays small and the curves show the workflow, not the network.
SIM_LATENCY_MS = (0, 10)
SIM_HEADROOM_INITIAL_MS = 20.0


class SweepArgumentError(Exception):
    """Bad command-line input; the text is the whole message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise SweepArgumentError(message)


@dataclass(frozen=True)
class Point:
    """One run: an arrival rate (messages/s) with the throttle off or auto."""

    arrival_rate: float
    throttle: str
    goodput: float
    messages_failed: int
    calls_wasted: int
    messages_completed: int
    balance_ok: bool

    def as_json(self) -> dict:
        return {
            "arrival_rate": self.arrival_rate,
            "throttle": self.throttle,
            "goodput": round(self.goodput, 3),
            "messages_failed": self.messages_failed,
            "calls_wasted": self.calls_wasted,
        }


def _duration(flag: str):
    """An argparse type: seconds from "10", "30s", "500ms", "2m" (core/numbers)."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise SweepArgumentError(f"{flag}: {exc}") from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ratedeck sweep",
        description="Goodput (messages completed per second) against arrival rate, "
        "with the entry throttle off and auto, against the simulator.",
    )
    p.add_argument("--calls", type=int, default=3, metavar="N", help="calls each message needs (default 3)")
    p.add_argument(
        "--pattern",
        choices=("parallel", "sequential"),
        default="parallel",
        help="calls at once, or each after the previous succeeded (default parallel)",
    )
    p.add_argument(
        "--rates",
        default="10:150:10",
        metavar="A:B:STEP",
        help="arrival rates in messages/s, from A to B inclusive (default 10:150:10)",
    )
    p.add_argument(
        "--duration",
        type=_duration("--duration"),
        default=10.0,
        metavar="S",
        help="per point: 10, 30s, 2m (default 10 s)",
    )
    p.add_argument("--keys", type=int, default=5, metavar="N", help="API keys of the simulator (default 5)")
    p.add_argument("--limit", default="20/1s", metavar="N/W", help="per-key limit (default 20/1s)")
    p.add_argument(
        "--excess",
        choices=("queue", "shed", "sample"),
        default="queue",
        help="what the throttle does with excess messages (default queue)",
    )
    p.add_argument(
        "--sample-fraction",
        type=float,
        default=1.0,
        metavar="F",
        help="with --excess sample: fraction of messages processed (default 1)",
    )
    p.add_argument(
        "--backpressure",
        action="store_true",
        help="keep the engine's call-queue backpressure on in the baseline",
    )
    p.add_argument(
        "--ttl",
        type=_duration("--ttl"),
        default=1.0,
        metavar="S",
        help="call time-to-live: 1, 500ms (default 1 s)",
    )
    p.add_argument("--report", metavar="FILE", help="write the points as JSON here")
    p.add_argument("--live", action="store_true", help="run against the embedded HTTP simulator in real time")
    p.add_argument("--seed", type=int, default=1, metavar="N", help="random seed (default 1)")
    return p


def parse_rates(text: str) -> list[float]:
    """ "A:B:STEP" -> [A, A+STEP, ..., B]; raises SweepArgumentError naming the value."""
    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        a, b, step = (float(x) for x in parts)
    except ValueError:
        raise SweepArgumentError(f"--rates: expected A:B:STEP like 10:150:10, got {text!r}") from None
    if not (a > 0 and step > 0 and b >= a) or any(x != x or x == float("inf") for x in (a, b, step)):
        raise SweepArgumentError(f"--rates: need 0 < A <= B and STEP > 0, got {text!r}")
    count = int((b - a) / step + 1e-9) + 1
    if count > 200:
        raise SweepArgumentError(f"--rates: {count} rates is too many (at most 200), got {text!r}")
    return [round(a + i * step, 6) for i in range(count)]


def check_args(args: argparse.Namespace) -> list[float]:
    if args.calls < 1:
        raise SweepArgumentError(f"--calls: must be at least 1, got {args.calls}")
    if not args.duration > 0:
        raise SweepArgumentError(f"--duration: must be above 0 seconds, got {args.duration}")
    if args.keys < 1:
        raise SweepArgumentError(f"--keys: must be at least 1, got {args.keys}")
    if not 0 < args.sample_fraction <= 1:
        raise SweepArgumentError(
            f"--sample-fraction: must be above 0 and at most 1, got {args.sample_fraction}"
        )
    if not args.ttl > 0:
        raise SweepArgumentError(f"--ttl: must be above 0 seconds, got {args.ttl}")
    try:
        parse_policy(args.limit)
    except PolicyError as exc:
        raise SweepArgumentError(f"--limit: {exc}") from None
    return parse_rates(args.rates)


# ---------------------------------------------------------------- running


def server_settings(args: argparse.Namespace):
    from ratedeck.server.settings import ServerSettings, generated_keys

    return ServerSettings(
        mode="standard",
        keys=generated_keys(args.keys),
        policies=(parse_policy(args.limit),),
        latency_in_ms=SIM_LATENCY_MS,
        latency_out_ms=SIM_LATENCY_MS,
        seed=args.seed,
    )


def point_config(args: argparse.Namespace, rate: float, throttle: str, settings):
    overrides = {
        "keys": {"secrets": list(settings.keys), "limits": [args.limit]},
        "target": {"nonce_param": ""},
        "engine": {
            "graveyard_path": "",
            "ttl_s": args.ttl,
            "headroom_initial_ms": SIM_HEADROOM_INITIAL_MS,
            "backpressure": bool(args.backpressure),
        },
        "workload": {"rate": rate, "arrival": "poisson"},
        "messages": {
            "calls": args.calls,
            "pattern": args.pattern,
            "throttle": throttle,
            "excess": args.excess,
            "sample_fraction": args.sample_fraction,
            "shed_path": "",
        },
        "server": settings.to_dict(),
        "run": {"seed": args.seed},
    }
    return load_config(preset=None, overrides=overrides)


def steady_goodput(snap: Snapshot) -> float:
    """Messages completed per second, leaving out the first second (the ramp)."""
    assert snap.messages is not None
    series = snap.messages.goodput_series[1:]
    return sum(series) / len(series) if series else snap.messages.goodput_tps


def run_point(args: argparse.Namespace, rate: float, throttle: str) -> Point:
    settings = server_settings(args)
    cfg = point_config(args, rate, throttle, settings)
    if args.live:
        snap = asyncio.run(_run_live(cfg, args.duration))
    else:
        from ratedeck.server.simulated import SimulatedTransport, run_virtual

        engine = Engine(cfg.engine_settings, SimulatedTransport(settings, seed=args.seed))
        snap = run_virtual(engine.run(args.duration))
    assert snap.messages is not None
    return Point(
        rate,
        throttle,
        steady_goodput(snap),
        snap.messages.failed,
        snap.messages.calls_wasted,
        snap.messages.completed,
        snap.balance() == 0,
    )


async def _run_live(cfg, duration: float) -> Snapshot:
    from ratedeck.host.session import Session

    session = Session(cfg)
    await session.start()
    try:
        await asyncio.sleep(duration)
    finally:
        snap = await session.stop()
    return snap


def seed_model(rate: float, capacity: float, calls: int) -> float:
    """The seed's prediction for parallel calls: rate x (capacity / (rate x n))^n past the peak."""
    if rate * calls <= capacity:
        return rate
    return rate * (capacity / (rate * calls)) ** calls


# ---------------------------------------------------------------- output


def table(points: list[Point], capacity: float, args: argparse.Namespace) -> list[str]:
    by = {(p.arrival_rate, p.throttle): p for p in points}
    rates = sorted({p.arrival_rate for p in points})
    model = args.pattern == "parallel"
    head = (
        f"{'arrival/s':>9}  {'goodput off':>11} {'failed':>7} {'wasted':>7}"
        f"  {'goodput auto':>12} {'failed':>7} {'wasted':>7}" + (f"  {'seed model':>10}" if model else "")
    )
    lines = [head, "-" * len(head)]
    for r in rates:
        off, auto = by[(r, "off")], by[(r, "auto")]
        line = (
            f"{r:>9g}  {off.goodput:>11.1f} {off.messages_failed:>7} {off.calls_wasted:>7}"
            f"  {auto.goodput:>12.1f} {auto.messages_failed:>7} {auto.calls_wasted:>7}"
        )
        if model:
            line += f"  {seed_model(r, capacity, args.calls):>10.1f}"
        lines.append(line)
    return lines


def chart(points: list[Point], capacity: float, args: argparse.Namespace, color: bool) -> str:
    import plotext as plt

    rates = sorted({p.arrival_rate for p in points})
    by = {(p.arrival_rate, p.throttle): p for p in points}
    plt.clear_figure()
    plt.plotsize(min(100, 20 + 4 * len(rates)) if len(rates) > 1 else 60, 20)
    plt.theme("clear")
    plt.plot(rates, [by[(r, "off")].goodput for r in rates], label="throttle off", marker="dot")
    plt.plot(rates, [by[(r, "auto")].goodput for r in rates], label="throttle auto", marker="dot")
    if args.pattern == "parallel":
        plt.plot(rates, [seed_model(r, capacity, args.calls) for r in rates], label="seed model")
    plt.hline(capacity / args.calls)
    plt.title(
        f"Goodput vs arrival rate: {args.calls} {args.pattern} call(s) per message, "
        f"capacity {capacity:g}/s (line at capacity/n = {capacity / args.calls:.1f})"
    )
    plt.xlabel("arrival rate (messages/s)")
    plt.ylabel("messages/s")
    text = plt.build()
    return text if color else plt.uncolorize(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        rates = check_args(args)
    except SweepArgumentError as exc:
        print(f"ratedeck sweep: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        settings = server_settings(args)
        capacity = point_config(args, rates[0], "off", settings).engine_settings.capacity_tps
    except (ConfigError, ValueError) as exc:
        print(f"ratedeck sweep: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    where = "embedded HTTP simulator, real time" if args.live else "simulator rules on a virtual clock"
    print(
        f"sweep: {len(rates)} rates x 2 throttles x {args.duration:g} s, {args.calls} {args.pattern} call(s)"
        f" per message, {args.keys} keys x {format_policy(parse_policy(args.limit))}"
        f" = {capacity:g} calls/s ({where})",
        flush=True,
    )
    points: list[Point] = []
    try:
        for rate in rates:
            for throttle in ("off", "auto"):
                points.append(run_point(args, rate, throttle))
    except KeyboardInterrupt:
        print("ratedeck sweep: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError as exc:
        print(f"ratedeck sweep: cannot run: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    for line in table(points, capacity, args):
        print(line)
    if not all(p.balance_ok for p in points):
        print("warning: request accounting did not balance in some runs", file=sys.stderr)
    print(chart(points, capacity, args, color=sys.stdout.isatty()))
    if args.report:
        report = {
            "capacity_tps": capacity,
            "calls_per_message": args.calls,
            "pattern": args.pattern,
            "duration_s": args.duration,
            "excess": args.excess,
            "live": args.live,
            "points": [p.as_json() for p in points],
        }
        try:
            private_write_text(args.report, json.dumps(report, indent=2) + "\n")
        except (OSError, ValueError) as exc:
            print(
                f"ratedeck sweep: cannot write report {args.report}: {getattr(exc, 'strerror', None) or exc}",
                file=sys.stderr,
            )
            return ExitCode.FAILED
        print(f"report written to {args.report}")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
