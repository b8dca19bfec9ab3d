"""A host's keys spread over a Redis Cluster's masters (issue 44), and where they must not.

A key none of whose grants touches a host-wide budget has its names in one of
the host's groups of keys, each a slot of its own (`{h:<host>.s<n>}`,
`ClusterMember.store_name`); a key of a host that has a host-wide budget keeps
the host's slot, so one grant spends both.
The first test runs two members on a real 3-master cluster (one simulated
server audits every key's windows); the others look at the names on virtual
time, with the fake store of `test_store_redis_member`.
"""

from __future__ import annotations

import asyncio

import pytest

from ratedeck.config import load_config
from ratedeck.engine.cluster.member import key_group
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual
from ratedeck.store.redis_shared import tag
from tests.store.test_store_redis import audit, member, until
from tests.store.test_store_redis_member import FakeShared, record_asks
from tests.support.redis_cluster import _ask, _reset


@pytest.mark.slow
def test_five_keys_of_one_host_spread_over_the_masters_and_their_windows_hold(shared_cluster):
    cluster = shared_cluster
    _reset(cluster)

    async def main() -> tuple[dict[str, str], int, int]:
        transport = SimulatedTransport(study_settings())
        # bursts: a window's whole budget at once, so a grant that lost its exactness overruns
        a = member(cluster.url, transport, "sp", pacing="burst")
        b = member(cluster.url, transport, "sp", pacing="burst")
        a.start()
        b.start()
        try:
            # full windows of all five keys, shared: 3 s of the keys' 100/s
            await until(lambda: a.parts.metrics.sent + b.parts.metrics.sent > 300, 15)
        finally:
            await a.stop()
            await b.stop()
        c = a.parts.cluster
        assert c is not None
        groups = {label: tag(c.store_name(name)) for label, name in c.budget_ids.items()}
        worst, rejected = audit(transport)
        return groups, worst, rejected

    groups, worst, rejected = asyncio.run(main())
    assert worst <= 20 and rejected == 0, (worst, rejected)
    # the study's five keys fall in four groups (0, 1, 0, 5, 3), each its own hash tag, which
    # the grants wrote their counts under
    assert len(set(groups.values())) == 4, groups
    held_by: dict[str, set[int]] = {}
    for i, node in enumerate(cluster.nodes):
        for key in _ask(node.port, "--scan", "--pattern", "sp:*").split():
            held_by.setdefault(key.split("{", 1)[1].split("}", 1)[0], set()).add(i)
    for label, group in groups.items():
        assert group in held_by, (label, group, sorted(held_by))
    masters = set().union(*(held_by[g] for g in groups.values()))
    assert len(masters) >= 2, (masters, groups)


def _asked(overrides: dict) -> tuple[set[str], Engine]:
    """The budget names a member of the study preset (with `overrides`) asked the store for."""
    cfg = load_config(
        preset="study",
        overrides={
            "engine": {"graveyard_path": ""},
            "workload": {"rate": 100.0},
            "run": {"seed": 3},
            **overrides,
        },
    )
    shared = FakeShared(gap=0.05)
    asked = record_asks(shared)

    async def main() -> Engine:
        engine = Engine(cfg, SimulatedTransport(study_settings()), shared_state=shared)
        engine.start()
        await asyncio.sleep(1.0)
        await engine.stop()
        return engine

    return asked, run_virtual(main())


def test_each_key_without_a_host_budget_is_asked_in_a_group_of_keys():
    asked, engine = _asked({})
    c = engine.parts.cluster
    assert c is not None
    own = {f"{host}.s{key_group(key)}/{key}" for host, key in (n.split("/") for n in c.budget_ids.values())}
    assert asked == own, (asked, own)
    assert len({tag(n) for n in asked}) == 4  # five keys in four of the host's groups
    # the key's gate is under its group too; the host's gate stays the host's
    assert c.store_name(c.gate_ids["k1"]) in own
    assert c.store_name(c.gate_ids["host"]) == c.gate_ids["host"]


def test_keys_of_a_host_with_a_host_wide_budget_keep_the_hosts_group():
    asked, engine = _asked({"keys": {"host_limits": ["60/1s"]}})
    c = engine.parts.cluster
    assert c is not None and not c.own_slot
    hosts = {n.split("/")[0] for n in c.budget_ids.values()}
    assert len(hosts) == 1 and len(asked) == 6  # five keys and the host's budget, one slot
    assert {tag(n) for n in asked} == {f"h:{hosts.pop()}"}
