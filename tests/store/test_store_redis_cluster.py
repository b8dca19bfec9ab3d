"""Ratedeck on a real 3-master Redis Cluster: a master that dies, the CLI's URLs, the keys' tags.

The cluster is started by `redis_cluster.RedisCluster` (free loopback ports,
no persistence, `cluster-require-full-coverage no`). Members here are engines
on one loop, each with its own connection and its own simulated server (which
keeps its own audit); every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratedeck.config import load_config
from ratedeck.engine.cluster.member import budget_name, host_fingerprint, key_group
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import SimulatedTransport
from ratedeck.store.redis import RedisStore
from ratedeck.store.redis_shared import RedisShared
from tests.store.test_store_redis import audit, until
from tests.support.redis_cluster import RedisCluster, _ask, _reset
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow

RATEDECK = [sys.executable, "-m", "ratedeck.runner.cli"]


def _member(url: str, target: str, ns: str) -> tuple[Engine, SimulatedTransport]:
    cfg = load_config(
        preset="study",
        overrides={
            "target": {"url": target},  # names the budgets (its host); the simulated server answers
            "engine": {"graveyard_path": "", "pacing": "burst"},
            "workload": {"rate": 100.0},
            "run": {"seed": 1},
        },
    )
    transport = SimulatedTransport(study_settings())
    return Engine(cfg, transport, shared_state=RedisShared(url, namespace=ns)), transport


def _masters_of(cluster: RedisCluster, url: str) -> set[int]:
    """The masters a member of the study preset at `url` keeps its names on: its host's (the
    host's gate) and its keys' groups (the study's keys have no host-wide budget)."""
    secrets = [k.secret for k in load_config(preset="study").engine_settings.keys]
    host = host_fingerprint(url)
    groups = [host, *(f"{host}.s{key_group(budget_name(url, s).split('/')[1])}" for s in secrets)]
    return {cluster.owner(f"{{h:{g}}}") for g in groups}


def _hosts_on_two_masters(cluster: RedisCluster) -> tuple[str, str, str, int]:
    """Two target URLs, the first one's host on a master (the one the test kills) that holds
    nothing of the second one's (its host and its keys on the other masters), and a namespace
    whose queue and snapshots are not on that master."""
    urls = [f"http://api{i}.test:8080/v1" for i in range(400)]
    a = urls[0]
    victim = cluster.owner(f"{{h:{host_fingerprint(a)}}}")
    b = next(u for u in urls[1:] if victim not in _masters_of(cluster, u))
    ns = next(f"c{i}" for i in range(200) if cluster.owner(f"{{q:c{i}}}") != victim)
    return a, b, ns, victim


def test_a_master_that_dies_takes_only_its_hosts_budgets_and_all_resume(shared_cluster):
    """Kill the master that holds host A's gate (no replicas): A sends nothing (its polls fail:
    a member stops while any master it polls is away, and its keys' leases with it), B (nothing
    of it on that master) goes on; A resumes when the master is back (empty)."""
    cluster = shared_cluster
    _reset(cluster)
    a_url, b_url, ns, victim = _hosts_on_two_masters(cluster)

    async def main():
        a, ta = _member(cluster.url, a_url, ns)
        b, tb = _member(cluster.url, b_url, ns)
        a.start()
        b.start()
        try:
            await until(lambda: a.parts.metrics.sent > 100 and b.parts.metrics.sent > 100, 10)
            cluster.stop(victim)
            await until(lambda: a.parts.cluster.down_since is not None, 3)
            assert b.parts.cluster.down_since is None
            await asyncio.sleep(
                a.parts.cluster.horizon_s + a.parts.cluster.slack_s + 0.05
            )  # leases granted before
            sent_a, sent_b = a.parts.metrics.sent, b.parts.metrics.sent
            await asyncio.sleep(1.5)
            assert a.parts.metrics.sent == sent_a  # no grant for A's keys: no send
            # B's keys, on another master, went on (100/s offered). The two members share this
            # test's one loop, where A's calls to the dead master (connects, timeouts) take turns
            # too: 32 in 1.5 s seen under load; in production a member is a process of its own.
            assert b.parts.metrics.sent > sent_b + 15
            assert b.parts.cluster.down_since is None
            cluster.start(victim)  # same port, same nodes file: its slots back, its data lost
            back = time.monotonic()
            await until(lambda: a.parts.metrics.sent > sent_a + 20, 8)
            resumed_s = time.monotonic() - back
            assert any("reachable again" in e.text for e in a.snapshot().events)
        finally:
            await a.stop()
            await b.stop()
        for t in (ta, tb):
            worst, rejected = audit(t)
            assert worst <= 20 and rejected == 0
        return resumed_s

    resumed_s = asyncio.run(main())
    assert resumed_s < 5.0
    # every key ratedeck wrote carries a hash tag: a host's, a key's at it or a queue's
    keys = [k for n in cluster.nodes for k in _ask(n.port, "--scan").split()]
    assert keys and all(k.startswith(f"{ns}:{{h:") or k.startswith(f"{ns}:{{q:{ns}}}:") for k in keys), keys


def test_enqueue_through_the_cli_and_any_one_node_finds_the_rest(shared_cluster, tmp_path: Path):
    cluster = shared_cluster
    _reset(cluster)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(f'{{"n": {i}}}\n' for i in range(25)))
    dead = free_port()  # listed first, nothing there: the next node answers
    url = f"redis+cluster://127.0.0.1:{dead},127.0.0.1:{cluster.nodes[1].port}"
    proc = subprocess.run(
        [*RATEDECK, "enqueue", "--store", url, str(jobs)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "enqueued 25 jobs" in proc.stdout and "(25 pending)" in proc.stdout

    async def count() -> int:
        store = RedisStore(cluster.url)
        try:
            return (await store.counts()).pending
        finally:
            await store.close()

    assert asyncio.run(count()) == 25


@pytest.mark.parametrize(
    "store",
    [
        "redis+cluster://:s3cretpw@127.0.0.1:{port},127.0.0.1:{port2}",  # nothing listens
        "redis+cluster://:s3cretpw@127.0.0.1:99999",
        "redis+cluster://:s3cretpw@127.0.0.1:{port}/3",
        "redis+cluster://:s3cretpw@",
    ],
)
def test_bad_or_unreachable_cluster_is_one_line_exit_2(store: str, tmp_path: Path):
    url = store.format(port=free_port(), port2=free_port())
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"n": 1}\n')
    for argv in (["--no-ui", "--store", url, "--duration", "2"], ["enqueue", "--store", url, str(jobs)]):
        proc = subprocess.run([*RATEDECK, *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "s3cretpw" not in proc.stderr + proc.stdout
        assert "redis+cluster://" in lines[0], lines[0]
