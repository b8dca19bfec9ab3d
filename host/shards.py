"""`--procs N`: the keys shared out among N engine processes, seen as one engine.

One asyncio loop runs on one core. When ratedeck itself is the bottleneck
(many keys, fast limits), `ShardedHost` runs N `ProcessHost`s, each a whole
engine over its share of the keys on its own loop, and merges their
snapshots (`engine/observe/merge.py`) for the console and the report. It has the
face of every host: `snapshot()`, `send()`, `stop()`, `abort()`.

How the run is split (`shard_configs`, pure):
- keys go round-robin (key i to process i mod N); N is at most the number
  of keys;
- the arrival rate (or, with none given, each process's own keys'
  capacity) is shared in proportion to each process's capacity, and
  `workload.total` likewise, in whole requests that add up to the total;
- the main queue's bound and the rejection budget are divided by N (at
  least 1 queued request; a budget divided below 3 means no probing, as for
  one process with such a budget);
- a host-wide budget (`--host-limit`, `[[budgets]]` with `scope = "host"`)
  cannot be shared between processes without a store: each process gets
  limit // N of every policy (a bucket's drain / N too), so that together
  they never exceed it, even when one process's keys are idle (its share
  then goes unused: safe, not exact). A limit that gives a process 0
  (`--host-limit 1/1s` over 2 processes) is refused (`ShardError`);
- each process writes its own graveyard (`NAME.p1.jsonl`, `NAME.p2.jsonl`);
  message runs, workload files and `--results` are not sharded (refused);
- with no target, one simulator runs in a process of its own and every
  engine process sends to it (its counts and audit are the whole run's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ratedeck.config import RunConfig, to_toml_dict
from ratedeck.core.errors import RatedeckError
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import Phase, PolicyKind
from ratedeck.engine.commands import Command, PauseKey, ResumeKey, SetArrivalRate
from ratedeck.engine.observe.merge import merge_snapshots
from ratedeck.engine.settings import GRAVEYARD_AUTO
from ratedeck.engine.snapshot import Snapshot

from .process_host import ProcessHost
from .protocol import RunFacts

#: A shard publishes its snapshot this often: the console pulls every 0.25 s, and a shard's
#: snapshot carries whole histograms (see engine/observe/merge.py), so not more often.
SHARD_PUBLISH_S = 0.25


class ShardError(RatedeckError, ValueError):
    """A run that cannot be split as asked; the message says why, in one line."""


def parse_procs(text: str | int | None, cores: int | None = None) -> int:
    """`--procs`: a whole number of processes from 1, or "auto" (one per core this
    process may use). Raises ValueError with the line to print."""
    if text is None:
        return 1
    if isinstance(text, str) and text.strip().lower() == "auto":
        return max(1, cores if cores is not None else usable_cores())
    try:
        n = int(str(text).strip())
    except ValueError:
        raise ValueError(f"--procs: expected a whole number of processes or 'auto', got {text!r}") from None
    if n < 1:
        raise ValueError(f"--procs: must be at least 1, got {n}")
    if n > 256:
        raise ValueError(f"--procs: at most 256 processes, got {n}")
    return n


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split_policy(policy: Policy, n: int, what: str) -> Policy:
    """`policy` as one of `n` processes may spend it: limit // n (a bucket's drain / n)."""
    limit = policy.limit // n
    if limit < 1:
        raise ShardError(
            f"{what} {policy} cannot be shared by {n} processes (each would get 0);"
            f" use fewer --procs (at most {policy.limit})"
        )
    drain = policy.drain / n if policy.kind is PolicyKind.BUCKET else policy.drain
    return dataclasses.replace(policy, limit=limit, drain=drain)


def _shares(total: int, weights: Sequence[float]) -> list[int]:
    """`total` in whole parts proportional to `weights`, adding up to `total` (largest remainders)."""
    whole = sum(weights)
    exact = [total * w / whole if whole > 0 else total / len(weights) for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: -(exact[i] - parts[i]))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _numbered(path: str | None, i: int) -> str | None:
    if not path or path == GRAVEYARD_AUTO:  # each process places its own (core/paths.py)
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.p{i + 1}{p.suffix}"))


def shard_configs(cfg: RunConfig, n: int, url: str | None = None) -> list[RunConfig]:
    """The run `cfg` as `n` runs over disjoint keys (see the module doc); `url` is the
    target every shard sends to (the shared simulator's, when `cfg` has none).

    Fewer than `n` when there are fewer keys (or fewer requests in `total`)."""
    es = cfg.engine_settings
    wl, eng = es.workload, es.engine
    if es.messages is not None:
        raise ShardError("--procs above 1 does not run messages ([messages]); use one process")
    if wl.file:
        raise ShardError("--procs above 1 does not split a workload file; use one process")
    if es.endpoints:
        raise ShardError(
            "--procs above 1 does not split a pool of endpoints ([[endpoints]]); use one process, "
            "or one `ratedeck --store URL` per process"
        )
    if cfg.runner.results or cfg.runner.errors:
        raise ShardError("--procs above 1 does not write --results or --errors; use one process")
    if cfg.runner.store != "memory":
        raise ShardError(
            "--procs above 1 does not split a --store run; start one `ratedeck --store URL` per process "
            "(each is a member of the store)"
        )
    n = max(1, min(n, len(es.keys)))
    if wl.total is not None:
        n = max(1, min(n, wl.total))
    if n == 1:
        return [cfg if url is None else _with_url(cfg, url)]
    groups = [es.keys[i::n] for i in range(n)]
    host_policies = tuple(split_policy(p, n, "the host-wide limit") for p in es.host_policies)
    budgets = tuple(
        dataclasses.replace(
            b, policies=tuple(split_policy(p, n, f"the host budget {b.name!r}") for p in b.policies)
        )
        if b.scope == "host"
        else b
        for b in es.budgets
    )
    capacity = [sum(min(p.rate for p in k.policies) if k.policies else 0.0 for k in g) for g in groups]
    whole = sum(capacity)
    shares = [c / whole if whole > 0 else 1.0 / n for c in capacity]
    totals = _shares(wl.total, shares) if wl.total is not None else [None] * n
    out = []
    for i, keys in enumerate(groups):
        rate = wl.rate * shares[i] if wl.rate is not None else None
        workload = dataclasses.replace(wl, rate=rate, total=totals[i])
        engine = dataclasses.replace(
            eng,
            queue_max=max(1, eng.queue_max // n) if eng.queue_max is not None else None,
            rejection_budget=eng.rejection_budget // n,
            graveyard_path=_numbered(eng.graveyard_path, i),
            record_path=_numbered(eng.record_path, i),
        )
        shard = cfg.replace(
            keys=keys,
            host_policies=host_policies,
            budgets=budgets,
            workload=workload,
            engine=engine,
            report=None,
            plot=False,
            fail_on=(),
            seed=es.seed + i if es.seed is not None else None,
        )
        out.append(shard if url is None else _with_url(shard, url))
    return out


def _with_url(cfg: RunConfig, url: str) -> RunConfig:
    return cfg.replace(target=dataclasses.replace(cfg.engine_settings.target, url=url))


def merge_facts(parts: Sequence[RunFacts]) -> RunFacts:
    """The run's counts beyond the snapshot, summed over processes."""

    def add(pairs_list) -> tuple:
        total: dict = {}
        for pairs in pairs_list:
            for k, v in pairs:
                total[k] = total.get(k, 0) + v
        return tuple(sorted(total.items(), key=lambda kv: str(kv[0])))

    answers = [f.answers for f in parts]
    paths = [f.graveyard_path for f in parts if f.graveyard_path and f.graveyard_written]
    problems = [p for f in parts for p in f.problems]
    return RunFacts(
        answers=None if any(a is None for a in answers) else sum(a for a in answers if a is not None),
        statuses=add(f.statuses for f in parts),
        no_answer=add(f.no_answer for f in parts),
        redirects=add(f.redirects for f in parts),
        consecutive_no_answer=min((f.consecutive_no_answer for f in parts), default=0),
        retried=sum(f.retried for f in parts),
        graveyard_path=", ".join(paths) if paths else None,
        graveyard_written=sum(f.graveyard_written for f in parts),
        graveyard_problem=next((f.graveyard_problem for f in parts if f.graveyard_problem), None),
        problems=tuple(dict.fromkeys(problems)),
    )


# ---------------------------------------------------------------- the simulator, in its own process


class SimulatorProcess:
    """The embedded simulator in a process of its own, for a sharded run with no target."""

    def __init__(self, settings):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_simulator_main, args=(settings, child), name="ratedeck-simulator")
        self._child = child
        self.url = ""
        self.stats: dict | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        self._proc.start()
        self._child.close()
        try:
            if not self._conn.poll(timeout_s):
                raise EOFError
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self.close()
            raise RuntimeError("the simulator process did not start") from None
        if kind != "url":
            self.close()
            raise RuntimeError(f"the simulator did not start: {value}")
        self.url = f"{value}/api/request"
        return self.url

    def close(self) -> dict | None:
        """Stop it; its final counts (None if it could not say)."""
        if self._proc.pid is None:
            return None
        try:
            self._conn.send(("stop", None))
            if self._conn.poll(10):
                kind, value = self._conn.recv()
                if kind == "stats":
                    self.stats = value
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        return self.stats


def _simulator_main(settings, conn) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when it stops
    from ratedeck.core.loops import loop_factory

    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        runner.run(_simulate(settings, conn))


async def _simulate(settings, conn) -> None:
    from ratedeck.server.app import start_server

    try:
        server = await start_server(settings)
    except Exception as exc:
        conn.send(("failed", str(exc)))
        return
    conn.send(("url", server.url))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(conn.fileno(), stop.set)
    await stop.wait()
    loop.remove_reader(conn.fileno())
    stats = server.rules.stats()
    await server.close()
    conn.send(("stats", stats))


# ---------------------------------------------------------------- the host


class ShardedHost:
    """N engine processes over disjoint keys, with the face of one host (`EngineHost`).

    `snapshot()` merges the processes' latest snapshots (only when one of them
    changed); commands for one key go to the process that has it, a new
    arrival rate is shared as the rate was, other commands go to every
    process. `start`, `stop_blocking` and `abort` act on all processes side
    by side.
    """

    def __init__(self, cfg: RunConfig, procs: int, publish_s: float = SHARD_PUBLISH_S):
        self.cfg = cfg
        self.procs = procs
        self.publish_s = publish_s
        shard_configs(cfg, procs)  # refuse what cannot be split before anything starts
        self.server_stats: dict | None = None
        self.hosts: list[ProcessHost] = []
        self._simulator: SimulatorProcess | None = None
        self._owner: dict[str, ProcessHost] = {}
        keys = cfg.engine_settings.keys
        self._order = {k.label: i for i, k in enumerate(keys)}  # keys shown in the config's order
        self._shares: list[float] = []
        self._parts: tuple[Snapshot, ...] = ()
        self._merged = Snapshot(
            phase=Phase.STARTING, capacity_tps=cfg.engine_settings.capacity_tps, procs=procs
        )
        self._lock = threading.Lock()

    @property
    def aborted(self) -> bool:
        return any(h.aborted for h in self.hosts)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the simulator (if there is no target) and every engine process."""
        url = None
        if self.cfg.engine_settings.target.url is None:
            from .session import embedded_server_settings

            self._simulator = SimulatorProcess(embedded_server_settings(self.cfg))
            url = self._simulator.start(timeout_s)
        configs = shard_configs(self.cfg, self.procs, url)
        self.procs = len(configs)
        capacity = [c.engine_settings.capacity_tps for c in configs]
        whole = sum(capacity)
        self._shares = [c / whole if whole > 0 else 1.0 / len(configs) for c in capacity]
        self.hosts = [ProcessHost(c, self.publish_s, shard=True) for c in configs]
        for host, c in zip(self.hosts, configs, strict=True):
            for k in c.engine_settings.keys:
                self._owner[k.label] = host
        for host in self.hosts:
            host.launch()
        for host in self.hosts:
            host.wait_started(timeout_s)

    def snapshot(self) -> Snapshot:
        parts = tuple(h.snapshot() for h in self.hosts)
        with self._lock:
            if len(parts) != len(self._parts) or any(
                a is not b for a, b in zip(parts, self._parts, strict=False)
            ):
                merged = merge_snapshots(parts) if parts else self._merged
                order = self._order
                keys = tuple(sorted(merged.keys, key=lambda k: order.get(k.label, len(order))))
                self._merged = dataclasses.replace(merged, keys=keys, procs=len(parts) or self.procs)
                self._parts = parts
            return self._merged

    @property
    def facts(self) -> RunFacts:
        return merge_facts([h.facts for h in self.hosts])

    def send(self, command: Command) -> None:
        if isinstance(command, PauseKey | ResumeKey) and command.key in self._owner:
            self._owner[command.key].send(command)
            return
        if isinstance(command, SetArrivalRate):
            for host, share in zip(self.hosts, self._shares, strict=True):
                host.send(SetArrivalRate(command.rate * share))
            return
        for host in self.hosts:
            host.send(command)

    def effective_config(self) -> dict:
        first = self.hosts[0].effective_config()
        whole = to_toml_dict(self.cfg)
        first["keys"] = whole.get("keys", first.get("keys"))
        if "rate" in first.get("workload", {}):  # none for a job fed as fast as the limits allow
            first["workload"]["rate"] = round(self.snapshot().arrival_rate, 6)
        return first

    async def stop(self) -> Snapshot:
        return await asyncio.get_running_loop().run_in_executor(None, self.stop_blocking)

    def _each(self, fn) -> None:
        if not self.hosts:
            return
        with ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            list(pool.map(fn, self.hosts))

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        """Drain every process side by side; the merged final snapshot."""
        self._each(lambda h: h.stop_blocking(timeout_s))
        return self._finish()

    def abort(self) -> Snapshot:
        """Stop every process at once (see `ProcessHost.abort`)."""
        self._each(lambda h: h.abort())
        return self._finish()

    def _finish(self) -> Snapshot:
        if self._simulator is not None:
            self.server_stats = self._simulator.close()
            self._simulator = None
        return self.snapshot()
