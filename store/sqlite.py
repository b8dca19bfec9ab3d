"""`--store sqlite:PATH`: jobs and their endings in one SQLite file, durable on one machine.

Durability: WAL journal with `synchronous=FULL`, so every commit (an
enqueue, a claim, a batch of endings) is fsync'd to the WAL before the call
returns. NORMAL would survive `kill -9` too (the WAL sits in the OS cache)
but not a power cut; the journal commits a batch a tick (10 a second at
most, `store.work`), so the fsync costs nothing that shows.

SQLite calls block, so they run on one thread of their own (`_run`): the
engine's loop never waits for a disk. The same file may be worked by several
processes on one machine; a claim is one `BEGIN IMMEDIATE` transaction.

A file that is not ours (random bytes, another program's database, a newer
schema) is refused and never written to.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ratedeck.core.files import private_open

from .base import BEAT_S, GONE_S, Finished, Job, StoreCounts, StoreError, WorkStore

APP = "ratedeck-store"
SCHEMA = 1
_HEADER = b"SQLite format 3\x00"

_CREATE = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    item TEXT NOT NULL,              -- the workload line, as JSON
    state TEXT NOT NULL DEFAULT 'pending',  -- pending | claimed | sending | done | uncertain
    member TEXT,                     -- who claimed it (state claimed)
    claims INTEGER NOT NULL DEFAULT 0,
    uncertain INTEGER NOT NULL DEFAULT 0,   -- an earlier claim may have sent it
    ending TEXT,                     -- state done: succeeded | expired | graveyard | shed
    attempts INTEGER NOT NULL DEFAULT 0     -- sends in the claim that ended it
);
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE TABLE graveyard (seq INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, record TEXT NOT NULL);
"""
#: Each key's last sends (added to schema 1 stores as they are opened: a table more, nothing changed).
_WINDOWS = """CREATE TABLE IF NOT EXISTS windows (
    key TEXT PRIMARY KEY,            -- the key's fingerprint (or label): never the secret
    saved_at REAL NOT NULL,          -- Unix time of the write
    times TEXT NOT NULL              -- JSON list of Unix send times in its last window
)"""
#: Each run at work on the store, and how often and when it last said so (`beat`; added as the
#: windows were: a table more, nothing changed).
_MEMBERS = """CREATE TABLE IF NOT EXISTS members (
    member TEXT PRIMARY KEY,
    beats INTEGER NOT NULL,
    at REAL NOT NULL                 -- Unix time of the last beat, by the member's clock
)"""

T = TypeVar("T")


class SqliteStore(WorkStore):
    """A `WorkStore` in one SQLite file (see the module doc for what it promises)."""

    def __init__(self, path: str, db: sqlite3.Connection, store_id: str):
        self.url = f"sqlite:{path}"
        self.path = path
        self.store_id = store_id
        self._db = db
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratedeck-sqlite")

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str) -> SqliteStore:
        """Open (or create) the store at `path`; `StoreError` when it cannot be ours."""
        if not path:
            raise StoreError("needs a file path, like sqlite:run.db")
        p = Path(path)
        if p.is_dir():
            raise StoreError("is a directory")
        if p.exists():
            _check_header(p)
            if not os.access(p, os.R_OK | os.W_OK):
                raise StoreError("not readable and writable")
            new = p.stat().st_size == 0
        else:
            parent = p.parent
            if not parent.is_dir():
                raise StoreError(f"no such directory {parent}")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise StoreError(f"cannot create files in {parent}")
            new = True
            try:  # made 0600 here: SQLite gives its -wal, -shm and -journal files the same mode
                private_open(p, "ab").close()
            except OSError as exc:
                raise StoreError(f"cannot open: {exc.strerror or exc}") from None
        try:
            db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open: {exc}") from None
        try:
            store_id = _prepare(db, new)
        except BaseException:
            db.close()
            raise
        return cls(path, db, store_id)

    # ------------------------------------------------------------ the contract
    async def enqueue(self, items: Sequence[Mapping[str, Any]]) -> int:
        def write() -> int:
            rows = ((json.dumps(dict(item), separators=(",", ":")),) for item in items)  # one at a time
            with _transaction(self._db):
                self._db.executemany("INSERT INTO jobs (item) VALUES (?)", rows)
            return len(items)

        return await self._run(write)

    async def claim(self, member: str, n: int) -> list[Job]:
        def take() -> list[Job]:
            with _transaction(self._db):
                rows = self._db.execute(
                    "UPDATE jobs SET state = 'claimed', member = ?, claims = claims + 1"
                    " WHERE id IN (SELECT id FROM jobs WHERE state = 'pending' ORDER BY id LIMIT ?)"
                    " RETURNING id, item, claims, uncertain",
                    (member, n),
                ).fetchall()
            jobs = [
                Job(i, json.loads(item), f"{self.store_id}-{i}", claims - 1, bool(unsure))
                for i, item, claims, unsure in rows
            ]
            return sorted(jobs, key=lambda job: job.id)

        return await self._run(take) if n > 0 else []

    async def finish(self, member: str, endings: Sequence[Finished]) -> None:
        done = [(str(f.ending), f.attempts, f.job_id, member) for f in endings]
        buried = [
            (f.job_id, json.dumps(dict(f.record), default=str)) for f in endings if f.record is not None
        ]

        def write() -> None:
            with _transaction(self._db):
                # A live run's write that may have happened is uncertain, like a killed run's.
                self._db.executemany(
                    "UPDATE jobs SET state = CASE WHEN ?1 = 'uncertain' THEN 'uncertain' ELSE 'done' END,"
                    " ending = ?1, attempts = ?2, member = NULL"
                    " WHERE id = ?3 AND member = ?4 AND state IN ('claimed', 'sending')",
                    done,
                )
                self._db.executemany("INSERT INTO graveyard (job_id, record) VALUES (?, ?)", buried)

        if endings:
            await self._run(write)

    async def release(self, member: str, job_ids: Sequence[int]) -> None:
        rows = [(i, member) for i in job_ids]

        def write() -> None:
            with _transaction(self._db):
                self._db.executemany(
                    "UPDATE jobs SET state = 'pending', member = NULL, claims = claims - 1"
                    " WHERE id = ? AND member = ? AND state IN ('claimed', 'sending')",
                    rows,
                )

        if rows:
            await self._run(write)

    async def mark_sending(self, member: str, job_ids: Sequence[int]) -> None:
        rows = [(i, member) for i in job_ids]

        def write() -> None:
            with _transaction(self._db):
                self._db.executemany(
                    "UPDATE jobs SET state = 'sending' WHERE id = ? AND member = ? AND state = 'claimed'",
                    rows,
                )

        if rows:
            await self._run(write)

    async def recover(self, member: str, *, retry: bool) -> int:
        """A dead member's jobs: never marked sending, pending again as they were (not counted);
        marked, pending and uncertain with `retry`, else uncertain. Returns how many were marked.

        A member that beat in the last `GONE_S` is watched until it beats again (at work: its
        jobs are left to it, `at_work`) or that long has passed since its last beat (gone). A
        member that never beat (a run of an older ratedeck) counts as gone, as before."""
        state = "pending" if retry else "uncertain"
        working = await self._members_at_work(member)
        self.at_work = tuple(working)
        skip = ",".join("?" * len(working))

        def write() -> int:
            with _transaction(self._db):
                self._db.execute(
                    "UPDATE jobs SET state = 'pending', member = NULL, claims = claims - 1"
                    f" WHERE state = 'claimed' AND member IS NOT ? AND member NOT IN ({skip})",
                    (member, *working),
                )
                cur = self._db.execute(
                    "UPDATE jobs SET state = ?, uncertain = 1, member = NULL"
                    f" WHERE state = 'sending' AND member IS NOT ? AND member NOT IN ({skip})",
                    (state, member, *working),
                )
                self._db.execute(  # the gone: no beat for `GONE_S` (a member between claims beats on)
                    f"DELETE FROM members WHERE member IS NOT ? AND member NOT IN ({skip}) AND at < ?",
                    (member, *working, time.time() - GONE_S),
                )
            return cur.rowcount

        return await self._run(write)

    async def _members_at_work(self, member: str) -> list[str]:
        """The members other than `member` that beat lately and beat again while watched (every
        half `BEAT_S`, up to `GONE_S`; no wait when none beat lately). A member holding no job
        now is watched too: between two claims, it may claim before this resume writes."""

        def read() -> dict[str, tuple[int, float]]:
            rows = self._db.execute(
                "SELECT member, beats, at FROM members WHERE member IS NOT ?", (member,)
            ).fetchall()
            return {m: (int(beats), float(at)) for m, beats, at in rows}

        first = await self._run(read)
        started = time.time()
        # A member that beat lately (by its clock: the same machine's, for a file) is watched
        # for `GONE_S` from now by ours.
        watched = {m: beats for m, (beats, at) in first.items() if started - at < GONE_S}
        working: list[str] = []
        while watched and time.time() - started < GONE_S:
            await asyncio.sleep(BEAT_S / 2)
            now = await self._run(read)
            for m, beats in list(watched.items()):
                if m in now and now[m][0] != beats:
                    working.append(m)
                    del watched[m]
        return working

    async def beat(self, member: str) -> None:
        def write() -> None:
            with _transaction(self._db):
                self._db.execute(
                    "INSERT INTO members (member, beats, at) VALUES (?, 1, ?)"
                    " ON CONFLICT (member) DO UPDATE SET beats = beats + 1, at = excluded.at",
                    (member, time.time()),
                )

        await self._run(write)

    async def leave(self, member: str) -> None:
        def write() -> None:
            with _transaction(self._db):
                self._db.execute("DELETE FROM members WHERE member = ?", (member,))

        await self._run(write)

    async def save_windows(self, member: str, windows: Mapping[str, Sequence[float]]) -> None:
        now = time.time()
        rows = [(key, now, json.dumps([round(t, 4) for t in times])) for key, times in windows.items()]

        def write() -> None:
            with _transaction(self._db):
                self._db.executemany(
                    "INSERT INTO windows (key, saved_at, times) VALUES (?, ?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET saved_at = excluded.saved_at, times = excluded.times",
                    rows,
                )

        if rows:
            await self._run(write)

    async def load_windows(self) -> dict[str, tuple[float, list[float]]]:
        def read() -> dict[str, tuple[float, list[float]]]:
            rows = self._db.execute("SELECT key, saved_at, times FROM windows").fetchall()
            return {key: (float(at), [float(t) for t in json.loads(times)]) for key, at, times in rows}

        return await self._run(read)

    async def counts(self) -> StoreCounts:
        def read() -> StoreCounts:
            rows = self._db.execute(
                "SELECT state, coalesce(ending, ''), count(*) FROM jobs GROUP BY state, ending"
            ).fetchall()
            by_state: dict[str, int] = {}
            done: dict[str, int] = {}
            for state, ending, count in rows:
                by_state[state] = by_state.get(state, 0) + count
                if state == "done":
                    done[ending] = count
            return StoreCounts(
                pending=by_state.get("pending", 0),
                claimed=by_state.get("claimed", 0) + by_state.get("sending", 0),
                uncertain=by_state.get("uncertain", 0),
                done=done,
            )

        return await self._run(read)

    async def graveyard_lines(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            rows = self._db.execute("SELECT record FROM graveyard ORDER BY seq").fetchall()
            return [json.loads(r) for (r,) in rows]

        return await self._run(read)

    async def close(self) -> None:
        await self._run(self._db.close)
        self._thread.shutdown(wait=True)

    def close_now(self) -> None:
        """Close at once (a store opened only to make or check it: the gateway's batches)."""
        self._db.close()
        self._thread.shutdown(wait=True)

    async def _run(self, fn: Callable[[], T]) -> T:
        """`fn` on the store's own thread; a SQLite failure is a `StoreError` naming the file."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from None


class _transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, or `ROLLBACK` on any error: all or nothing."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _check_header(p: Path) -> None:
    """Refuse a non-empty file that is not a SQLite database, before SQLite touches it."""
    try:
        with p.open("rb") as fh:
            head = fh.read(len(_HEADER))
    except OSError as exc:
        raise StoreError(f"cannot read: {exc.strerror or exc}") from None
    if head and head != _HEADER:
        raise StoreError("not a SQLite database (left as it is)")


def _prepare(db: sqlite3.Connection, new: bool) -> str:
    """Check (or, for a new file, create) the schema; the store's id. Nothing is written to a
    file that is not a ratedeck store."""
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and new:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
            store_id = uuid.uuid4().hex[:12]
            with _transaction(db):
                for statement in _CREATE.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?)",
                    [("app", APP), ("schema", str(SCHEMA)), ("store_id", store_id)],
                )
                db.execute(_WINDOWS)
                db.execute(_MEMBERS)
            return store_id
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall()) if "meta" in tables else {}
        if meta.get("app") != APP:
            shown = ", ".join(sorted(tables)) or "none"
            raise StoreError(f"a SQLite database, but not a ratedeck store (tables: {shown}); left as it is")
        if meta.get("schema") != str(SCHEMA):
            raise StoreError(f"store schema {meta.get('schema')}, this ratedeck reads {SCHEMA}")
        if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise StoreError("the database is damaged (PRAGMA quick_check failed); left as it is")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        db.execute(_WINDOWS)
        db.execute(_MEMBERS)
        return str(meta["store_id"])
    except sqlite3.OperationalError as exc:  # cannot open, create or lock the file
        raise StoreError(f"cannot use the file: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"not a usable SQLite database ({exc}); left as it is") from None
