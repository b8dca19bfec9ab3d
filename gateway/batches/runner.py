"""Running a batch: its lines through the gateway's engine as the client's other work goes.

A batch is checked whole first (`validating`): a line that is not a line of its API fails the
batch with an error naming the line, as the APIs do, and nothing is sent. Then each line is a
request of the submitting client's flow (its priority, weight and quotas: `batch` priority by
default for a client that did not say), made as the queue has room, at most `WINDOW` waiting
at once so the gateway's live clients keep theirs. Each answer is recorded once in the store
(`record_line`); when every line has its record the output and error files are written in the
API's output format and the batch is `completed`. Cancelling withdraws the lines not sent (they
end `batch_cancelled` / `canceled`); those in flight finish. A gateway started on the same
store takes up every batch that was not final, sending only the lines with no record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratedeck.core.vocab import Ending
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.llm.batch import BatchFormat, BatchLineError, failed, format_of, output_record, translate
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.snapshot import BatchRow
from ratedeck.engine.sources.live import LiveSource

from .records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    FINAL,
    FINALIZING,
    IN_PROGRESS,
    UNFINISHED,
    VALIDATING,
    Batch,
    StoredFile,
    new_id,
)
from .store import BatchStore

#: The latest line ends the ETA's rate is taken over.
_RATE_LINES = 200
#: Lines of one batch waiting in the queue at once (the rest wait their turn here).
WINDOW = 256
#: The request-id headers an answer is named by (OpenAI's, Anthropic's).
_REQUEST_ID_HEADERS = ("x-request-id", "request-id")


@dataclass(frozen=True)
class Line:
    """One checked line: its place in the input, its `custom_id` and the request to send."""

    index: int
    custom_id: str
    shape: Shape


def _settle(ended: asyncio.Future[None]) -> Callable[[asyncio.Task[None]], None]:
    def done(_task: asyncio.Task[None]) -> None:
        if not ended.done():
            ended.set_result(None)

    return done


def now_s() -> int:
    return int(time.time())


def parse_lines(content: bytes, api: str, endpoint: str | None = None) -> tuple[list[Line], list[dict]]:
    """The lines of a batch's input, or the errors that fail it (each naming its line, 1-based),
    as OpenAI's `errors.data` (code, message, line)."""
    fmt = BatchFormat.OPENAI if api == "openai" else BatchFormat.ANTHROPIC
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [{"code": "invalid_file", "message": "the file is not UTF-8 text", "line": None}]
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            errors.append(
                {"code": "invalid_json_line", "message": "this line is not valid JSON", "line": number}
            )
            continue
        if not isinstance(obj, dict) or format_of(obj) is not fmt:
            errors.append(
                {"code": "invalid_request", "message": f"not {fmt.shown} request line", "line": number}
            )
            continue
        try:
            fields = translate(obj, fmt)
        except BatchLineError as exc:
            errors.append({"code": "invalid_request", "message": str(exc), "line": number})
            continue
        cid = fields["_id"]
        if cid in seen:
            errors.append(
                {"code": "duplicate_custom_id", "message": f"custom_id {cid!r} is used twice", "line": number}
            )
            continue
        seen.add(cid)
        if endpoint is not None and fields["_path"] != endpoint:
            errors.append(
                {
                    "code": "mismatched_endpoint",
                    "message": f"url {fields['_path']!r} is not the batch's endpoint {endpoint!r}",
                    "line": number,
                }
            )
            continue
        body = fields["_body"]
        shape = Shape(
            method=fields["_method"],
            path=fields["_path"],
            body=body,
            payload=Shape.encode(body),
            headers=(("content-type", "application/json"),),
        )
        lines.append(Line(len(lines), cid, shape))
        if len(errors) >= 100:
            break
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "the file has no request lines", "line": None})
    return lines, errors


class BatchRunner:
    """Every batch of the gateway: started, taken up again, cancelled, finished (see the module doc)."""

    def __init__(
        self,
        store: BatchStore,
        source: LiveSource,
        redact: Callable[[str], str],
        flows: dict[str, int] | None = None,
        batch_flow: int = 0,
    ) -> None:
        """`flows`: each client's flow by name (a batch goes in its client's); `batch_flow` the flow
        of a batch whose client has none."""
        self.store = store
        self.source = source
        self.redact = redact
        self.flows = flows or {}
        self.batch_flow = batch_flow
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.queued: dict[str, set[Request]] = {}  # each running batch's lines waiting, not sent
        self.cancelled: set[str] = set()
        self.recording: set[asyncio.Task[None]] = set()  # answers being written to the store
        self.ends: dict[str, deque[float]] = {}  # each running batch's latest line ends (monotonic)
        self.final_view: tuple[BatchRow, ...] | None = None  # set when the store is closed

    # ------------------------------------------------------------ what the API handlers call
    def start(self, batch: Batch) -> None:
        self.store.put_batch(batch)
        self._spawn(batch.id)

    def resume(self) -> int:
        """Take up every batch a stopped gateway left unfinished; how many."""
        n = 0
        for api in ("openai", "anthropic"):
            for batch in self.store.list_batches(api):
                if batch.status in UNFINISHED and batch.id not in self.tasks:
                    if batch.status == CANCELLING:
                        self.cancelled.add(batch.id)
                    self._spawn(batch.id)
                    n += 1
        return n

    def cancel(self, batch_id: str) -> Batch | None:
        """Ask `batch_id` to stop: its lines not sent end cancelled; the batch as it is now."""
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.status not in UNFINISHED:
            return batch
        batch.status = CANCELLING
        batch.times.setdefault(CANCELLING, now_s())
        self.store.put_batch(batch)
        self.cancelled.add(batch_id)
        for req in list(self.queued.get(batch_id, ())):
            self.source.withdraw(req)
        if batch_id not in self.tasks:
            self._spawn(batch_id)
        return batch

    async def stop(self) -> None:
        """The gateway stops: the batches' tasks end where they are (a started gateway takes them
        up); lines in flight are still recorded as their answers come (`close` waits for them)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        """After the engine stopped: every answer recorded, then the store closed."""
        if self.recording:
            await asyncio.wait(list(self.recording))
        self.final_view = self.view()  # what the last snapshot shows
        self.store.close()

    def _spawn(self, batch_id: str) -> None:
        task = asyncio.ensure_future(self._run(batch_id))
        self.tasks[batch_id] = task
        task.add_done_callback(functools.partial(self._ended, batch_id))

    def _ended(self, batch_id: str, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(batch_id, None)

    # ------------------------------------------------------------ one batch
    async def _run(self, batch_id: str) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None:
            return
        source = self.store.get_file(batch.input_file_id)
        if source is None:
            return self._fail(
                batch, [{"code": "file_not_found", "message": "the input file is gone", "line": None}]
            )
        endpoint = batch.endpoint if batch.api == "openai" else None
        lines, errors = parse_lines(source.content, batch.api, endpoint)
        if errors:
            return self._fail(batch, errors)
        if batch.status == VALIDATING:
            batch.status = IN_PROGRESS
            batch.total = len(lines)
            batch.times[IN_PROGRESS] = now_s()
            self.store.put_batch(batch)
        fmt = BatchFormat.OPENAI if batch.api == "openai" else BatchFormat.ANTHROPIC
        if batch.status in (IN_PROGRESS, CANCELLING):
            await self._send_lines(batch, lines, fmt)
        if batch_id in self.cancelled:
            done = self.store.done_lines(batch_id)
            for line in lines:
                if line.index not in done:
                    record = output_record(fmt, line.custom_id, "queued", None, None, None, None)
                    self.store.record_line(batch_id, line.index, record, "cancelled")
        self._finish(batch_id, fmt)

    async def _send_lines(self, batch: Batch, lines: list[Line], fmt: BatchFormat) -> None:
        done = await asyncio.to_thread(self.store.done_lines, batch.id)
        room = asyncio.Semaphore(WINDOW)
        outstanding: set[asyncio.Future[None]] = set()
        queued = self.queued.setdefault(batch.id, set())
        flow = self.flows.get(batch.client, self.batch_flow)
        loop = asyncio.get_running_loop()
        try:
            for line in lines:
                if batch.id in self.cancelled:
                    break
                if line.index in done:
                    continue
                await room.acquire()
                if batch.id in self.cancelled:
                    room.release()
                    break
                ended: asyncio.Future[None] = loop.create_future()
                outstanding.add(ended)

                def on_done(req: Request, ending: Ending, line: Line = line, ended=ended) -> None:
                    queued.discard(req)
                    room.release()
                    if req.cancelled and req.first_sent_at is None:
                        ended.set_result(None)  # withdrawn by a cancel: recorded as cancelled after
                        return
                    task = asyncio.ensure_future(self._record(batch.id, line, req, ending, fmt))
                    self.recording.add(task)
                    task.add_done_callback(self.recording.discard)
                    task.add_done_callback(_settle(ended))

                req = self.source.make(line.shape, ttl_s=None, on_done=on_done, flow=flow)
                req.line_id = line.custom_id
                queued.add(req)
                await self.source.submit(req)
            if outstanding:
                await asyncio.wait(outstanding)
        finally:
            self.queued.pop(batch.id, None)

    async def _record(
        self, batch_id: str, line: Line, req: Request, ending: Ending, fmt: BatchFormat
    ) -> None:
        outcome = req.result if isinstance(req.result, Outcome) else None
        status = req.last_status
        body: Any = None
        request_id = req.request_id
        if outcome is not None:
            response = outcome.response
            raw = outcome.body if outcome.body is not None else getattr(response, "body", None)
            if isinstance(raw, str):
                raw = raw.encode()
            if isinstance(raw, bytes | bytearray):
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = self.redact(bytes(raw).decode("utf-8", "replace"))
            request_id = request_id or outcome.request_id
            headers = outcome.headers
            if headers is None and response is not None and hasattr(response, "headers"):
                headers = tuple(response.headers.items())
            for name, value in headers or ():
                if request_id is None and name.lower() in _REQUEST_ID_HEADERS:
                    request_id = value
        error = self.redact(req.last_error) if req.last_error else None
        record = output_record(fmt, line.custom_id, str(ending), status, body, request_id, error)
        kind = "failed" if failed(record) else "ok"
        if ending is Ending.EXPIRED:
            kind = "expired"
        await asyncio.to_thread(self.store.record_line, batch_id, line.index, record, kind)
        ends = self.ends.setdefault(batch_id, deque(maxlen=_RATE_LINES))
        ends.append(time.monotonic())

    def view(self, kept: int = 10) -> tuple[BatchRow, ...]:
        """The batches not final, then the latest `kept` that are, newest first (for the snapshot)."""
        if self.final_view is not None:
            return self.final_view
        batches = [b for api in ("openai", "anthropic") for b in self.store.list_batches(api)]
        batches.sort(key=lambda b: (b.status in FINAL, -b.created_at))
        live = [b for b in batches if b.status not in FINAL]
        shown = live + [b for b in batches if b.status in FINAL][:kept]
        rows = []
        for b in shown:
            counts = self.store.counts(b.id)
            rows.append(
                BatchRow(
                    id=b.id,
                    api=b.api,
                    client=b.client,
                    status=b.status,
                    total=b.total,
                    done=counts.done,
                    failed=counts.failed + counts.cancelled + counts.expired,
                    eta_s=self._eta(b.id, b.total - counts.done) if b.status not in FINAL else None,
                )
            )
        return tuple(rows)

    def _eta(self, batch_id: str, left: int) -> float | None:
        """`left` lines at the rate the latest ones ended (None: fewer than two ended yet)."""
        ends = self.ends.get(batch_id)
        if left <= 0:
            return 0.0
        if not ends or len(ends) < 2 or ends[-1] <= ends[0]:
            return None
        rate = (len(ends) - 1) / (ends[-1] - ends[0])
        return left / rate

    def _fail(self, batch: Batch, errors: list[dict[str, Any]]) -> None:
        batch.status = FAILED
        batch.errors = errors
        batch.times[FAILED] = now_s()
        self.store.put_batch(batch)

    def _finish(self, batch_id: str, fmt: BatchFormat) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None:
            return
        cancelled = batch_id in self.cancelled
        batch.status = FINALIZING
        batch.times.setdefault(FINALIZING, now_s())
        self.store.put_batch(batch)
        records = self.store.records(batch_id)
        ok = [r for r, kind in records if kind == "ok"]
        bad = [r for r, kind in records if kind != "ok"]
        if fmt is BatchFormat.OPENAI:
            if ok:
                batch.output_file_id = self._write(batch, ok, "output")
            if bad:
                batch.error_file_id = self._write(batch, bad, "errors")
        else:  # Anthropic: one results file, every line
            batch.output_file_id = self._write(batch, [r for r, _ in records], "results")
        batch.status = CANCELLED if cancelled else COMPLETED
        batch.times[batch.status] = now_s()
        self.store.put_batch(batch)
        self.cancelled.discard(batch_id)

    def _write(self, batch: Batch, records: list[dict[str, Any]], what: str) -> str:
        content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
        f = StoredFile(
            id=new_id("file-"),
            filename=f"{batch.id}_{what}.jsonl",
            purpose="batch_output",
            created_at=now_s(),
            content=content,
            client=batch.client,
        )
        self.store.put_file(f)
        return f.id
