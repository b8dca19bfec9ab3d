"""The client's own cost in words: the headless `client` line, and one more line when the
client, not the server, is the limit (the verdict: engine/observe/loop_watch.py)."""

from __future__ import annotations

from ratedeck.core.vocab import Phase
from ratedeck.engine.snapshot import Snapshot

#: How the verdict's line begins (grep for it).
CLIENT_IS_THE_LIMIT = "the client, not the server, is the limit"


def lag_ms(ms: float) -> str:
    """A lateness: one decimal below 10 ms ("0.4"), whole milliseconds above ("25")."""
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def what_to_try(snap: Snapshot) -> str:
    """What may lift the client's limit: more engine processes for a run, and uvloop where it
    is not in use. A gateway (its snapshot carries its clients' view) runs one engine and
    takes no --procs: none is named to it. "" when there is nothing to name."""
    tries = []
    if snap.clients is None:
        tries.append(
            "--procs auto (an engine process per core)"
            if snap.procs <= 1
            else "more --procs if cores are idle"
        )
    if snap.loop == "asyncio":
        tries.append("uvloop (a quarter less CPU per request)")
    return f"try {', or '.join(tries)}" if tries else ""


def verdict_line(snap: Snapshot) -> str:
    """ "the client, not the server, is the limit: loop late p99 25 ms, 97% of a core busy; try
    --procs auto (...)", or "" when it is not (the whole run's verdict once the run stopped)."""
    why = snap.lag.shown(snap.phase == Phase.STOPPED)[2]
    if not why:
        return ""
    tried = what_to_try(snap)
    return f"{CLIENT_IS_THE_LIMIT}: {why}; {tried}" if tried else f"{CLIENT_IS_THE_LIMIT}: {why}"


def client_lines(snap: Snapshot) -> list[str]:
    """ "client  cpu 41 µs per answered request (0.4 s in 1 process on uvloop, 4% of a core)  loop
    late p50 0.2 ms p99 3.1 ms, up to 12 ms", and the verdict's line when it says so; none before
    any answer. A stopped run's figures are the whole run's, a running one's the last minute's."""
    cpu = snap.cpu_us_per_request
    if cpu is None:
        return []
    where = f"{snap.procs} processes" if snap.procs > 1 else "1 process"
    if snap.loop:
        where += f" on {snap.loop}"
    if (cores := snap.cpu_cores) is not None:
        where += f", {cores * 100:.0f}% of a core"
    if snap.cpu_with:  # the figures are the process's: say what else they count
        where += f"; {snap.cpu_with} included"
    final = snap.phase == Phase.STOPPED
    p50, p99, _ = snap.lag.shown(final)
    worst = snap.lag.run.max if final else snap.loop_lag_ms
    lines = [
        f"client       cpu {cpu:.0f} µs per answered request ({snap.cpu_s:.1f} s in {where})"
        f"  loop late p50 {lag_ms(p50)} ms p99 {lag_ms(p99)} ms, up to {lag_ms(worst)} ms"
    ]
    if verdict := verdict_line(snap):
        lines.append(f"             {verdict}")
    return lines
