"""Where the gateway's batches live: in memory, in the run's SQLite store file (`--store
sqlite:PATH`), or in Redis (`--store redis://...`), where several gateways serve the same batches.

A line's output record is written once (`record_line` is an insert that keeps the first):
a gateway killed and started again re-sends only lines with no record, and no `custom_id`
is answered twice in an output file. Everything a client sent or got back is kept only
here: in memory, in the store file the user named (made 0600 here), or in the Redis it named.

Claims (`claim`, `renew`, `release`, `finalize`) say which gateway sends a line and which one
writes a batch's output: in memory and SQLite one gateway holds the store, so every claim is
granted at no cost (`shared` is False); in Redis a claim is a key with a time to live that its
gateway renews while the line is in flight, so a gateway that died leaves its lines to others.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from typing import Any, Protocol

from ratedeck.core.files import private_open
from ratedeck.core.secrets import safe_url
from ratedeck.store.base import StoreError

from .records import FINAL, Batch, Counts, StoredFile


class BatchStore(Protocol):
    """Files, batches and the lines' records. Calls are quick and local (memory, SQLite, a
    Redis nearby: each call O(1) round trips)."""

    #: Whether other gateways serve the same batches (claims mean something; the runner renews
    #: them, watches the batches' status and looks for batches it does not run).
    shared: bool

    def put_file(self, f: StoredFile) -> None: ...

    def get_file(self, file_id: str) -> StoredFile | None: ...

    def delete_file(self, file_id: str) -> bool: ...

    def list_files(self) -> list[StoredFile]: ...

    def put_batch(self, batch: Batch) -> None: ...

    def get_batch(self, batch_id: str) -> Batch | None: ...

    def list_batches(self, api: str) -> list[Batch]: ...

    def record_line(self, batch_id: str, index: int, record: dict[str, Any], kind: str) -> bool:
        """Keep line `index`'s output record (`kind`: ok, failed, cancelled, expired); False when it
        had one already (the first is kept)."""
        ...

    def done_lines(self, batch_id: str) -> set[int]: ...

    def counts(self, batch_id: str) -> Counts: ...

    def records(self, batch_id: str) -> list[tuple[dict[str, Any], str]]:
        """Every line's record and kind, in the input's order."""
        ...

    def open_batches(self) -> list[str]:
        """The ids of the batches not final (both APIs)."""
        ...

    def claim(self, batch_id: str, index: int, owner: str, ttl_s: float) -> bool:
        """Whether `owner` may send line `index`: it has no record and no other owner's claim
        that is alive (then it is `owner`'s for `ttl_s`)."""
        ...

    def renew(self, batch_id: str, indices: list[int], owner: str, ttl_s: float) -> None:
        """`owner`'s claims of these lines (those it still holds) live `ttl_s` more."""
        ...

    def release(self, batch_id: str, index: int, owner: str) -> None:
        """`owner` gives up its claim of line `index` (it was not sent)."""
        ...

    def finalize(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        """Whether `owner` writes the batch's output and final status: True for one gateway
        (another takes it only when `ttl_s` passed and the batch is still not final)."""
        ...

    def close(self) -> None: ...


_KINDS = ("ok", "failed", "cancelled", "expired")


def _counts(kinds: list[str]) -> Counts:
    return Counts(
        done=len(kinds),
        failed=kinds.count("failed"),
        cancelled=kinds.count("cancelled"),
        expired=kinds.count("expired"),
    )


class _OneGateway:
    """Claims in a store only one gateway holds: every one granted."""

    shared = False

    def claim(self, batch_id: str, index: int, owner: str, ttl_s: float) -> bool:
        return True

    def renew(self, batch_id: str, indices: list[int], owner: str, ttl_s: float) -> None:
        pass

    def release(self, batch_id: str, index: int, owner: str) -> None:
        pass

    def finalize(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        return True


class MemoryBatchStore(_OneGateway):
    """The batches of a gateway with no store: gone when it stops."""

    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}
        self.lines: dict[str, dict[int, tuple[dict[str, Any], str]]] = {}

    def put_file(self, f: StoredFile) -> None:
        self.files[f.id] = f

    def get_file(self, file_id: str) -> StoredFile | None:
        return self.files.get(file_id)

    def delete_file(self, file_id: str) -> bool:
        return self.files.pop(file_id, None) is not None

    def list_files(self) -> list[StoredFile]:
        return sorted(self.files.values(), key=lambda f: f.created_at)

    def put_batch(self, batch: Batch) -> None:
        self.batches[batch.id] = Batch.from_doc(batch.to_doc())  # a copy: the caller's may change

    def get_batch(self, batch_id: str) -> Batch | None:
        got = self.batches.get(batch_id)
        return Batch.from_doc(got.to_doc()) if got is not None else None

    def list_batches(self, api: str) -> list[Batch]:
        return [Batch.from_doc(b.to_doc()) for b in self.batches.values() if b.api == api]

    def record_line(self, batch_id: str, index: int, record: dict[str, Any], kind: str) -> bool:
        lines = self.lines.setdefault(batch_id, {})
        if index in lines:
            return False
        lines[index] = (record, kind)
        return True

    def done_lines(self, batch_id: str) -> set[int]:
        return set(self.lines.get(batch_id, {}))

    def counts(self, batch_id: str) -> Counts:
        return _counts([kind for _, kind in self.lines.get(batch_id, {}).values()])

    def records(self, batch_id: str) -> list[tuple[dict[str, Any], str]]:
        lines = self.lines.get(batch_id, {})
        return [lines[i] for i in sorted(lines)]

    def open_batches(self) -> list[str]:
        return [b.id for b in self.batches.values() if b.status not in FINAL]

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS gateway_files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    created_at INTEGER NOT NULL, client TEXT NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS gateway_batches (id TEXT PRIMARY KEY, api TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gateway_lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (batch_id, idx));
"""


class SqliteBatchStore(_OneGateway):
    """The batches in the run's SQLite store file (its own tables beside the work store's).

    Every write is its own transaction, committed before the call returns (the store's
    `synchronous = FULL`): a line recorded is a line a SIGKILL does not lose. One gateway
    holds the file (claims are all granted)."""

    def __init__(self, path: str) -> None:
        if not os.path.exists(path):  # made 0600: SQLite gives its -wal and -shm files the same mode
            private_open(path, "ab").close()
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.executescript(_SCHEMA)

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    def put_file(self, f: StoredFile) -> None:
        self._run(
            "INSERT OR REPLACE INTO gateway_files VALUES (?, ?, ?, ?, ?, ?)",
            (f.id, f.filename, f.purpose, f.created_at, f.client, f.content),
        )

    def get_file(self, file_id: str) -> StoredFile | None:
        row = self._run(
            "SELECT id, filename, purpose, created_at, content, client FROM gateway_files WHERE id = ?",
            (file_id,),
        ).fetchone()
        return StoredFile(*row) if row is not None else None

    def delete_file(self, file_id: str) -> bool:
        return self._run("DELETE FROM gateway_files WHERE id = ?", (file_id,)).rowcount > 0

    def list_files(self) -> list[StoredFile]:
        rows = self._run(
            "SELECT id, filename, purpose, created_at, content, client FROM gateway_files ORDER BY created_at"
        ).fetchall()
        return [StoredFile(*row) for row in rows]

    def put_batch(self, batch: Batch) -> None:
        self._run(
            "INSERT OR REPLACE INTO gateway_batches VALUES (?, ?, ?)",
            (batch.id, batch.api, json.dumps(batch.to_doc())),
        )

    def get_batch(self, batch_id: str) -> Batch | None:
        row = self._run("SELECT doc FROM gateway_batches WHERE id = ?", (batch_id,)).fetchone()
        return Batch.from_doc(json.loads(row[0])) if row is not None else None

    def list_batches(self, api: str) -> list[Batch]:
        rows = self._run("SELECT doc FROM gateway_batches WHERE api = ?", (api,)).fetchall()
        return [Batch.from_doc(json.loads(r[0])) for r in rows]

    def record_line(self, batch_id: str, index: int, record: dict[str, Any], kind: str) -> bool:
        cur = self._run(
            "INSERT OR IGNORE INTO gateway_lines VALUES (?, ?, ?, ?)",
            (batch_id, index, kind, json.dumps(record, ensure_ascii=False)),
        )
        return cur.rowcount > 0

    def done_lines(self, batch_id: str) -> set[int]:
        return {r[0] for r in self._run("SELECT idx FROM gateway_lines WHERE batch_id = ?", (batch_id,))}

    def counts(self, batch_id: str) -> Counts:
        rows = self._run(
            "SELECT kind, COUNT(*) FROM gateway_lines WHERE batch_id = ? GROUP BY kind", (batch_id,)
        ).fetchall()
        by = dict(rows)
        return Counts(
            done=sum(by.values()),
            failed=by.get("failed", 0),
            cancelled=by.get("cancelled", 0),
            expired=by.get("expired", 0),
        )

    def records(self, batch_id: str) -> list[tuple[dict[str, Any], str]]:
        rows = self._run(
            "SELECT record, kind FROM gateway_lines WHERE batch_id = ? ORDER BY idx", (batch_id,)
        ).fetchall()
        return [(json.loads(r), k) for r, k in rows]

    def open_batches(self) -> list[str]:
        rows = self._run("SELECT doc FROM gateway_batches").fetchall()
        docs = [json.loads(r[0]) for r in rows]
        return [d["id"] for d in docs if d.get("status") not in FINAL]

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ---------------------------------------------------------------- Redis
#: A line's claim, or a batch's finalize lock, taken by ARGV[1] for ARGV[2] ms unless another
#: owner holds it alive (or, with KEYS[2], the line has a record: field ARGV[3] of that hash).
_TAKE = """
if KEYS[2] and redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
#: ARGV[1]'s claims among KEYS live ARGV[2] ms more.
_RENEW = """
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then redis.call('PEXPIRE', k, ARGV[2]) end
end
return 0
"""
#: ARGV[1] gives up its claim KEYS[1].
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
#: Line ARGV[1]'s record ARGV[2] (kind ARGV[3]) kept in KEYS[1] unless it has one, its count in
#: KEYS[2] with it (one never without the other), its claim KEYS[3] gone.
_RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], 'done', 1)
if ARGV[3] ~= 'ok' then redis.call('HINCRBY', KEYS[2], ARGV[3], 1) end
redis.call('DEL', KEYS[3])
return 1
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class _SyncScript:
    """A Lua script by its SHA, sent whole to a server that does not know it yet."""

    def __init__(self, client: Any, text: str) -> None:
        import hashlib

        self.client = client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import NoScriptError

        try:
            return self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.client.eval(self.text, len(keys), *keys, *args)


class RedisBatchStore:
    """The batches in Redis, shared by every gateway on the same server and namespace.

    Keys under `<ns>:gateway:` (`ns` "ratedeck", as the work store's): a file is a hash
    (`{f:ID}`: its fields and content), indexed by `files` (a sorted set by creation); a batch
    is a JSON document (`{b:ID}:doc`) indexed by `batches:<api>` (sorted by creation) and, while
    not final, by `open`; its lines' records are a hash (`{b:ID}:lines`, index -> [kind, record],
    set once), counted by kind in `{b:ID}:counts` in the same script; a line's claim is
    `{b:ID}:claim:<index>` (its owner, with a time to live), the finalize lock `{b:ID}:final`.
    A batch's keys share one hash tag (one slot of a Cluster: its scripts touch one node).
    """

    shared = True

    def __init__(self, url: str, *, namespace: str = "ratedeck") -> None:
        from ratedeck.store.redis_shared import (
            cluster_nodes,
            connect,
            is_cluster,
            is_store_failure,
            unavailable,
        )

        self.url = safe_url(url) or "redis"
        self.p = f"{namespace}:gateway:"
        self._cluster = is_cluster(url)
        if self._cluster:
            cluster_nodes(url)  # a bad URL: StoreError before any connection
        try:
            self.r = connect(url, sync=True)
            self.r.ping()
        except Exception as exc:
            if isinstance(exc, StoreError) or not is_store_failure(exc):
                raise
            raise StoreError(f"Redis did not answer ({unavailable(exc)})") from None
        self._take = _SyncScript(self.r, _TAKE)
        self._renew = _SyncScript(self.r, _RENEW)
        self._release = _SyncScript(self.r, _RELEASE)
        self._record = _SyncScript(self.r, _RECORD)

    # ---- key names
    def _file(self, file_id: str) -> str:
        return f"{self.p}{{f:{file_id}}}"

    def _b(self, batch_id: str, name: str) -> str:
        return f"{self.p}{{b:{batch_id}}}:{name}"

    def _pipe(self) -> Any:
        return self.r.pipeline(transaction=not self._cluster)

    # ---- files
    def put_file(self, f: StoredFile) -> None:
        pipe = self._pipe()
        pipe.hset(
            self._file(f.id),
            mapping={
                "filename": f.filename,
                "purpose": f.purpose,
                "created_at": f.created_at,
                "client": f.client,
                "content": f.content,
            },
        )
        pipe.zadd(self.p + "files", {f.id: f.created_at})
        pipe.execute()

    def _stored(self, file_id: str, h: dict[bytes, bytes]) -> StoredFile | None:
        if not h:
            return None
        return StoredFile(
            id=file_id,
            filename=h[b"filename"].decode(),
            purpose=h[b"purpose"].decode(),
            created_at=int(h[b"created_at"]),
            content=h[b"content"],
            client=h.get(b"client", b"").decode(),
        )

    def get_file(self, file_id: str) -> StoredFile | None:
        return self._stored(file_id, self.r.hgetall(self._file(file_id)))

    def delete_file(self, file_id: str) -> bool:
        pipe = self._pipe()
        pipe.delete(self._file(file_id))
        pipe.zrem(self.p + "files", file_id)
        gone, _ = pipe.execute()
        return bool(gone)

    def list_files(self) -> list[StoredFile]:
        ids = [i.decode() for i in self.r.zrange(self.p + "files", 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.hgetall(self._file(i))
        got = [self._stored(i, h) for i, h in zip(ids, pipe.execute(), strict=True)]
        return [f for f in got if f is not None]

    # ---- batches
    def put_batch(self, batch: Batch) -> None:
        pipe = self._pipe()
        pipe.set(self._b(batch.id, "doc"), json.dumps(batch.to_doc(), ensure_ascii=False))
        pipe.zadd(self.p + "batches:" + batch.api, {batch.id: batch.created_at})
        if batch.status in FINAL:
            pipe.srem(self.p + "open", batch.id)
        else:
            pipe.sadd(self.p + "open", batch.id)
        pipe.execute()

    def get_batch(self, batch_id: str) -> Batch | None:
        raw = self.r.get(self._b(batch_id, "doc"))
        return Batch.from_doc(json.loads(raw)) if raw is not None else None

    def list_batches(self, api: str) -> list[Batch]:
        ids = [i.decode() for i in self.r.zrange(self.p + "batches:" + api, 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for i in ids:
            pipe.get(self._b(i, "doc"))
        return [Batch.from_doc(json.loads(raw)) for raw in pipe.execute() if raw is not None]

    def open_batches(self) -> list[str]:
        return sorted(i.decode() for i in self.r.smembers(self.p + "open"))

    # ---- lines
    def record_line(self, batch_id: str, index: int, record: dict[str, Any], kind: str) -> bool:
        keys = [self._b(batch_id, "lines"), self._b(batch_id, "counts"), self._b(batch_id, f"claim:{index}")]
        value = json.dumps([kind, record], ensure_ascii=False)
        return bool(self._record(keys, [index, value, kind]))

    def done_lines(self, batch_id: str) -> set[int]:
        return {int(i) for i in self.r.hkeys(self._b(batch_id, "lines"))}

    def counts(self, batch_id: str) -> Counts:
        by = {k.decode(): int(v) for k, v in self.r.hgetall(self._b(batch_id, "counts")).items()}
        return Counts(
            done=by.get("done", 0),
            failed=by.get("failed", 0),
            cancelled=by.get("cancelled", 0),
            expired=by.get("expired", 0),
        )

    def records(self, batch_id: str) -> list[tuple[dict[str, Any], str]]:
        lines = self.r.hgetall(self._b(batch_id, "lines"))
        out = []
        for i in sorted(lines, key=int):
            kind, record = json.loads(lines[i])
            out.append((record, kind))
        return out

    # ---- claims
    def claim(self, batch_id: str, index: int, owner: str, ttl_s: float) -> bool:
        keys = [self._b(batch_id, f"claim:{index}"), self._b(batch_id, "lines")]
        return bool(self._take(keys, [owner, _ms(ttl_s), index]))

    def renew(self, batch_id: str, indices: list[int], owner: str, ttl_s: float) -> None:
        if indices:
            self._renew([self._b(batch_id, f"claim:{i}") for i in indices], [owner, _ms(ttl_s)])

    def release(self, batch_id: str, index: int, owner: str) -> None:
        self._release([self._b(batch_id, f"claim:{index}")], [owner])

    def finalize(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        return bool(self._take([self._b(batch_id, "final")], [owner, _ms(ttl_s), ""]))

    def close(self) -> None:
        self.r.close()
