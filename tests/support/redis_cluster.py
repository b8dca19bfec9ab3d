"""A real 3-master Redis Cluster for tests: free loopback ports, one temporary directory, no persistence.

    with RedisCluster() as cluster:         # created, `cluster_state:ok` on every node
        cluster.url                          # redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
        cluster.stop(i); cluster.start(i)    # kill master i, start it again (same port, same nodes file)

Each master runs with `cluster-require-full-coverage no`: a master that dies
takes only its own slots away, the others keep answering (the setting
`docs/many-processes.md` asks for). No replicas, so a dead master's slots stay
down until it is back. Stopped by PID (never by name), also when the start fails.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import pytest

from ratedeck.bench.cluster import port_free
from tests.support.redis_server import RedisServer, free_port

READY_S = 20.0


def _ask(port: int, *args: str) -> str:
    """One command to one node through redis-cli ('' when it does not answer)."""
    try:
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except subprocess.TimeoutExpired:
        return ""
    return out.stdout


class _Node(RedisServer):
    """One cluster-enabled master (its nodes file in `dir`, kept across a restart)."""

    def __init__(self, port: int, directory: str):
        super().__init__(port)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = directory

    def args(self) -> list[str]:
        p = str(self.port)
        return [
            *("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf"),
            *("--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"),
        ]


class RedisCluster:
    """Three masters on 127.0.0.1, slots spread evenly (`redis-cli --cluster create`)."""

    def __init__(self, masters: int = 3):
        if shutil.which("redis-cli") is None:
            raise RuntimeError("redis-cli is not installed (.ci/deps installs redis-tools)")
        self.dir = tempfile.mkdtemp(prefix="ratedeck-cluster-")
        ports: list[int] = []
        while len(ports) < masters:
            p = free_port()
            # a node also listens on port + 10000 (the cluster bus): both must be free
            if p not in ports and p + 10000 < 65536 and port_free(p + 10000):
                ports.append(p)
        self.nodes = [_Node(p, self.dir) for p in ports]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start_all(self) -> RedisCluster:
        try:
            for n in self.nodes:
                n.start()
            out = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
                + ["--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {(out.stdout + out.stderr)[-400:]}")
            self.wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def wait_ok(self, timeout_s: float = READY_S) -> None:
        """Until every node says `cluster_state:ok` (and knows every master), else RuntimeError."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {n.port: _ask(n.port, "cluster", "info") for n in self.nodes}
            if all(
                "cluster_state:ok" in s and f"cluster_size:{len(self.nodes)}" in s for s in states.values()
            ):
                return
            if time.monotonic() > deadline:
                bad = {p: s.split("\r\n")[0] or "no answer" for p, s in states.items() if "state:ok" not in s}
                raise RuntimeError(f"the cluster was not ok within {timeout_s}s: {bad}")
            time.sleep(0.1)

    def owner(self, key: str) -> int:
        """The index of the master that holds `key`'s slot."""
        slot = int(_ask(self.nodes[0].port, "cluster", "keyslot", key).strip())
        for line in _ask(self.nodes[0].port, "cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2]:
                continue
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if not lo.isdigit():
                    continue
                if int(lo) <= slot <= int(hi or lo):
                    return [n.port for n in self.nodes].index(port)
        raise RuntimeError(f"no master holds slot {slot}")

    def stop(self, i: int) -> None:
        self.nodes[i].stop()  # SIGKILL by PID: a crash

    def start(self, i: int) -> None:
        self.nodes[i].start()  # the same port and nodes file: it rejoins with its slots
        self.wait_ok()

    def close(self) -> None:
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start_all()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def redis_cluster():
    """A fresh 3-master cluster for one test."""
    with RedisCluster() as cluster:
        yield cluster


class ClusterAsOne:
    """A cluster used where the tests of one server use a `RedisServer`: `url`, and `stop`/`start`
    kill and restart the master that holds one hash tag (by default the embedded simulator's host,
    where members on it keep their budgets), empty: its state lost, as a lone server's would be."""

    def __init__(self, cluster: RedisCluster, tag_key: str | None = None):
        from ratedeck.engine.cluster.member import host_fingerprint

        self.cluster = cluster
        self.victim = cluster.owner(tag_key or f"{{h:{host_fingerprint(None)}}}")

    @property
    def url(self) -> str:
        return self.cluster.url

    def stop(self) -> None:
        self.cluster.stop(self.victim)

    def start(self) -> None:
        # as a lone server's start: answering PING, no wait for the cluster's state (the tests call
        # this on their event loop; the members must find the master back themselves)
        self.cluster.nodes[self.victim].start()


_SHARED: list[RedisCluster] = []


@pytest.fixture(scope="session")
def shared_cluster():
    """One cluster for the session (every test that takes it gets it emptied and whole)."""
    if not _SHARED:
        _SHARED.append(RedisCluster().start_all())
    yield _SHARED[0]
    while _SHARED:
        _SHARED.pop().close()


def _reset(cluster: RedisCluster) -> None:
    for n in cluster.nodes:
        if n.proc is None:
            n.start()
    cluster.wait_ok()
    for n in cluster.nodes:
        _ask(n.port, "flushall")


@pytest.fixture(params=["single", "cluster"])
def redis_any(request):
    """A lone redis-server, then the shared 3-master cluster (emptied): the same test on both."""
    if request.param == "single":
        with RedisServer() as server:
            yield server
    else:
        cluster = request.getfixturevalue("shared_cluster")
        _reset(cluster)
        yield ClusterAsOne(cluster)
