"""JSONL files written while a run lasts: the graveyard, the shed messages, `--results`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO, Any

from ratedeck.core.files import private_open


class JsonLines:
    """One JSON object a line, each write flushed at once: a kill -9 loses at most a partial last line.

    `what` names the file in the problem ("graveyard" gives "cannot write graveyard
    g.jsonl: Permission denied"). A `fresh` file is created (emptied) at once, so a path
    that cannot be written is known before the run; otherwise the file is appended to,
    opened at the first line. A failure to open, write or close sets `problem` and closes
    the file; no later line is tried (`write` returns False). Nothing here raises.
    """

    __slots__ = ("path", "what", "written", "problem", "_fh", "_mode")

    def __init__(self, path: str, what: str, *, fresh: bool = False) -> None:
        self.path = path
        self.what = what
        self.written = 0  # lines that reached the file
        self.problem: str | None = None
        self._fh: IO[Any] | None = None
        self._mode = "w" if fresh else "a"
        if fresh:
            self._open()

    def _open(self) -> IO[Any] | None:
        try:  # created 0600: its lines may hold requests and answers (core/files.py)
            self._fh = private_open(self.path, self._mode, encoding="utf-8", buffering=1)
        except (OSError, ValueError) as exc:
            self._fail(exc)
        self._mode = "a"  # opened again after close(): never emptied twice
        return self._fh

    def _fail(self, exc: BaseException) -> None:
        self.problem = (
            self.problem or f"cannot write {self.what} {self.path}: {getattr(exc, 'strerror', None) or exc}"
        )

    def write(self, record: Any) -> bool:
        """`record` as one line (what JSON cannot hold is written as text); False if it was not."""
        if self.problem is not None:
            return False
        try:
            line = json.dumps(record, default=str)
        except ValueError as exc:  # a circular structure
            self._fail(exc)
            self.close()
            return False
        return self.write_lines((line,))

    def write_lines(self, lines: Iterable[str]) -> bool:
        """Lines already encoded, in one write; False if they were not written."""
        if self.problem is not None:
            return False
        batch = list(lines)
        if not batch:
            return True
        fh = self._fh or self._open()
        if fh is None:
            return False
        try:
            fh.write("\n".join(batch) + "\n")
            fh.flush()
        except (OSError, ValueError) as exc:
            self._fail(exc)
            self.close()
            return False
        self.written += len(batch)
        return True

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError as exc:
                self._fail(exc)
