"""plotext charts of a run, as text to print."""

from __future__ import annotations

import shutil

import plotext as plt

from ratedeck.engine.snapshot import Snapshot


def run_charts(snap: Snapshot, width: int | None = None, color: bool = False) -> str:
    """TPS and latency (p50, p99) per second over the run, one chart each.

    Without `color` the ANSI codes are stripped, for logs and CI output.
    """
    width = width or min(120, shutil.get_terminal_size((100, 30)).columns)
    out = []
    xs = list(range(1, len(snap.tps_series) + 1))
    if not xs:
        return "(no full second of data to plot)"
    plt.clear_figure()
    plt.plotsize(width, 15)
    plt.theme("clear")
    plt.plot(xs, list(snap.tps_series), label="successful req/s")
    if snap.capacity_tps:
        plt.hline(snap.capacity_tps)
    plt.title(f"Throughput per second (capacity {snap.capacity_tps:g}/s)")
    plt.xlabel("second")
    out.append(plt.build())
    plt.clear_figure()
    plt.plotsize(width, 15)
    plt.theme("clear")
    plt.plot(xs, list(snap.p50_series), label="p50 ms")
    plt.plot(xs, list(snap.p99_series), label="p99 ms")
    plt.title("Latency per second (ms)")
    plt.xlabel("second")
    out.append(plt.build())
    text = "\n".join(out)
    return text if color else plt.uncolorize(text)
