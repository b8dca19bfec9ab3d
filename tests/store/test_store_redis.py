"""Many members on one real redis-server: work streams, shared gates, Redis going away and back.

Members here are engines on one loop, each with its own Redis connection, all
sending through one simulated server (`SimulatedTransport`), which keeps its
own audit of every key's windows. Every wait polls a condition with a
deadline; nothing sleeps hoping.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from ratedeck.config import load_config
from ratedeck.core.vocab import Ending, KeyState
from ratedeck.engine.engine import Engine
from ratedeck.runner.report import build_report
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import SimulatedTransport
from ratedeck.store.base import Finished, StoreError
from ratedeck.store.redis import RedisStore
from ratedeck.store.redis_shared import RedisShared, format_cluster, read_cluster
from tests.runner.test_report_schema import validate
from tests.support.redis_server import RedisServer, free_port

# a real redis-server and wall-clock runs (DESIGN.md: such tests are marked slow)
pytestmark = pytest.mark.slow


async def until(cond, timeout_s: float, step_s: float = 0.02, why=None) -> float:
    """Wait until `cond()` holds (returns how long it took); fails the test at the deadline,
    with what `why()` says of the state then."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s}s" + (f": {why()}" if why is not None else ""))
        await asyncio.sleep(step_s)
    return time.monotonic() - start


def member(url: str, transport, ns: str, rate: float = 100.0, pacing: str = "even") -> Engine:
    cfg = load_config(
        preset="study",
        overrides={
            "engine": {"graveyard_path": "", "pacing": pacing},
            "workload": {"rate": rate},
            "run": {"seed": 1},
        },
    )
    return Engine(cfg, transport, shared_state=RedisShared(url, namespace=ns))


def _members_state(*args) -> str:
    """Each member's sends since, store state and last events (what a stalled resume shows)."""
    engines, before = args[: len(args) // 2], args[len(args) // 2 :]
    out = []
    for e, sent in zip(engines, before, strict=True):
        c = e.parts.cluster
        events = " | ".join(f"{ev.at_s} {ev.text}" for ev in list(e.parts.log.rows)[-6:])
        out.append(
            f"member sent {e.parts.metrics.sent - sent} since, down_since={c.down_since}, problem={c.last_problem!r},"
            f" epoch={c.epoch}, leases={c.lease_totals()}, events: {events}"
        )
    return " || ".join(out)


def audit(transport: SimulatedTransport) -> tuple[int, int]:
    """(most accepted in any window of any key, 429s) as the server counted them."""
    stats = transport.rules.stats()
    worst = max(p["max_in_window"] for k in stats["keys"] for p in k["max_in_window"])
    return worst, stats["totals"]["rejected_429"]


# ---------------------------------------------------------------- work streams


def test_claim_finish_and_a_dead_members_entries_reclaimed(redis_any):
    async def main():
        a = RedisStore(redis_any.url, namespace="w1", claim_timeout_s=0.6)
        b = RedisStore(redis_any.url, namespace="w1", claim_timeout_s=0.6)
        c = RedisStore(redis_any.url, namespace="w1", claim_timeout_s=0.6)
        assert await a.enqueue([{"n": i} for i in range(12)]) == 12
        got_a = await a.claim("a", 4)
        got_b = await b.claim("b", 4)
        assert [j.id for j in got_a] == [1, 2, 3, 4] and [j.id for j in got_b] == [5, 6, 7, 8]
        await a.mark_sending("a", [1, 2, 3, 4])
        await a.finish("a", [Finished(1, Ending.SUCCEEDED, 1), Finished(2, Ending.GRAVEYARD, 3, {"id": 2})])
        counts = await a.counts()
        assert (counts.pending, counts.claimed, counts.done) == (4, 6, {"succeeded": 1, "graveyard": 1})
        # a dies: no release, no more refreshes of its entries; b lives on (its refresher runs)
        assert a._refresher is not None
        a._refresher.cancel()
        assert await c.recover("c", retry=True) == 0  # nothing idle long enough yet
        taken: list = []

        async def claim_more():
            taken.extend(await c.claim("c", 10))

        start = time.monotonic()
        while {3, 4} - {j.id for j in taken}:
            assert time.monotonic() - start < 5, [j.id for j in taken]
            await claim_more()
            await asyncio.sleep(0.1)
        ids = sorted(j.id for j in taken)
        assert ids == [3, 4, 9, 10, 11, 12]  # a's unfinished two and the never-claimed four; none of b's
        assert {j.id for j in taken if j.uncertain} == {3, 4}
        assert {j.key for j in taken if j.id == 3} == {got_a[2].key}  # the same Idempotency-Key
        await asyncio.sleep(0.8)  # past the claim timeout: b's entries are still b's (kept fresh)
        await claim_more()
        assert sorted(j.id for j in taken) == ids
        await b.release("b", [5, 6])
        assert (await c.counts()).pending == 2
        assert await a.graveyard_lines() == [{"id": 2}]
        for s in (a, b, c):
            await s.close()

    asyncio.run(main())


def test_without_an_idempotency_key_a_dead_members_jobs_become_uncertain(redis_any):
    async def main():
        a = RedisStore(redis_any.url, namespace="w2", claim_timeout_s=0.3)
        c = RedisStore(redis_any.url, namespace="w2", claim_timeout_s=0.3)
        await a.enqueue([{"n": i} for i in range(4)])
        await a.claim("a", 3)
        await a.mark_sending("a", [1, 2])  # job 3 was claimed, never marked: never sent
        assert a._refresher is not None
        a._refresher.cancel()
        await asyncio.sleep(0.4)
        assert await c.recover("c", retry=False) == 2
        counts = await c.counts()
        assert (counts.pending, counts.claimed, counts.uncertain) == (2, 0, 2)
        assert sorted(j.id for j in await c.claim("c", 5)) == [3, 4]  # never sent twice; 3 back as it was
        await c.save_windows("c", {"3f9a1c": [100.0, 100.5]})
        kept = await a.load_windows()
        assert kept["3f9a1c"][1] == [100.0, 100.5]
        await a.close()
        await c.close()

    asyncio.run(main())


def test_bad_and_unreachable_urls_are_one_line():
    from ratedeck.store.open import open_store

    for url in ("redis://127.0.0.1:99999/0", "redis://127.0.0.1:6379/x", "redis://:6379/0"):
        with pytest.raises(StoreError) as err:
            open_store(url)
        assert "\n" not in str(err.value)
    port = free_port()  # nothing listens there
    store = open_store(f"redis://127.0.0.1:{port}/0")

    async def main():
        assert store is not None
        try:
            await store.counts()
        finally:
            await store.close()

    with pytest.raises(StoreError) as err:
        asyncio.run(main())
    assert f"127.0.0.1:{port}" in str(err.value) and "\n" not in str(err.value)


def test_cli_unreachable_redis_exits_2_with_one_line():
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--store", f"redis://127.0.0.1:{port}/0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- members together


def test_two_members_share_the_budget_and_a_gate(redis_any):
    async def main():
        transport = SimulatedTransport(study_settings())
        a = member(redis_any.url, transport, "m1")
        b = member(redis_any.url, transport, "m1")
        a.start()
        b.start()
        try:
            await until(lambda: a.parts.metrics.succeeded > 40 and b.parts.metrics.succeeded > 40, 10)
            # a is told Retry-After on k1: it closes its gate and shares it, as _cool does
            now = a.parts.run.clock()
            gate = a.parts.limits.gates["k1"]
            assert gate.close(now + 1.5, "Retry-After 1.5s", now)
            assert a.parts.cluster is not None
            a.parts.cluster.gate_closed(gate, "Retry-After 1.5s")
            took = await until(lambda: b.parts.limits.gates["k1"].open_at > b.parts.run.clock(), 1.0, 0.005)
            assert took < 0.5  # a poll (0.1 s) and a round trip
            k1 = b.parts.keys.by_label["k1"]
            assert k1.state(b.parts.run.clock()) is KeyState.COOLING
            sent_then = k1.sent
            await asyncio.sleep(0.8)  # well inside the 1.5 s cooldown
            assert k1.sent == sent_then  # b sent nothing on k1 while a's Retry-After held
            assert b.parts.keys.by_label["k2"].sent > 0
            # the cluster view: both members, their counts, no secret
            shared = RedisShared(redis_any.url, namespace="m1")
            view = await read_cluster(shared.client, "m1")
            await shared.close()
            assert len(view["members"]) == 2
            assert {m["store"] for m in view["members"]} == {"ok"}
            shown = format_cluster(view)
            assert shown.count("\n  ") == 2 and "2 members" in shown
            text = str(view) + shown
            for spec in a.cfg.keys:
                assert spec.secret not in text
        finally:
            await a.stop()
            await b.stop()
        worst, rejected = audit(transport)
        assert worst <= 20 and rejected == 0
        total = a.parts.metrics.succeeded + b.parts.metrics.succeeded
        return total, a.parts.run.ended_at - a.parts.run.started_at

    total, elapsed = asyncio.run(main())
    assert total <= 100 * elapsed + 100  # together never more than the keys allow


def test_two_members_each_see_the_other_in_their_snapshot(redis_server):
    async def main():
        transport = SimulatedTransport(study_settings())
        a = member(redis_server.url, transport, "m3")
        b = member(redis_server.url, transport, "m3")
        jobs = RedisStore(redis_server.url, namespace="m3")
        await jobs.enqueue([{"n": i} for i in range(5)])  # the shared queue's depth shows in the view
        a.start()
        b.start()
        assert a.parts.cluster is not None and b.parts.cluster is not None
        ids = {a.parts.cluster.member, b.parts.cluster.member}

        def both_seen(engine: Engine) -> bool:
            view = engine.snapshot().cluster
            return view is not None and {m.member for m in view.members} == ids

        try:
            await until(lambda: both_seen(a) and both_seen(b), 5)
            await until(lambda: all(m.sent > 0 for m in a.snapshot().cluster.members), 5)
            for engine in (a, b):
                view = engine.snapshot().cluster
                assert view is not None and view.waiting == 5 and view.claimed == 0
                assert all(m.phase == "running" and m.store == "ok" for m in view.members)
                for spec in engine.cfg.keys:
                    assert spec.secret not in repr(view)
            report = build_report(a.snapshot())  # the report carries it too, and validates
            assert validate(report) == [] and {m["member"] for m in report["cluster"]["members"]} == ids
        finally:
            await a.stop()
            await b.stop()
            await jobs.close()
        # read from outside (as `python -m ratedeck.store.redis_shared` does): the last summaries
        shared = RedisShared(redis_server.url, namespace="m3")
        try:
            assert {m.member for m in (await shared.read_cluster()).members} == ids
        finally:
            await shared.close()

    asyncio.run(main())


@pytest.mark.parametrize("outage_s", [1.0, 0.0])
def test_redis_stopped_and_restarted_no_send_without_a_budget_then_resume(redis_any, outage_s):
    """Down long (every send before it is out of the window) or restarted at once (the state
    lost while sends before it still count: the first grant waits them out). On the cluster:
    the master that holds the host's budgets, killed and restarted empty."""
    server = redis_any

    async def main():
        transport = SimulatedTransport(study_settings())
        # bursts: a window's whole budget at once, so a lost state would show as an overrun
        a = member(server.url, transport, "m2", pacing="burst")
        b = member(server.url, transport, "m2", pacing="burst")
        a.start()
        b.start()
        try:
            # full windows of sends before the loss: 2 s of the keys' 100/s
            await until(lambda: a.parts.metrics.sent + b.parts.metrics.sent > 200, 10)
            server.stop()
            killed = a.parts.run.clock()
            if outage_s:
                await until(
                    lambda: a.parts.cluster.down_since is not None and b.parts.cluster.down_since is not None,
                    3,
                )
                # what was leased before may still go (it was granted); nothing after the horizon
                horizon = a.parts.cluster.horizon_s + a.parts.cluster.slack_s + 0.05
                await asyncio.sleep(horizon)
                sent_a, sent_b = a.parts.metrics.sent, b.parts.metrics.sent
                await asyncio.sleep(outage_s)
                assert (a.parts.metrics.sent, b.parts.metrics.sent) == (sent_a, sent_b)  # no budget, no send
                snap = a.snapshot()
                store_gate = {g.name: g for g in snap.gates}["store"]
                assert store_gate.left_s > 0 and store_gate.reason == "store unreachable"
                assert all(k.state is KeyState.COOLING for k in snap.keys)
                assert any("unreachable" in e.text for e in snap.events)
            server.start()  # same port, empty: the budgets' state is lost
            sent_a, sent_b = a.parts.metrics.sent, b.parts.metrics.sent
            back = time.monotonic()
            await until(
                lambda: a.parts.metrics.sent > sent_a + 5 and b.parts.metrics.sent > sent_b + 5,
                8,
                why=lambda: _members_state(a, b, sent_a, sent_b),
            )
            resumed_s = time.monotonic() - back
            if outage_s:
                assert any("reachable again" in e.text for e in a.snapshot().events)
            await until(lambda: a.parts.metrics.sent + b.parts.metrics.sent > sent_a + sent_b + 100, 5)
            return killed, resumed_s
        finally:
            await a.stop()
            await b.stop()
            worst, rejected = audit(transport)
            assert worst <= 20 and rejected == 0, (worst, rejected)  # across the loss of the state too

    _killed, resumed_s = asyncio.run(main())
    # About 1.7 s on one server: a ping, then the longest window and the leases' horizon. A
    # cluster's master restarted on its port rejoins first (its slots answer again once the
    # client refreshes its map after a failed call, with the client's backoff): 3 to 4.5 s seen.
    assert resumed_s < (2.5 if isinstance(redis_any, RedisServer) else 6.0), resumed_s


def test_the_docs_member_commands_load_as_written():
    """The "Many processes" commands parse, and name the same Redis as the enqueue line."""
    import re
    import shlex
    from pathlib import Path

    from ratedeck.runner.cli import build_parser, overrides_from_args

    page = (Path(__file__).parents[2] / "docs" / "many-processes.md").read_text()
    section = page[page.index("# Many processes") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    members = [line.rstrip(" &") for line in block.splitlines() if line.startswith("ratedeck --no-ui")]
    assert len(members) == 2 and "redis-server" in block and "ratedeck enqueue --store redis://" in block
    for command in members:
        args = build_parser().parse_args(shlex.split(command)[1:])
        cfg = load_config(args.config, args.preset, overrides_from_args(args))
        assert (
            cfg.runner.store == "redis://127.0.0.1:6379/0" and cfg.engine_settings.target.url == args.target
        )


@pytest.mark.parametrize("which", ["shared", "store"])
def test_a_cancel_hidden_as_a_client_timeout_still_cancels(which):
    """redis-py's read timeout racing a cancel can raise TimeoutError instead of CancelledError;
    taken for a store failure, a stopping member's poll loop (or a journal) lived on and the
    process never exited (seen once in a few bench runs). It must stay a cancel."""

    async def main():
        target = (
            RedisShared("redis://127.0.0.1:1/0") if which == "shared" else RedisStore("redis://127.0.0.1:1/0")
        )
        call = target._call if isinstance(target, RedisShared) else target._do
        started = asyncio.Event()

        async def read():
            started.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise TimeoutError("Timeout reading from socket") from None

        task = asyncio.create_task(call(read))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_connection_closed_under_a_command_counts_as_the_store_not_answering():
    """redis-py lets a transport's error through when the connection was closed under a command
    (seen when a cluster master restarted: the member's poll loop died on it and never resumed)."""
    from ratedeck.store.redis_shared import is_store_failure

    assert is_store_failure(AttributeError("'NoneType' object has no attribute 'writelines'"))
    assert is_store_failure(TypeError("'NoneType' object is not callable"))
    assert not is_store_failure(AttributeError("'Engine' object has no attribute 'cluster'"))
    assert not is_store_failure(ValueError("bad"))
