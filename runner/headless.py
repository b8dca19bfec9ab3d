"""`ratedeck --no-ui`: periodic metrics on stdout, a final summary, report and plots."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TextIO

from ratedeck.engine.config import ConfigError, RunConfig
from ratedeck.engine.snapshot import Snapshot
from ratedeck.host.session import Session
from ratedeck.runner.report import write_report


def metrics_block(snap: Snapshot) -> list[str]:
    """The periodic block: throughput, requests, queues, latency, headroom."""
    lat = snap.latency
    mode = "adaptive" if snap.headroom_adaptive else "fixed"
    return [
        f"--- ratedeck metrics at {snap.elapsed_s:7.1f} s ---",
        f"throughput   {snap.throughput_tps:8.2f} req/s average, {snap.current_tps:.0f} in the last second"
        f"  ({snap.pct_capacity:.1f}% of {snap.capacity_tps:g}/s capacity)",
        f"requests     generated {snap.generated}  succeeded {snap.succeeded}  expired {snap.expired}"
        f"  graveyard {snap.graveyard}  shed {snap.shed}",
        f"attempts     sent {snap.sent}  rejected 429 {snap.rejected_429}  rejected other {snap.rejected_other}"
        f"  failed {snap.failed}  retried {snap.retried}",
        f"queues       main {snap.main_depth} (avg {snap.main_avg:.1f}, max {snap.main_peak})"
        f"  dlq {snap.dlq_depth} (avg {snap.dlq_avg:.1f}, max {snap.dlq_peak})  in flight {snap.in_flight}",
        f"latency ms   mean {lat.mean:.1f}  p50 {lat.p50:.1f}  p90 {lat.p90:.1f}  p99 {lat.p99:.1f}  max {lat.max:.1f}",
        f"headroom     {snap.headroom_ms:.1f} ms {mode}  backpressure {'on' if snap.backpressure else 'off'}"
        f"  arrival {snap.arrival_rate:g}/s",
    ]


def summary_lines(snap: Snapshot) -> list[str]:
    """The final summary, including where every request ended."""
    queued = snap.main_depth + snap.dlq_depth
    lines = ["", "=== ratedeck final summary ==="] + metrics_block(snap)[1:]
    lines.append(
        f"accounting   {snap.generated} generated = {snap.succeeded} succeeded + {snap.expired} expired"
        f" + {snap.graveyard} graveyard + {snap.shed} shed + {queued} queued + {snap.in_flight} in flight"
        + ("" if snap.balance() == 0 else f"  (MISMATCH {snap.balance()})")
    )
    for k in snap.keys:
        lines.append(
            f"  {k.label:>4} {k.masked}  {k.state:<8} sent {k.sent:>7}  ok {k.succeeded:>7}  429 {k.rejected_429}"
        )
    return lines


async def run_headless(cfg: RunConfig, interval_s: float = 5.0, out: TextIO | None = None) -> int:
    """Run until the duration passes, the workload ends, or Ctrl-C / SIGTERM; 0 on a clean stop."""
    out = out or sys.stdout
    session = Session(cfg)
    try:
        engine = await session.start()
    except ConfigError as exc:
        print(f"ratedeck: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ratedeck: cannot start: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    target = session.target_url.split("?")[0] if session.target_url else "?"
    where = "embedded simulator" if session.server else "target"
    print(
        f"ratedeck: {len(cfg.keys)} keys, capacity {cfg.capacity_tps:g} req/s, {where} {target}"
        + (f", {cfg.duration_s:g} s" if cfg.duration_s else ", Ctrl-C to stop"),
        file=out,
        flush=True,
    )
    deadline = loop.time() + cfg.duration_s if cfg.duration_s else None
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(engine.finished.wait())]
    try:
        while not stop.is_set() and not engine.finished.is_set():
            now = loop.time()
            wait = interval_s if deadline is None else min(interval_s, deadline - now)
            if wait <= 0:
                break
            await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if deadline is not None and loop.time() >= deadline:
                break
            if not stop.is_set():
                print("\n".join(metrics_block(engine.snapshot())), file=out, flush=True)
        if stop.is_set():
            print("ratedeck: stopping: no new requests, letting in-flight ones finish…", file=out, flush=True)
    finally:
        for w in waiters:
            w.cancel()
        snap = await session.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
    print("\n".join(summary_lines(snap)), file=out, flush=True)
    code = 0
    if session.server_stats:
        t = session.server_stats["totals"]
        print(
            f"simulator    accepted {t['accepted']}  429 {t['rejected_429']}  nonce rejected {t['rejected_nonce']}"
            f"  during cooldown {t['requests_during_cooldown']}  escalations {t['escalations']}"
            f"  audit {'ok' if session.server_stats['audit_ok'] else 'EXCEEDED'}",
            file=out,
        )
    if cfg.engine.graveyard_path and snap.graveyard:
        print(f"graveyard: {snap.graveyard} requests in {cfg.engine.graveyard_path}", file=out)
    for problem in engine.problems:
        print(f"ratedeck: {problem}", file=sys.stderr)
    if cfg.report:
        problem = write_report(snap, cfg.report, session.server_stats)
        if problem:
            print(f"ratedeck: {problem}", file=sys.stderr)
            code = 2
        else:
            print(f"report written to {cfg.report}", file=out)
    if cfg.plot:
        from .plots import run_charts

        print(run_charts(snap, color=out.isatty()), file=out)
    return code
