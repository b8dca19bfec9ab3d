"""`SqliteStore` on real files: the `WorkStore` contract, all-or-nothing writes, durability
across a kill -9, and files that are not ours left untouched."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ratedeck.core.vocab import Ending
from ratedeck.store import Finished, StoreError, open_store
from ratedeck.store.sqlite import SqliteStore


def run(coro):
    return asyncio.run(coro)


def test_jobs_go_pending_claimed_done_in_order_and_each_claim_is_exclusive(tmp_path):
    path = tmp_path / "w.db"

    async def scenario() -> None:
        a, b = SqliteStore.open(str(path)), SqliteStore.open(str(path))  # two processes' worth
        try:
            assert await a.enqueue([{"job": i} for i in range(1, 8)]) == 7
            first = await a.claim("ma", 3)
            second = await b.claim("mb", 3)
            assert [j.item["job"] for j in first] == [1, 2, 3]
            assert [j.item["job"] for j in second] == [4, 5, 6]
            assert not {j.id for j in first} & {j.id for j in second}
            assert all(j.attempts == 0 and not j.uncertain for j in first + second)
            assert len({j.key for j in first + second}) == 6  # a key per job
            await a.finish("ma", [Finished(first[0].id, Ending.SUCCEEDED, 1)])
            await a.finish("ma", [Finished(second[0].id, Ending.SUCCEEDED, 1)])  # not ma's: ignored
            record = {"id": 9, "ending": "graveyard", "params": {"job": 2}}
            await b.finish("mb", [Finished(second[1].id, Ending.EXPIRED, 2)])
            await a.finish("ma", [Finished(first[1].id, Ending.GRAVEYARD, 3, record)])
            c = await b.counts()
            assert (c.pending, c.claimed, c.uncertain) == (1, 3, 0)
            assert dict(c.done) == {"succeeded": 1, "graveyard": 1, "expired": 1} and c.total == 7
            assert await b.graveyard_lines() == [record]
            assert [j.item["job"] for j in await b.claim("mb", 5)] == [7]
            assert await b.claim("mb", 5) == []
        finally:
            await a.close()
            await b.close()

    run(scenario())


def test_release_gives_jobs_back_as_they_were(tmp_path):
    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.enqueue([{"job": 1}, {"job": 2}])
        jobs = await s.claim("m", 2)
        await s.release("m", [jobs[1].id])
        await s.release("other", [jobs[0].id])  # not its claim: ignored
        c = await s.counts()
        assert (c.pending, c.claimed) == (1, 1)
        again = await s.claim("m2", 2)
        assert [(j.id, j.attempts, j.uncertain, j.key) for j in again] == [
            (jobs[1].id, 0, False, jobs[1].key)
        ]
        await s.close()

    run(scenario())


@pytest.mark.parametrize("retry", [True, False])
def test_recover_takes_back_a_dead_member_s_jobs_as_uncertain(tmp_path, retry):
    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.enqueue([{"job": i} for i in range(4)])
        dead = await s.claim("dead", 2)
        await s.mark_sending("dead", [j.id for j in dead])  # they may have been sent
        mine = await s.claim("me", 1)
        assert await s.recover("me", retry=retry) == 2
        c = await s.counts()
        assert c.claimed == 1  # my own claim is not taken back
        if retry:  # sent again, under the same key, flagged uncertain
            assert (c.pending, c.uncertain) == (3, 0)
            again = await s.claim("me", 3)
            back = {j.id: j for j in again if j.uncertain}
            assert sorted(back) == [j.id for j in dead]
            assert all(back[j.id].key == j.key and back[j.id].attempts == 1 for j in dead)
        else:  # never sent again: reported
            assert (c.pending, c.uncertain) == (1, 2)
            assert [j.id for j in await s.claim("me", 5)] == [mine[0].id + 1]
        await s.close()

    run(scenario())


def test_recover_puts_a_dead_member_s_unsent_claims_back_as_they_were(tmp_path):
    """Only the jobs marked sending may have reached the server: the rest of a killed run's
    claim was never sent, and goes back to pending, not uncertain and not counted as resumed."""

    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.enqueue([{"job": i} for i in range(6)])
        dead = await s.claim("dead", 5)
        await s.mark_sending("dead", [dead[0].id, dead[1].id])
        await s.mark_sending("other", [dead[2].id])  # not its claim: no mark
        assert await s.recover("me", retry=False) == 2
        c = await s.counts()
        assert (c.pending, c.claimed, c.uncertain) == (4, 0, 2)
        again = await s.claim("me", 6)
        assert [j.id for j in again] == [j.id for j in dead[2:]] + [6]
        assert not any(j.uncertain for j in again) and all(j.attempts == 0 for j in again)
        await s.close()

    run(scenario())


def test_recover_leaves_a_member_still_at_work_its_jobs_and_takes_a_gone_one_s(tmp_path):
    """A --resume while another run is still at work took its jobs, and both sent them. Now a
    member that beat lately is watched: beating again, it is at work and keeps its jobs; a
    member that beat long ago, or never (an older ratedeck), is gone and its jobs are taken."""

    async def scenario() -> None:
        path = str(tmp_path / "w.db")
        s, working = SqliteStore.open(path), SqliteStore.open(path)  # two processes' worth
        await s.enqueue([{"job": i} for i in range(6)])
        held = await working.claim("working", 2)
        await working.mark_sending("working", [j.id for j in held])
        gone = await s.claim("gone", 2)
        await s.mark_sending("gone", [j.id for j in gone])
        never = await s.claim("never", 1)  # a run of an older ratedeck: no beats at all
        await s.mark_sending("never", [j.id for j in never])
        await s.beat("gone")
        with sqlite3.connect(path) as con:  # its last beat a minute ago
            con.execute("UPDATE members SET at = at - 60 WHERE member = 'gone'")

        stop = asyncio.Event()

        async def at_work() -> None:
            while True:  # a beat every 0.1 s until stopped; none is in flight once it returns
                try:
                    await asyncio.wait_for(stop.wait(), 0.1)
                    return
                except TimeoutError:
                    await working.beat("working")

        await working.beat("working")  # its first beat is in
        beating = asyncio.ensure_future(at_work())
        try:
            assert await s.recover("me", retry=False) == 3  # the gone member's and the older run's
            assert s.at_work == ("working",)
            c = await s.counts()
            assert (c.claimed, c.uncertain) == (2, 3)
        finally:
            # Stopped, not cancelled: a cancelled beat's write, in the store's thread, could land
            # after the next resume's first look and read as the member beating on.
            stop.set()
            await beating
        # It stops beating (killed): the next resume watches it go, and takes its jobs.
        assert await s.recover("me", retry=False) == 2 and s.at_work == ()
        c = await s.counts()
        assert (c.claimed, c.uncertain) == (0, 5)
        await working.leave("working")  # a clean stop: nothing left to watch
        with sqlite3.connect(path) as con:
            assert con.execute("SELECT count(*) FROM members").fetchone()[0] == 0
        await s.close()
        await working.close()

    run(scenario())


def test_recover_waits_for_no_one_who_stopped_cleanly(tmp_path, monkeypatch):
    """A run that stopped cleanly left (`leave`): a resume right after it does not watch it."""

    async def scenario() -> None:
        path = str(tmp_path / "w.db")
        s = SqliteStore.open(path)
        await s.enqueue([{"job": 1}])
        (job,) = await s.claim("stopped", 1)
        await s.beat("stopped")
        await s.leave("stopped")
        watched: list[float] = []
        real_sleep = asyncio.sleep

        async def counted(delay):
            watched.append(delay)
            await real_sleep(0)

        monkeypatch.setattr(asyncio, "sleep", counted)
        await s.recover("me", retry=False)
        monkeypatch.undo()
        assert watched == [] and s.at_work == ()
        assert (await s.counts()).pending == 1  # never marked sending: back as it was
        await s.close()

    run(scenario())


def test_windows_are_kept_per_key_and_replaced(tmp_path):
    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        assert await s.load_windows() == {}
        await s.save_windows("m", {"3f9a1c": [100.0, 100.5], "k2": []})
        await s.save_windows("m", {"3f9a1c": [101.25]})
        await s.close()
        s = SqliteStore.open(str(tmp_path / "w.db"))  # durable: a new process reads them
        kept = await s.load_windows()
        assert kept["3f9a1c"][1] == [101.25] and kept["k2"][1] == []
        await s.close()

    run(scenario())


def test_enqueue_is_all_or_nothing(tmp_path):
    path = tmp_path / "w.db"
    run(SqliteStore.open(str(path)).close())
    with sqlite3.connect(path) as con:  # the third insert fails inside the transaction
        con.execute(
            "CREATE TRIGGER fail_third BEFORE INSERT ON jobs WHEN (SELECT count(*) FROM jobs) = 2"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
    con.close()

    async def scenario() -> None:
        s = SqliteStore.open(str(path))
        with pytest.raises(StoreError, match="disk trouble"):
            await s.enqueue([{"job": i} for i in range(5)])
        assert (await s.counts()).total == 0
        await s.close()

    run(scenario())


def test_the_file_is_wal_with_full_sync(tmp_path):
    s = SqliteStore.open(str(tmp_path / "w.db"))
    db = s._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: every commit fsync'd
    run(s.close())


_KILLED_CHILD = """
import asyncio, os, signal, sys
from ratedeck.core.vocab import Ending
from ratedeck.store import Finished
from ratedeck.store.sqlite import SqliteStore

async def main():
    s = SqliteStore.open(sys.argv[1])
    await s.enqueue([{"job": i} for i in range(10)])
    jobs = await s.claim("child", 4)
    await s.finish("child", [
        Finished(jobs[0].id, Ending.SUCCEEDED, 1),
        Finished(jobs[1].id, Ending.GRAVEYARD, 5, {"ending": "graveyard", "params": {"job": 1}}),
    ])
    print("journaled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no checkpoint

asyncio.run(main())
"""


@pytest.mark.slow
def test_what_finish_returned_from_survives_a_kill_9(tmp_path):
    path = tmp_path / "w.db"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL and "journaled" in proc.stdout, proc.stderr

    async def scenario() -> None:
        s = SqliteStore.open(str(path))
        c = await s.counts()
        assert (c.pending, c.claimed, dict(c.done)) == (6, 2, {"succeeded": 1, "graveyard": 1})
        assert await s.graveyard_lines() == [{"ending": "graveyard", "params": {"job": 1}}]
        await s.close()

    run(scenario())


# ---------------------------------------------------------------- what is refused


def test_a_store_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "w.db"
    run(SqliteStore.open(str(path)).close())
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")
    con.close()
    with pytest.raises(StoreError, match="store schema 99"):
        SqliteStore.open(str(path))


def test_a_damaged_store_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "w.db"

    async def fill() -> None:
        s = SqliteStore.open(str(path))
        await s.enqueue([{"job": i, "pad": "x" * 200} for i in range(200)])
        await s.close()

    run(fill())
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(path.read_bytes())
    data[4096:12288] = bytes(range(256)) * 32  # the header stays, pages after it are garbage
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="left as it is"):
        SqliteStore.open(str(path))
    assert path.read_bytes() == bytes(data)


@pytest.mark.parametrize(
    "url,problem",
    [
        ("sqlite:{tmp}/missing/w.db", "no such directory"),
        ("sqlite:{tmp}", "is a directory"),
        ("sqlite:", "needs a file path"),
        ("mysql://x/1", "not a store"),
        ("sqlite:/proc/w.db", "cannot open"),  # no file can be made there, not even by root
    ],
)
def test_open_store_says_what_is_wrong(tmp_path, url, problem):
    with pytest.raises(StoreError, match=problem):
        open_store(url.format(tmp=tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_directory_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(StoreError, match="cannot create files in"):
        open_store(f"sqlite:{locked / 'w.db'}")


def test_memory_is_no_store_at_all():
    assert open_store("memory") is None


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "w.db"
    Path(path).touch()
    s = SqliteStore.open(str(path))
    assert run(s.counts()).total == 0
    run(s.close())


def test_a_claim_cut_short_by_the_stop_is_still_given_back(tmp_path):
    """The run stops while a claim is under way: the jobs it claimed are released, not left
    claimed (a later --resume would have called them uncertain though never sent)."""
    from ratedeck.store.work import StoreWorkload

    async def scenario() -> None:
        store = SqliteStore.open(str(tmp_path / "w.db"))
        await store.enqueue([{"job": i} for i in range(5)])
        let_go = asyncio.Event()

        class SlowClaims:
            async def claim(self, member: str, n: int):
                await let_go.wait()
                return await store.claim(member, n)

        source = StoreWorkload(SlowClaims(), "m", 10.0, batch=3, idempotent=False)
        refill = asyncio.ensure_future(source.refill())
        await asyncio.sleep(0.01)
        refill.cancel()  # the engine's stop cancels the source task mid-claim
        let_go.set()
        ids = await source.unsent_of(set())
        assert len(ids) == 3
        await store.release("m", ids)
        assert (await store.counts()).pending == 5
        await store.close()

    run(scenario())


def test_a_burst_key_s_lost_sends_count_the_slots_its_window_freed_after_the_last_save():
    """A key that sent in bursts and saved a full window just before its sends left it may
    have sent a whole new burst before the kill: those count, at the latest the kill can
    have come (a save a second late on a busy machine, never after the resume)."""
    from ratedeck.store.work import LATE_SAVE_S, last_sends

    saved_at = 1000.0
    times = [saved_at - 2.95] * 60  # a burst of 60, the whole of 60/3s, about to leave the window
    kept = {"k": (saved_at, times)}
    sends = last_sends(kept, saved_at + 30, {"k": [(60, 3.0)]})["k"]
    late = [t for t in sends if t > saved_at]
    assert len(late) == 60 and set(late) == {saved_at + LATE_SAVE_S}  # the freed window, spent again
    soon = last_sends(kept, saved_at + 0.03, {"k": [(60, 3.0)]})["k"]
    assert set(t for t in soon if t > saved_at) == {saved_at + 0.03}  # never after the resume
    assert len(soon) == 60 + 1  # by then the old burst is still in the window: the pace's one
    even = last_sends(kept, saved_at + 30)["k"]  # evenly paced: two ticks' share of its last second
    assert len(even) == 61


def test_a_run_on_the_store_starts_each_key_from_the_last_run_s_window(tmp_path):
    """The journal keeps each key's last sends; the next run's limiter starts from them, with
    what the dead run may have sent after its last save: its first send waits for the window
    the server still counts, instead of drawing a 429."""
    import time

    from ratedeck.config import load_config
    from ratedeck.core.secrets import fingerprint
    from ratedeck.engine.engine import Engine
    from ratedeck.engine.http.transport import http_transport
    from ratedeck.store.work import FLUSH_EVERY_S, last_sends

    secrets = ["first-key-0123456789", "second-key-0123456789"]
    cfg = load_config(
        overrides={
            "target": {"url": "http://127.0.0.1:9/x"},
            "keys": {"secrets": secrets, "limits": ["20/1s"]},
            "engine": {"headroom": 0},
        }
    )

    async def scenario() -> None:
        dead = Engine(cfg, http_transport(cfg.engine_settings, "http://127.0.0.1:9/x"))
        wall = time.time()
        for i in range(18):  # the dead run: 18 sends of k1 in its last 0.6 s
            dead.parts.keys.workers[0].limiter.record(dead.parts.run.clock() - 0.6 + i * 0.03)
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.save_windows("dead", dead.parts.keys.recent_sends())
        kept = await s.load_windows()
        await s.close()
        first = fingerprint(secrets[0])
        assert set(kept) == {first, fingerprint(secrets[1])} and len(kept[first][1]) == 18
        sends = last_sends(kept, wall)
        assert len(sends[first]) > 18 and fingerprint(secrets[1]) not in sends  # it sent nothing
        fresh = Engine(cfg, http_transport(cfg.engine_settings, "http://127.0.0.1:9/x"))
        seeded_wall = time.time()  # a slow machine may be well past `wall` by now
        assert fresh.parts.keys.seed_sends(sends) == len(sends[first])
        now = fresh.parts.run.clock()
        k1, k2 = fresh.parts.keys.workers
        oldest = min(kept[first][1])
        # k1 has no room until the dead run's oldest send leaves the server's window
        assert k1.next_free(now) >= now + (oldest + 1.0 - seeded_wall) - 0.01
        assert k1.limiter.used(now)[0] >= 20  # full: 18 kept plus the sends it may have made after
        assert k2.next_free(now) <= now + 1e-6  # the key the dead run did not use is free
        assert FLUSH_EVERY_S <= 0.1

    run(scenario())


def test_a_live_run_s_uncertain_ending_is_journaled_as_uncertain(tmp_path):
    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.enqueue([{"job": i} for i in range(3)])
        jobs = await s.claim("me", 3)
        await s.mark_sending("me", [j.id for j in jobs])
        await s.finish(
            "me",
            [
                Finished(jobs[0].id, Ending.SUCCEEDED, 1),
                Finished(jobs[1].id, Ending.UNCERTAIN, 1),
                Finished(jobs[2].id, Ending.SHED, 0),
            ],
        )
        c = await s.counts()
        assert (c.claimed, c.uncertain, dict(c.done)) == (0, 1, {"succeeded": 1, "shed": 1})
        assert c.total == 3
        await s.close()

    run(scenario())


@pytest.mark.parametrize(
    ("target", "retried"),
    [({}, False), ({"idempotency": True}, True), ({"safe_writes": True}, True)],
)
def test_resume_sends_a_killed_run_s_jobs_again_where_a_repeat_does_nothing_twice(tmp_path, target, retried):
    """An LLM prompt (`target.safe_writes`) a killed run may have sent: its answer went with the run,
    so --resume sends it again; a plain POST stays uncertain (a repeat could write twice)."""
    import random

    from ratedeck.config import load_config
    from ratedeck.store.work import StoreRun

    async def scenario() -> None:
        path = str(tmp_path / "w.db")
        s = SqliteStore.open(path)
        await s.enqueue([{"job": i} for i in range(3)])
        dead = await s.claim("dead", 3)
        await s.mark_sending("dead", [j.id for j in dead])
        await s.close()
        cfg = load_config(
            overrides={
                "target": {"url": "http://127.0.0.1:9/x", "method": "POST", **target},
                "keys": {"secrets": ["first-key-0123456789"], "limits": ["20/1s"]},
                "run": {"store": f"sqlite:{path}", "resume": True},
            }
        )
        store = SqliteStore.open(path)
        run_ = StoreRun(cfg.runner, cfg.engine_settings, store, random.Random(1))
        await run_.prepare()
        c = await store.counts()
        assert run_.recovered == 3
        assert (c.pending, c.uncertain) == ((3, 0) if retried else (0, 3))
        await store.close()

    run(scenario())


def test_a_stop_during_a_mark_still_gives_the_job_back(tmp_path):
    """The run stopped while a job's `sending` mark was being written (the write finishes in its
    thread, the source's task is cancelled): the request was made but queued nowhere, and the
    give-back at the end must still name its job, or it stays "in flight" (seen once in CI)."""
    import types

    from ratedeck.engine.request import Request
    from ratedeck.store.work import StoreWorkload

    async def scenario() -> None:
        s = SqliteStore.open(str(tmp_path / "w.db"))
        await s.enqueue([{"job": i} for i in range(3)])
        source = StoreWorkload(s, "me", 10.0, batch=3, idempotent=False)
        assert await source.refill()
        item = next(source.items)
        req = Request(1, 0.0, float("inf"), item)
        source.made(req)
        marked = asyncio.Event()
        real = s.mark_sending

        async def slow_mark(member, ids):
            await real(member, ids)  # written...
            marked.set()
            await asyncio.Event().wait()  # ...and the stop cancels the task before it returns

        s.mark_sending = slow_mark  # type: ignore[method-assign]
        sink = types.SimpleNamespace(
            live_capacity=lambda now: 10.0,
            clock=lambda: 0.0,
            queue_max=100,
            queues=types.SimpleNamespace(fresh=lambda: 0),
            problem=lambda text: None,
            stopping=False,
        )
        task = asyncio.ensure_future(source.before_submit(req, sink))
        await marked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        back = await source.unsent_of(set())
        assert source.jobs == {} and sorted(back) == [1, 2, 3]
        await s.release("me", back)
        c = await s.counts()
        assert (c.pending, c.claimed) == (3, 0)
        await s.close()

    run(scenario())
