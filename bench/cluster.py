"""Many processes, one set of keys: members sharing budgets through Redis, against the simulator.

    python -m ratedeck.bench.cluster [--members 3] [--duration 30] [--redis URL | --cluster]
        [--latency 5:45 --processing 20:80] [--jitter-ms 5:45] [--server-timing] [--no-same-rate]
        [--offer 1.0] [--slow-start]

Starts (each in its own process) a `redis-server` on a free loopback port
(unless `--redis` names one), the simulator (`ratedeck serve`, study mode: 5
keys x 20/s, counting every key's windows itself), fills the store's queue
with `ratedeck enqueue`, and runs `--members` copies of
`ratedeck --no-ui --store redis://...` at once, each offered its share of
the capacity (`--offer 1.5`: half as much again, as before issue 44: a member
that always has work hides the slots a member short of work leaves). Then
one `--store memory` process alone on the same keys, offered as much, for CPU.
`--latency`/`--processing` put the simulator behind that jitter each way and
that server time (the noisy server: `--latency 5:45 --processing 20:80`);
`--jitter-ms 5:45` puts instead a jitter proxy (`bench/jitter.py`, in its own
process) in front of the simulator, each chunk delayed each way, as the live
scenario rows do (`jitter_ms=`): the simulator then adds no latency of its own
(unless `--latency` says), and every member and the memory-store runs go
through the proxy (issue 44 measures the cluster this way); and
`--server-timing` has it say that time on every answer (`Server-Timing`); `--cluster`
starts a 3-master Redis Cluster instead of one server. The Redis calls are
counted on the server(s) (`INFO commandstats` before and after the members).

It prints, and writes as JSON with `--json FILE`: the simulator's audit (the
most accepted in any window, 429s), the combined sustained share of capacity
(the simulator's `share`), `sustained` (issue 44: per key W / the mean gap between
accepted arrivals i and i+20 from the simulator's accept stamps, the mean over keys,
as `bench/sustained.py` and the scenario bench compute it), and each process's CPU per request against the
memory store's: CPU from /proc between 5 s in and 1 s before the end, over
the requests that process's report counted in those seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .procs import JitterProxyProcess, Simulator

WARMUP_S = 5.0
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    """redis-server on 127.0.0.1, no persistence, a temporary directory; stopped by its PID."""

    def __init__(self, cluster: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("bench cluster: redis-server is not installed (apt-get install redis-server)")
        self.port = free_port()
        # a cluster node also listens on port + 10000 (its bus): that one must be free too
        while cluster and not (self.port + 10000 < 65536 and port_free(self.port + 10000)):
            self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="ratedeck-bench-redis-")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf"]
            args += ["--cluster-require-full-coverage", "no"]
        self.proc = subprocess.Popen([*args, "--dir", self.dir], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._ping():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise SystemExit("bench cluster: redis-server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` (a cluster node's bus port must be free too)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisClusterProcesses:
    """Three cluster-enabled masters on loopback, slots spread by `redis-cli --cluster create`."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes: list[RedisProcess] = []
        try:
            for _ in range(masters):
                self.nodes.append(RedisProcess(cluster=True))
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=30,
            )
            deadline = time.monotonic() + 20
            while not all(self._ok(n.port) for n in self.nodes):
                if time.monotonic() > deadline:
                    raise SystemExit("bench cluster: the Redis Cluster was not ok within 20 s")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    def _ok(self, port: int) -> bool:
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "cluster", "info"], capture_output=True, text=True, timeout=5
        ).stdout
        return "cluster_state:ok" in out and f"cluster_size:{len(self.nodes)}" in out

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def node_command_counts(url: str) -> list[dict[str, int]]:
    """Calls per command so far (`INFO commandstats`) of each master of a cluster (one server: one)."""
    import redis

    from ratedeck.store.redis_shared import cluster_nodes, is_cluster

    addrs = cluster_nodes(url)[0] if is_cluster(url) else [None]
    out = []
    for addr in addrs:
        client = redis.Redis(host=addr[0], port=addr[1]) if addr else redis.Redis.from_url(url)
        try:
            counts = {
                name.removeprefix("cmdstat_"): int(row["calls"])
                for name, row in client.info("commandstats").items()
            }
        finally:
            client.close()
        out.append(counts)
    return out


def scripts_by_master(before: list[dict[str, int]], after: list[dict[str, int]]) -> list[int]:
    """Script calls (grants, trims, polls: `evalsha` and `eval`) each master ran between two counts:
    how the members' budgets spread over a cluster's masters."""
    return [
        sum(a.get(c, 0) - b.get(c, 0) for c in ("evalsha", "eval"))
        for b, a in zip(before, after, strict=True)
    ]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _ratedeck(*args: str) -> list[str]:
    return [sys.executable, "-m", "ratedeck.runner.cli", *args]


#: The members' extra settings, when the run has any (`--slow-start`).
ENGINE_TOML = "engine.toml"


def member_settings(workdir: Path, *, slow_start: bool) -> None:
    """Write the members' extra settings to `workdir` (`ENGINE_TOML`), if there are any."""
    if slow_start:
        (workdir / ENGINE_TOML).write_text("[engine]\nslow_start = true\n")


def member_args(
    target: str, store: str, duration_s: float, rate: float, report: Path, workdir: Path
) -> list[str]:
    """One member's command line: the study preset against `target` through `store`; a config
    file `ENGINE_TOML` in `workdir` (`--slow-start`) is added when there is one."""
    config = workdir / ENGINE_TOML
    return _ratedeck(
        "--no-ui",
        "--preset",
        "study",
        "--target",
        target,
        "--store",
        store,
        "--duration",
        f"{duration_s:g}",
        "--rate",
        f"{rate:g}",
        "--interval",
        "3600",
        "--report",
        str(report),
        *(("--config", str(config)) if config.exists() else ()),
    )


def run_members(
    target: str, store: str, count: int, duration_s: float, rate: float, workdir: Path
) -> list[dict[str, Any]]:
    """`count` members at once (`member_args`); each one's report, CPU samples and exit status."""
    procs = []
    for i in range(count):
        report = workdir / f"member{i}-{store.split(':')[0]}.json"
        args = member_args(target, store, duration_s, rate, report, workdir)
        log = open(workdir / f"member{i}.log", "w")
        procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), report, log))
    started = time.monotonic()
    samples: list[list[tuple[float, float | None]]] = [[] for _ in procs]
    hung: set[int] = set()
    try:
        for at in (WARMUP_S, duration_s - 1.0):
            time.sleep(max(0.0, started + at - time.monotonic()))
            for i, (proc, _r, _l) in enumerate(procs):
                samples[i].append((time.monotonic() - started, process_cpu_s(proc.pid)))
        for proc, _r, _l in procs:
            try:
                proc.wait(timeout=max(5.0, started + duration_s + 60 - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # killed below, reported with no exit status
    finally:
        for i, (proc, _r, log) in enumerate(procs):
            if proc.poll() is None:
                hung.add(i)
                proc.kill()
                proc.wait()
            log.close()
    results = []
    for i, (proc, report, _l) in enumerate(procs):
        data = json.loads(report.read_text()) if report.exists() else {}
        (t_a, cpu_a), (t_b, cpu_b) = samples[i]
        tps = data.get("series", {}).get("tps", [])
        done = sum(tps[round(t_a) : round(t_b)])
        cpu = (cpu_b - cpu_a) if cpu_a is not None and cpu_b is not None else None
        results.append(
            {
                "exit": "hung: killed" if i in hung else proc.returncode,
                "succeeded": data.get("requests", {}).get("succeeded"),
                "rejected_429": data.get("requests", {}).get("rejected_429"),
                "throughput_tps": data.get("throughput_tps"),
                "cpu_s": round(cpu, 2) if cpu is not None else None,
                "requests_measured": done,
                "cpu_us_per_request": round(cpu * 1e6 / done, 1) if cpu is not None and done else None,
            }
        )
    return results


def member_summaries(url: str) -> list[dict[str, Any]]:
    """What the members last published (`ratedeck.store.redis_shared.read_cluster`)."""
    import asyncio

    from ratedeck.store.redis_shared import connect, read_cluster

    async def read() -> list[dict[str, Any]]:
        client = connect(url)
        try:
            return (await read_cluster(client))["members"]
        finally:
            await client.aclose()

    return asyncio.run(read())


def _serve_args(latency: str | None, processing: str | None, server_timing: bool) -> list[str]:
    """The simulator's options: the study's server, behind `latency` and `processing` if given."""
    serve = ["--mode", "study"]
    if latency:
        serve += ["--latency", latency]
    if processing:
        serve += ["--processing", processing]
    if server_timing:
        serve += ["--server-timing"]
    return serve


def _enqueue_jobs(url: str, workdir: Path, total: int) -> None:
    """Fill the store's queue with `total` jobs (`ratedeck enqueue`)."""
    jobs = workdir / "jobs.jsonl"
    with jobs.open("w") as fh:
        for i in range(total):
            fh.write(json.dumps({"job": i}) + "\n")
    subprocess.run(_ratedeck("enqueue", "--store", url, str(jobs)), check=True, capture_output=True)


@contextlib.contextmanager
def _target(sim: Simulator, jitter_ms: str | None, duration_s: float) -> Iterator[str]:
    """The `/api/request` address the members use: the simulator's, or a jitter proxy's in front of it."""
    if jitter_ms is None:
        yield sim.url
        return
    with JitterProxyProcess(sim.base, jitter_ms, seed=1, max_s=duration_s + 90.0) as proxy:
        yield f"{proxy.base}/api/request"


def _phases(
    serve: list[str],
    url: str,
    members: int,
    duration_s: float,
    capacity: float,
    workdir: Path,
    same_rate: bool,
    jitter_ms: str | None = None,
    offer: float = 1.0,
) -> dict[str, Any]:
    """The members through the store, each offered `offer` times its share of the capacity,
    then one memory-store process alone offered `offer` times the capacity (and, with
    `same_rate`, one at a member's share of the rate), each against a fresh simulator
    (behind a fresh jitter proxy with `jitter_ms`)."""
    out: dict[str, Any] = {"at_share": {}}
    with Simulator(serve) as sim, _target(sim, jitter_ms, duration_s) as target:
        out["before"] = node_command_counts(url)
        t0 = time.monotonic()
        out["shared"] = run_members(target, url, members, duration_s, capacity / members * offer, workdir)
        out["calls_s"] = time.monotonic() - t0
        out["after"] = node_command_counts(url)
        out["stats"] = sim.stats(arrivals=True)
    out["published"] = member_summaries(url)
    with Simulator(serve) as sim, _target(sim, jitter_ms, duration_s) as target:
        out["alone"] = run_members(target, "memory", 1, duration_s, capacity * offer, workdir)[0]
        out["alone_stats"] = sim.stats(arrivals=True)
    # CPU per request falls with the rate (a process's fixed costs spread over more
    # requests): the fair baseline also runs at one member's share of the keys.
    if same_rate:
        with Simulator(serve) as sim, _target(sim, jitter_ms, duration_s) as target:
            share_rate = (out["stats"]["totals"]["accepted"] / duration_s) / members
            out["at_share"] = run_members(target, "memory", 1, duration_s, share_rate, workdir)[0]
    return out


def _compare_cpu(shared: list[dict[str, Any]], alone: dict[str, Any], at_share: dict[str, Any]) -> None:
    """Each member's CPU per request over the memory store's, alone and at a member's rate."""
    for m in shared:
        per = m["cpu_us_per_request"]
        for name, base in (
            ("cpu_vs_memory", alone["cpu_us_per_request"]),
            ("cpu_vs_memory_same_rate", at_share.get("cpu_us_per_request")),
        ):
            m[name] = round(per / base, 2) if per and base else None


def _redis_calls(before: list[dict[str, int]], after: list[dict[str, int]]) -> dict[str, int]:
    """The commands Redis (every master) ran between two counts, most first."""
    delta: dict[str, int] = {}
    for b, a in zip(before, after, strict=True):
        for k in a:
            delta[k] = delta.get(k, 0) + a.get(k, 0) - b.get(k, 0)
    delta = {k: v for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0}
    # the counting's own INFO calls are not the members'
    delta.pop("info", None)
    return delta


def sustained(stats: dict[str, Any], limit: int = 20, window_s: float = 1.0) -> dict[str, Any]:
    """The run's sustained efficiency from the simulator's accept stamps (`bench/sustained.py`:
    per key W / the mean gap between accepted arrivals i and i+N, the mean over keys), as the
    scenario bench reports it; every member's arrivals on a key count together."""
    from .sustained import run_sustained

    arrivals = stats.get("arrivals_ms")
    if arrivals is None:
        return {"sustained": None, "sustained_by_key": []}
    run = run_sustained(([t / 1000.0 for t in stamps] for stamps in arrivals), limit, window_s)
    out: dict[str, Any] = {
        "sustained": None if run.mean is None else round(run.mean, 4),
        "sustained_by_key": [None if v is None else round(v, 4) for v in run.by_key],
    }
    if stats.get("arrivals_dropped"):
        out["sustained_stamps_dropped"] = int(stats["arrivals_dropped"])
    return out


def _published_rows(published: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: m.get(k) for k in ("member", "sent", "succeeded", "store_calls", "leases", "elapsed_s")}
        for m in published
    ]


def run(
    members: int,
    duration_s: float,
    redis_url: str | None,
    *,
    latency: str | None = None,
    processing: str | None = None,
    cluster: bool = False,
    same_rate: bool = True,
    server_timing: bool = False,
    jitter_ms: str | None = None,
    offer: float = 1.0,
    slow_start: bool = False,
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="ratedeck-bench-cluster-"))
    member_settings(workdir, slow_start=slow_start)
    redis: RedisProcess | RedisClusterProcesses | None = None
    if not redis_url:
        redis = RedisClusterProcesses() if cluster else RedisProcess()
    url = redis_url or (redis.url if redis else "")
    capacity = 100.0  # the study's server: 5 keys x 20/s
    # behind a jitter proxy the simulator adds no latency of its own unless told (the live rows')
    serve = _serve_args(latency or ("0" if jitter_ms else None), processing, server_timing)
    try:
        _enqueue_jobs(url, workdir, int(capacity * duration_s * 1.5))
        got = _phases(serve, url, members, duration_s, capacity, workdir, same_rate, jitter_ms, offer)
    finally:
        if redis is not None:
            redis.close()
    stats, alone, alone_stats, shared = got["stats"], got["alone"], got["alone_stats"], got["shared"]
    _compare_cpu(shared, alone, got["at_share"])
    delta = _redis_calls(got["before"], got["after"])
    published_rows = _published_rows(got["published"])
    budget_calls = [
        round(float(m["store_calls"] or 0) / float(m["elapsed_s"]), 1)
        for m in published_rows
        if m.get("elapsed_s")
    ]
    return {
        "members": members,
        "duration_s": duration_s,
        "store": "cluster" if cluster else "redis",
        "server": " ".join(serve)
        + (f" behind a jitter proxy ({jitter_ms} ms each way)" if jitter_ms else ""),
        "capacity_tps": capacity,
        "audit_max_in_window": max(p["max_in_window"] for k in stats["keys"] for p in k["max_in_window"]),
        "audit_ok": stats.get("audit_ok"),
        "rejected_429": stats["totals"]["rejected_429"],
        "accepted": stats["totals"]["accepted"],
        "sustained_share": stats["share"]["sustained"],
        "share_all": stats["share"]["all"],
        # issue 44's measure, from the accept stamps of every member together
        **sustained(stats),
        "per_member": shared,
        "redis_calls": delta,
        # how the scripts spread over a cluster's masters (one server: one)
        "scripts_by_master": scripts_by_master(got["before"], got["after"]),
        # every command Redis ran (those inside the grant scripts included), per member per second
        "redis_commands_per_member_s": round(sum(delta.values()) / members / got["calls_s"], 1),
        # the budgets' and gates' round trips (grants, polls, summaries, clock samples): the
        # member's own count (`RedisShared.calls`), per second of its run
        "budget_calls_per_member_s": budget_calls,
        "memory_alone": {
            **alone,
            "sustained_share": alone_stats["share"]["sustained"],
            "sustained": sustained(alone_stats)["sustained"],
            "rejected_429_server": alone_stats["totals"]["rejected_429"],
        },
        "memory_at_member_rate": got["at_share"],
        "published": published_rows,
        "logs": str(workdir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ratedeck.bench.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--members", type=int, default=3, help="processes sharing the keys (default 3)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument("--redis", help="a running Redis to use (default: start one on a free port)")
    parser.add_argument("--cluster", action="store_true", help="start a 3-master Redis Cluster instead")
    parser.add_argument("--latency", help="the simulator's ms each way, LOW:HIGH (default: the study's own)")
    parser.add_argument("--processing", help="the simulator's server time in ms, LOW:HIGH (default none)")
    parser.add_argument(
        "--jitter-ms",
        help="a jitter proxy in front of the simulator, LOW:HIGH ms each way (bench/jitter.py; the live rows')",
    )
    parser.add_argument(
        "--server-timing", action="store_true", help="the simulator says its server time (Server-Timing)"
    )
    parser.add_argument(
        "--no-same-rate", action="store_true", help="skip the memory store at one member's rate (CPU only)"
    )
    parser.add_argument(
        "--offer",
        type=float,
        default=1.0,
        help="each member is offered this many times its share of the capacity (default 1.0: the "
        "capacity, split, as the scenario bench offers every client its scenario's capacity)",
    )
    parser.add_argument(
        "--slow-start",
        action="store_true",
        help="members (and the process alone) run with the engine's default slow start, as a run "
        "on a named target does (the study preset turns it off)",
    )
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.members < 1 or not 10 <= args.duration <= 600:
        parser.error("--members must be at least 1 and --duration 10 to 600 s")
    if not 0.1 <= args.offer <= 1.5:
        parser.error(f"--offer must be 0.1 to 1.5 (the store's queue holds 1.5x), got {args.offer:g}")
    if args.cluster and args.redis:
        parser.error("--cluster starts its own cluster: not with --redis")
    result = run(
        args.members,
        args.duration,
        args.redis,
        latency=args.latency,
        processing=args.processing,
        cluster=args.cluster,
        same_rate=not args.no_same_rate,
        server_timing=args.server_timing,
        jitter_ms=args.jitter_ms,
        offer=args.offer,
        slow_start=args.slow_start,
    )
    print(
        f"{args.members} members x {args.duration:g} s on 5 keys x 20/s through {result['store']} "
        f"({result['server']}): max in any window {result['audit_max_in_window']}/20, "
        f"429s {result['rejected_429']}, share {result['sustained_share']} of capacity, "
        f"sustained {result['sustained']} (by key {result['sustained_by_key']})"
    )
    calls = ", ".join(f"{k} {v}" for k, v in list(result["redis_calls"].items())[:12])
    print(
        f"  Redis round trips per member per second for budgets and gates: "
        f"{result['budget_calls_per_member_s']}; commands Redis ran per member per second "
        f"(scripts' own included, work queue too): {result['redis_commands_per_member_s']} ({calls}, ...); "
        f"script calls by master: {result['scripts_by_master']}"
    )
    for i, m in enumerate(result["per_member"]):
        print(
            f"  member {i}: {m['succeeded']} ok, {m['throughput_tps']}/s, "
            f"{m['cpu_us_per_request']} us CPU/request ({m['cpu_vs_memory']}x memory alone at full rate, "
            f"{m['cpu_vs_memory_same_rate']}x memory at the member's rate)"
        )
    for m in result["published"]:
        print(
            f"  published {m['member']}: sent {m['sent']}, store calls {m['store_calls']}, leases {m['leases']}"
        )
    alone = result["memory_alone"]
    print(
        f"  memory store alone: {alone['succeeded']} ok, {alone['cpu_us_per_request']} us CPU/request, "
        f"share {alone['sustained_share']}, sustained {alone['sustained']}, 429s {alone['rejected_429_server']}"
    )
    same = result["memory_at_member_rate"]
    if same:
        print(
            f"  memory store at one member's rate: {same['succeeded']} ok, {same['throughput_tps']}/s, "
            f"{same['cpu_us_per_request']} us CPU/request"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
