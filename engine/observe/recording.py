"""A run's answers recorded for replay: the timing and rate-limit facts of each, one JSON line.

With `--record FILE` (`EngineConfig.record_path`) the request path hands
each answered attempt to a `Recorder`, once, where the answer is known
(`RequestPath._attempt`); `path/replay.py` feeds a recording to a fresh
limit estimate and headroom, so a live case becomes a fast test.

The file is JSON Lines. The first line is the header:

    {"recording": "ratedeck", "version": 1,
     "wall_t0": 1764400000.123,                      # the run's start, Unix time
     "keys": {"k1": ["25/1s"]},                      # each key's limits as told
     "headroom": {"initial_ms": 100.0, ...},         # HeadroomController's arguments
     "estimate": {"climb": "additive", "slow_start": true, "learn_policy": true}}

then one line per answer, in the order the answers came:

    {"key": "k1", "sent": 1.002131, "at": 1.051877, "status": 429,
     "kind": "rate_limited", "retry_after_s": 1.0, "headers": {"Retry-After": "1"}}

`sent` is the slot's stamp (the send), `at` the answer, both in seconds from
the run's start (the engine's clock when it started), to the microsecond;
`retry_after_s`, `server_time_s` and `remaining` are there when the answer
gave them; `status` is null when no answer came (a timeout, no connection).

What it holds: the key's label (k1, an endpoint's name), never its secret;
of the answer's headers only those the engine reads for limits and timing
(`delays.has_hints`: RateLimit*, X-RateLimit-*, x-ratelimit-* and
anthropic-ratelimit-*, Server-Timing and kin) and Retry-After. Never a
request, a body, a URL, Authorization or a cookie; each line is masked with
the run's secrets all the same (`Redactor`). Created 0600 (core/files.py).

Cost: with no recording, one `is not None` per answer. With one, the lines
are kept and written once a second of answers has passed, at 1000 lines,
and at the end (`close`): a killed run keeps all but its last second.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ratedeck.core.secrets import Redactor
from ratedeck.engine.http.delays import has_hints
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.jsonl import JsonLines

__all__ = ["FORMAT", "VERSION", "Recorder", "limit_headers"]

#: The header line's "recording" value, and the format's version.
FORMAT = "ratedeck"
VERSION = 1
#: Lines kept before they are written, and the answer time between writes (seconds).
FLUSH_LINES = 1000
FLUSH_S = 1.0
_HINTS = ("retry_after_s", "server_time_s", "remaining")


def limit_headers(headers: Any) -> dict[str, str]:
    """Of an answer's headers, those about its limits and timing (`delays.has_hints`) and
    Retry-After, as {name: value} (a repeated name's values joined by ", "); never raises."""
    out: dict[str, str] = {}
    try:
        for name, value in headers.items():
            name, value = str(name), str(value)
            if name.lower() == "retry-after" or has_hints({name: value}):
                out[name] = f"{out[name]}, {value}" if name in out else value
    except Exception:  # a header mapping that misbehaves: what was read so far
        pass
    return out


class Recorder:
    """Writes a recording (see the module doc): the file is made at once (a path that cannot
    be written is known before the run), its header written when the run starts (`start`).
    `answers` counts the lines recorded; `problem` says why the file could not be written
    (then nothing more is)."""

    __slots__ = ("t0", "answers", "header", "_file", "_lines", "_flushed_at", "_redact")

    def __init__(self, path: str, header: dict[str, Any], redact: Redactor | None = None) -> None:
        self.t0 = 0.0  # the run's start on the engine's clock
        self.answers = 0
        self.header = header
        self._redact = redact or Redactor()
        self._file = JsonLines(path, "recording", fresh=True)
        self._lines: list[str] = []
        self._flushed_at = -math.inf

    def start(self, t0: float, wall_t0: float) -> None:
        """The run starts at `t0` on the engine's clock, `wall_t0` in Unix time: the header."""
        self.t0 = t0
        head = {"recording": FORMAT, "version": VERSION, "wall_t0": round(wall_t0, 3), **self.header}
        self._file.write(head)

    @property
    def path(self) -> str:
        return self._file.path

    @property
    def problem(self) -> str | None:
        return self._file.problem

    def record(self, key: str, sent_at: float | None, now: float, result: Outcome) -> None:
        """One answered attempt of `key`, sent at `sent_at` and answered at `now`."""
        try:
            t0 = self.t0
            line: dict[str, Any] = {
                "key": key,
                "sent": round(sent_at - t0, 6) if sent_at is not None else None,
                "at": round(now - t0, 6),
                "status": result.status,
                "kind": str(result.kind),
            }
            for name in _HINTS:
                value = getattr(result, name)
                if value is not None:
                    line[name] = value
            headers = getattr(result.response, "headers", None)
            if headers is not None:
                kept = limit_headers(headers)
                if kept:
                    line["headers"] = kept
            self._lines.append(self._redact(json.dumps(line, separators=(",", ":"))))
            self.answers += 1
        except Exception:  # never the request's trouble: the line is left out
            return
        if len(self._lines) >= FLUSH_LINES or now - self._flushed_at >= FLUSH_S:
            self._flushed_at = now
            self.flush()

    def flush(self) -> None:
        lines, self._lines = self._lines, []
        self._file.write_lines(lines)

    def close(self) -> str | None:
        """Write what is kept and close the file; returns the problem, if writing failed."""
        self.flush()
        self._file.close()
        return self.problem
