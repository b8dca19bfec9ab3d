"""`--results FILE.jsonl` and `--errors FILE`: one JSON line per request as it ends, and a
store run's resume of those files (`cut_partial_line`, `written_ids`).

A finish watcher of the engine (`RunEnd`), fed through the `ResultsHost` port; a line of a
provider's batch file is written in that API's output format (engine/llm/batch.py). Every
file is written 0600 through `JsonLines` (core/files.py's `private_open`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ratedeck.core.vocab import Ending
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.http.transport import Response
from ratedeck.engine.jsonl import JsonLines
from ratedeck.engine.llm.batch import BatchFormat, batch_format, failed, output_record
from ratedeck.engine.ports import ResultsHost
from ratedeck.engine.queues import Graveyard
from ratedeck.engine.request import Request, line_fields
from ratedeck.engine.settings import ConfigError

__all__ = ["RESULTS_BODY_CHARS", "ResultsFile", "cut_partial_line", "written_ids"]

#: A response body in a results line is cut to this many characters (after masking keys).
RESULTS_BODY_CHARS = 64 * 1024


class ResultsFile:
    """`--results FILE.jsonl`: one JSON line per request, written and flushed as it ends.

    Every request that ends (succeeded, uncertain, expired, graveyard, shed) is written
    by the engine's finish watcher; at the end of the run the requests still
    queued or in flight are written too (ending "queued", "in_flight"), so
    the file holds every generated request exactly once. A kill -9 leaves at
    most a partial last line (readers skip it). Lines never carry a key: the
    key is named by its label, and texts and parameters are masked.

    A line: id, key, ending, status, attempts, error, created_at,
    intended_at, first_sent_at, done_at (Unix seconds), latency_ms (the last
    attempt's send -> answer), total_ms (intended arrival -> done),
    queue_wait_ms (arrival -> first send), line_id (the workload line's
    `link` field, `_id` unless `--results-id` names another: what ties the
    line to its answer; null when it has none), params (the line's own
    fields), pool and line (its underscore fields `LINE_FIELDS`, as written,
    when it had any): together the line again, which `ratedeck replay` sends;
    request_id (the server's id of the attempt that left it uncertain, when it
    gave one), and with `--results-body` the answer's body: parsed when the
    answer is JSON (its Content-Type says so and it parses whole), else text.

    A line of a provider's batch file (`engine/llm/batch.py`) is written in
    that API's output format instead, always with the answer's body and request id.
    In a store run (`store`) a batch line left queued or in flight is not written: it
    goes back to the store, and the run that ends it writes it. A store run `append`s to
    the files the store's earlier runs wrote (a kill -9's partial last line cut off), and
    a `resume` writes no `custom_id` they already hold, nor a second ending for a line whose
    `_id` already succeeded there (a job a killed run answered but had not yet journaled is
    sent again where a repeat does nothing twice, an LLM prompt; its second answer is not
    written). A line without an `_id` cannot be told apart, nor one that ended otherwise
    there (expired, shed: the resume's ending says more): it may end twice.
    `errors` (`--errors FILE`) takes the lines that did not succeed, as a Batch API's
    error file does; `path` may then be None (only the errors are kept).
    """

    def __init__(
        self,
        path: str | None,
        engine: ResultsHost,
        body: bool = False,
        link: str = "_id",
        *,
        errors: str | None = None,
        store: bool = False,
        append: bool = False,
        resume: bool = False,
        request_id_headers: tuple[str, ...] = (),
    ):
        self.path = path
        self.engine = engine
        self.body = body
        self.link = link
        self.store = store
        self.redact = engine.redact
        # Where a batch line's request id is read: the target's own headers, then the usual ones.
        self.request_id_headers = tuple(dict.fromkeys((*request_id_headers, *REQUEST_ID_HEADERS)))
        # custom_ids already written (a resumed run's files hold the killed run's)
        self.done: set[Any] = set()
        # the `_id`s of ratedeck lines that succeeded there (a resumed run's files hold the killed run's)
        self.succeeded: set[Any] = set()
        self.out = self._open(path, "results", append, resume) if path else None
        self.errors = self._open(errors, "errors", append, resume) if errors else None

    def _open(self, path: str, what: str, append: bool, resume: bool) -> JsonLines:
        """A new file for this run (a graveyard appends), or with `append` the one the store's
        earlier runs wrote; a `resume` writes none of the custom_ids it holds."""
        if append:
            cut_partial_line(path)
            if resume:
                custom_ids, succeeded = written_ids(path)
                self.done |= custom_ids
                if self.link == "_id":  # `_id`s are unique in a file; another field may repeat
                    self.succeeded |= succeeded
        return JsonLines(path, what, fresh=not append)

    @property
    def shown_path(self) -> str | None:
        """Where the lines go, as the summary says it."""
        if self.errors is None:
            return self.path
        if self.out is None:
            return f"{self.errors.path} (errors only)"
        return f"{self.path} (errors in {self.errors.path})"

    @property
    def written(self) -> int:
        return sum(f.written for f in (self.out, self.errors) if f is not None)

    @property
    def problem(self) -> str | None:
        return next((f.problem for f in (self.out, self.errors) if f is not None and f.problem), None)

    def finished(self, req: Request, ending: Ending) -> None:
        self._write(req, str(ending), self.engine.clock())

    def left_over(self) -> None:
        """After the engine stopped: what is still queued or in flight, one line each."""
        now = self.engine.clock()
        for req in self.engine.queued():
            self._write(req, "queued", now)
        for req in self.engine.in_flight_requests():
            if req.ending is None:
                self._write(req, "in_flight", now)

    def not_read(self, items: Iterator[dict]) -> None:
        """After a file run stopped (a cap, a stop): the batch lines it never read, as never sent,
        so a batch file's every line has its output line. A ratedeck file's are left unread."""
        try:
            for item in items:
                fmt = batch_format(item)
                if fmt is None:
                    return
                custom_id = item.get("_id")
                if custom_id not in self.done:
                    self.done.add(custom_id)
                    self._put(output_record(fmt, custom_id, "queued", None, None, None, None), True)
        except ConfigError:
            return  # the file changed since it was checked: what was read is written

    def _write(self, req: Request, ending: str, now: float) -> None:
        fmt = batch_format(req.params)
        if fmt is not None:
            self._write_batch(req, fmt, ending)
            return
        if self.succeeded and req.line_id in self.succeeded:
            return  # a killed run wrote this line's answer; the resume sent it again (`written_ids`)
        key = req.key  # the key of its latest attempt (None: never sent)
        wall = self.engine.wall_time
        result = req.result
        sent = req.first_sent_at
        record: dict[str, Any] = {
            "id": req.id,
            "key": key,
            "ending": ending,
            "status": req.last_status,
            "attempts": req.attempts,
            "error": req.last_error,
            "created_at": round(wall(req.created_at), 6),
            "intended_at": round(wall(req.intended_at), 6),
            "first_sent_at": round(wall(sent), 6) if sent is not None else None,
            "done_at": round(wall(now), 6) if ending not in ("queued", "in_flight") else None,
            "latency_ms": round(result.latency_s * 1000.0, 3) if isinstance(result, Outcome) else None,
            "total_ms": round((now - req.intended_at) * 1000.0, 3),
            "queue_wait_ms": round((sent - req.created_at) * 1000.0, 3) if sent is not None else None,
            "line_id": self._line_id(req),
            "params": Graveyard.scrub(req.params, self.redact) if req.params else {},
            "pool": req.pool,
        }
        line = line_fields(req)
        if line:
            record["line"] = Graveyard.scrub(line, self.redact)
        if req.request_id is not None:  # the server's id of a write that ended uncertain
            record["request_id"] = req.request_id
        if self.body:
            record["body"] = self._body(result)
        self._put(record, ending != str(Ending.SUCCEEDED))

    def _write_batch(self, req: Request, fmt: BatchFormat, ending: str) -> None:
        """`req`'s line in its batch format's output, once per custom_id."""
        if self.store and ending in ("queued", "in_flight"):
            return  # back to the store: the run that ends it writes it
        custom_id = req.line_id
        if custom_id in self.done:
            return
        self.done.add(custom_id)
        record = batch_record(req, fmt, custom_id, ending, self.redact, self.request_id_headers)
        self._put(record, failed(record))

    def _put(self, record: dict[str, Any], bad: bool) -> None:
        """Write `record` to the errors file when it failed and there is one, else to the results."""
        out = self.errors if bad and self.errors is not None else self.out
        if out is not None and out.problem is None:
            out.write(record)

    def _line_id(self, req: Request) -> Any:
        """The value of the line's `link` field: its `_id`, or one of its own fields."""
        if self.link == "_id":
            value = req.line_id
        else:
            value = req.params.get(self.link) if req.params else None
        return Graveyard.scrub(value, self.redact)

    def _body(self, result: Any) -> Any:
        return answer_body(result, self.redact)

    def close(self) -> None:
        for f in (self.out, self.errors):
            if f is not None:
                f.close()


#: Masks every key in a text, cut to a limit (`core.secrets.Redactor`: `redact(text, limit=None)`).
Redact = Callable[..., str]

#: The headers a server names its answer by (OpenAI's, Anthropic's and Stripe's), after the target's own.
REQUEST_ID_HEADERS = ("x-request-id", "request-id")


def answer_body(result: Any, redact: Redact, whole: bool = False) -> Any:
    """The answer's body: parsed when it is JSON (up to `RESULTS_BODY_CHARS`, or any size when
    `whole`: a batch output line carries the whole answer), else text cut to that size; every
    key masked (`redact`)."""
    response = result.response if isinstance(result, Outcome) else None
    raw: Any = response.body if isinstance(response, Response) else None
    if isinstance(raw, bytes | bytearray):
        raw = bytes(raw).decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    assert isinstance(response, Response)
    if (whole or len(raw) <= RESULTS_BODY_CHARS) and _is_json(response.headers):
        try:
            parsed = json.loads(raw)
        except ValueError:
            pass
        else:  # the whole answer, every string in it masked
            return Graveyard.scrub(parsed, redact)
    return redact(raw, RESULTS_BODY_CHARS)


def batch_record(
    req: Request,
    fmt: BatchFormat,
    custom_id: Any,
    ending: str,
    redact: Redact,
    request_id_headers: tuple[str, ...] = REQUEST_ID_HEADERS,
) -> dict[str, Any]:
    """`req`'s line of `fmt`'s output file (`output_record`): its last answer, whole and masked,
    the server's id of it, and the error the engine last noted. A `--results` file of a batch
    file writes these, and so does the gateway's Batch APIs (gateway/batches/runner.py)."""
    result = req.result
    response = result.response if isinstance(result, Outcome) else None
    request_id = req.request_id or _request_id(response, request_id_headers)
    error = redact(req.last_error, 500) if req.last_error else None
    body = answer_body(result, redact, whole=True) if response is not None else None
    return output_record(fmt, custom_id, ending, req.last_status, body, request_id, error)


def _request_id(response: Any, names: tuple[str, ...]) -> str | None:
    """The server's id of an answer, from the first of the headers `names` it has; None if none."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name in names:
        try:
            value = headers.get(name) or headers.get(name.lower())
        except AttributeError:
            return None
        if value:
            return "".join(c for c in str(value) if c.isprintable())[:200]
    return None


def cut_partial_line(path: str) -> None:
    """Cut off the last line of a JSONL file when a kill -9 left it short, so the next line
    written starts on a line of its own (only the file's tail is read)."""
    p = Path(path)
    try:
        with p.open("r+b") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            at = size
            while at > 0:  # back, a block at a time, to the last newline
                start = max(0, at - 65536)
                fh.seek(start)
                block = fh.read(at - start)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    fh.truncate(start + nl + 1)
                    return
                at = start
            fh.truncate(0)
    except OSError:
        return  # no file yet, or not ours to mend: JsonLines says what it cannot write


def written_ids(path: str) -> tuple[set[Any], set[Any]]:
    """What a results file that killed runs left holds: the custom_ids of its batch lines, and
    the `line_id`s of its ratedeck lines that succeeded."""
    custom_ids: set[Any] = set()
    succeeded: set[Any] = set()
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                if "custom_id" in record:
                    custom_ids.add(record["custom_id"])
                elif record.get("ending") == "succeeded":
                    line_id = record.get("line_id")
                    if isinstance(line_id, str | int) and not isinstance(line_id, bool):
                        succeeded.add(line_id)
    except OSError:
        pass
    return custom_ids, succeeded


def _is_json(headers: Any) -> bool:
    """Whether an answer's Content-Type says JSON (application/json, or a +json type)."""
    try:
        kind = str(headers.get("Content-Type") or headers.get("content-type") or "")
        kind = kind.partition(";")[0].strip().lower()
    except AttributeError:
        return False
    return kind == "application/json" or kind.endswith("+json")
