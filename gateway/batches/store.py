"""Where the gateway's batches live: in memory, or in the run's SQLite store file (`--store sqlite:PATH`).

A line's output record is written once (`record_line` is an insert that keeps the first):
a gateway killed and started again re-sends only lines with no record, and no `custom_id`
is answered twice in an output file. Everything a client sent or got back is kept only
here: in memory, or in the store file the user named (made 0600 by the store).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any, Protocol

from .records import Batch, Counts, StoredFile


class BatchStore(Protocol):
    """Files, batches and the lines' records. Calls are quick and local (memory, SQLite)."""

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

    def close(self) -> None: ...


_KINDS = ("ok", "failed", "cancelled", "expired")


def _counts(kinds: list[str]) -> Counts:
    return Counts(
        done=len(kinds),
        failed=kinds.count("failed"),
        cancelled=kinds.count("cancelled"),
        expired=kinds.count("expired"),
    )


class MemoryBatchStore:
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


class SqliteBatchStore:
    """The batches in the run's SQLite store file (its own tables beside the work store's).

    Every write is its own transaction, committed before the call returns (the store's
    `synchronous = FULL`): a line recorded is a line a SIGKILL does not lose."""

    def __init__(self, path: str) -> None:
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

    def close(self) -> None:
        with self._lock:
            self._db.close()
