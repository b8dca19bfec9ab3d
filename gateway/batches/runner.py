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

Several gateways on one Redis serve the same batches (`store.shared`): a line is sent only by
the gateway that claimed it (`store.claim`), whose claims of lines in flight are renewed every
`claim_ttl_s / 3`; a line whose gateway died (its claim expired, no record) is taken by another.
Each gateway goes over a batch until every line has a record, looking again every `POLL_S` at
lines a live other gateway holds; one gateway (`store.finalize`) writes the output files and
the final status. Every `SCAN_S` a gateway joins the batches it does not run, and sees a
batch cancelled on another gateway (it stops sending its lines). In memory and SQLite every
claim is granted at no cost, and none of this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratedeck.core.vocab import Ending
from ratedeck.engine.llm.batch import BatchFormat, BatchLineError, failed, format_of, output_record, translate
from ratedeck.engine.observe.results import batch_record
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
#: The ETA's rate is the lines that ended over this long (the batch's first burst left out).
ETA_WINDOW_S = 15.0
#: Lines of one batch waiting in the queue at once (the rest wait their turn here).
WINDOW = 256
#: Shared store: how long a line's claim lives unless renewed (renewed every third of it).
CLAIM_TTL_S = 30.0
#: Shared store: how often a gateway looks for batches it does not run, and at lines another holds.
SCAN_S = 2.0
POLL_S = 1.0

LOGGER = logging.getLogger("ratedeck.gateway")


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
        claim_ttl_s: float | None = None,
    ) -> None:
        """`flows`: each client's flow by name (a batch goes in its client's); `batch_flow` the flow
        of a batch whose client has none; `claim_ttl_s`: see `CLAIM_TTL_S`."""
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
        self.first_end: dict[str, float] = {}  # when each batch's first line ended here (monotonic)
        self.final_view: tuple[BatchRow, ...] | None = None  # set when the store is closed
        self.owner = uuid.uuid4().hex[:16]  # this gateway, as its claims name it
        self.claim_ttl_s = CLAIM_TTL_S if claim_ttl_s is None else claim_ttl_s
        self.claimed: dict[str, set[int]] = {}  # each batch's lines this gateway claimed, not recorded
        self.sent: dict[str, int] = {}  # lines this gateway sent (ended not withdrawn), by batch
        self._keeper: asyncio.Task[None] | None = None  # shared store: renews, watches, joins
        self._stopping = False

    # ------------------------------------------------------------ what the API handlers call
    def start(self, batch: Batch) -> None:
        self.store.put_batch(batch)
        self._spawn(batch.id)

    def resume(self) -> int:
        """Take up every batch a stopped gateway left unfinished; how many."""
        n = 0
        for batch_id in self.store.open_batches():
            if batch_id in self.tasks:
                continue
            batch = self.store.get_batch(batch_id)
            if batch is not None and batch.status in UNFINISHED:
                if batch.status == CANCELLING:
                    self.cancelled.add(batch.id)
                self._spawn(batch.id)
                n += 1
        self._keep()
        return n

    def cancel(self, batch_id: str) -> Batch | None:
        """Ask `batch_id` to stop: its lines not sent end cancelled; the batch as it is now."""
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.status not in UNFINISHED:
            return batch
        batch.status = CANCELLING
        batch.times.setdefault(CANCELLING, now_s())
        self.store.put_batch(batch)
        self._withdraw(batch_id)
        if batch_id not in self.tasks:
            self._spawn(batch_id)
        return batch

    async def stop(self) -> None:
        """The gateway stops: the batches' tasks end where they are (a started gateway takes them
        up); lines in flight are still recorded as their answers come (`close` waits for them)."""
        self._stopping = True
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        """After the engine stopped: every answer recorded, then the store closed."""
        self._stopping = True
        if self.recording:
            await asyncio.wait(list(self.recording))
        keeper, self._keeper = self._keeper, None
        if keeper is not None:  # the claims of lines in flight were renewed until they were recorded
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper
        self.final_view = self.view()  # what the last snapshot shows
        self.store.close()

    def _spawn(self, batch_id: str) -> None:
        task = asyncio.ensure_future(self._run(batch_id))
        self.tasks[batch_id] = task
        task.add_done_callback(functools.partial(self._ended, batch_id))
        self._keep()

    def _keep(self) -> None:
        """A shared store: the keeper runs (one per gateway)."""
        if self.store.shared and self._keeper is None and not self._stopping:
            self._keeper = asyncio.ensure_future(self._keep_loop())

    async def _keep_loop(self) -> None:
        """Renew this gateway's claims of lines in flight; see batches cancelled elsewhere; join
        the batches it does not run (every `SCAN_S`). A store that fails a round is tried next round."""
        last_scan = time.monotonic()
        while True:
            await asyncio.sleep(min(POLL_S, self.claim_ttl_s / 3))
            try:
                for batch_id, indices in list(self.claimed.items()):
                    if indices:
                        await asyncio.to_thread(
                            self.store.renew, batch_id, sorted(indices), self.owner, self.claim_ttl_s
                        )
                if self._stopping:
                    continue
                for batch_id in list(self.tasks):
                    if batch_id in self.cancelled:
                        continue
                    batch = await asyncio.to_thread(self.store.get_batch, batch_id)
                    if batch is not None and batch.status == CANCELLING:
                        self._withdraw(batch_id)
                if time.monotonic() - last_scan >= SCAN_S:
                    last_scan = time.monotonic()
                    self.resume()
            except Exception as exc:  # a store that did not answer: next round
                LOGGER.warning("ratedeck: the batch store did not answer (%s)", type(exc).__name__)

    def _withdraw(self, batch_id: str) -> None:
        """Cancelled: the lines of `batch_id` waiting in the queue are not sent."""
        self.cancelled.add(batch_id)
        for req in list(self.queued.get(batch_id, ())):
            self.source.withdraw(req)

    def _ended(self, batch_id: str, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(batch_id, None)

    # ------------------------------------------------------------ one batch
    async def _run(self, batch_id: str) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.status in FINAL:
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
        if batch.status == VALIDATING or batch.total != len(lines):
            batch = self.store.get_batch(batch_id) or batch  # as it is now (another gateway may move it)
            if batch.status == VALIDATING:
                batch.status = IN_PROGRESS
                batch.times[IN_PROGRESS] = now_s()
            batch.total = len(lines)
            self.store.put_batch(batch)
        fmt = BatchFormat.OPENAI if batch.api == "openai" else BatchFormat.ANTHROPIC
        if batch.status in (IN_PROGRESS, CANCELLING):
            await self._send_lines(batch, lines, fmt)
        if self.store.finalize(batch_id, self.owner, self.claim_ttl_s):
            self._finish(batch_id, fmt)

    async def _send_lines(self, batch: Batch, lines: list[Line], fmt: BatchFormat) -> None:
        """Until every line has a record: send the lines this gateway claims (a cancelled batch's:
        record them cancelled); with a shared store, look again at lines another gateway holds."""
        room = asyncio.Semaphore(WINDOW)
        queued = self.queued.setdefault(batch.id, set())
        mine = self.claimed.setdefault(batch.id, set())
        flow = self.flows.get(batch.client, self.batch_flow)
        loop = asyncio.get_running_loop()
        shared = self.store.shared
        try:
            while True:
                done = await asyncio.to_thread(self.store.done_lines, batch.id)
                left = [line for line in lines if line.index not in done]
                if not left:
                    return
                outstanding: set[asyncio.Future[None]] = set()
                taken = 0
                for line in left:
                    if batch.id not in self.cancelled:
                        await room.acquire()
                        if batch.id in self.cancelled:
                            room.release()
                    if batch.id in self.cancelled:
                        if line.index not in mine:  # not one of ours in flight (it ends as it ends)
                            taken += self._cancel_line(batch.id, line, fmt)
                        continue
                    if not self.store.claim(batch.id, line.index, self.owner, self.claim_ttl_s):
                        room.release()  # another gateway's (alive), or recorded since
                        continue
                    taken += 1
                    mine.add(line.index)
                    ended: asyncio.Future[None] = loop.create_future()
                    outstanding.add(ended)

                    def on_done(req: Request, ending: Ending, line: Line = line, ended=ended) -> None:
                        queued.discard(req)
                        room.release()
                        if req.cancelled and req.first_sent_at is None:
                            # withdrawn (a cancel, or the gateway stopping): not sent, given back
                            mine.discard(line.index)
                            with contextlib.suppress(Exception):
                                self.store.release(batch.id, line.index, self.owner)
                            ended.set_result(None)
                            return
                        self.sent[batch.id] = self.sent.get(batch.id, 0) + 1
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
                if not shared and batch.id not in self.cancelled:
                    return  # one gateway: every line sent has its record
                if not taken:
                    await asyncio.sleep(POLL_S)  # lines a live other gateway holds
        finally:
            self.queued.pop(batch.id, None)

    def _cancel_line(self, batch_id: str, line: Line, fmt: BatchFormat) -> int:
        """A cancelled batch's line not sent: recorded cancelled by the gateway that claims it."""
        if not self.store.claim(batch_id, line.index, self.owner, self.claim_ttl_s):
            return 0
        record = output_record(fmt, line.custom_id, "queued", None, None, None, None)
        self.store.record_line(batch_id, line.index, record, "cancelled")
        self.claimed.get(batch_id, set()).discard(line.index)
        return 1

    async def _record(
        self, batch_id: str, line: Line, req: Request, ending: Ending, fmt: BatchFormat
    ) -> None:
        record = batch_record(req, fmt, line.custom_id, str(ending), self.redact)
        kind = "failed" if failed(record) else "ok"
        if ending is Ending.EXPIRED:
            kind = "expired"
        try:
            await asyncio.to_thread(self.store.record_line, batch_id, line.index, record, kind)
        finally:
            self.claimed.get(batch_id, set()).discard(line.index)
        ends = self.ends.setdefault(batch_id, deque(maxlen=_RATE_LINES))
        ends.append(time.monotonic())
        self.first_end.setdefault(batch_id, ends[-1])

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

    def _eta(self, batch_id: str, left: int, now: float | None = None) -> float | None:
        """`left` lines at the rate lines ended over the last `ETA_WINDOW_S` (None: the batch's
        lines have been ending for less than that, or none ended in it).

        Not the rate since the start: the keys' full buckets answer a batch's first lines at
        once, and the rate that follows is the refill's (a 300-line batch on 2 keys read
        "eta 9 s" from its first burst when 83 s were left)."""
        if left <= 0:
            return 0.0
        ends = self.ends.get(batch_id)
        first = self.first_end.get(batch_id)
        now = time.monotonic() if now is None else now
        if not ends or first is None or now - first < ETA_WINDOW_S:
            return None
        recent = [t for t in ends if t >= now - ETA_WINDOW_S]
        if len(recent) < 2:
            return None
        if len(recent) == len(ends) == ends.maxlen:  # more ended in the window than are kept
            rate = (len(recent) - 1) / max(1e-6, recent[-1] - recent[0])
        else:
            rate = len(recent) / ETA_WINDOW_S
        return left / rate

    def _fail(self, batch: Batch, errors: list[dict[str, Any]]) -> None:
        batch.status = FAILED
        batch.errors = errors
        batch.times[FAILED] = now_s()
        self.store.put_batch(batch)

    def _finish(self, batch_id: str, fmt: BatchFormat) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None or batch.status in FINAL:
            return
        # cancelled here or on another gateway (a finalizer that died left it FINALIZING)
        cancelled = batch_id in self.cancelled or CANCELLING in batch.times
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
        self.claimed.pop(batch_id, None)

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
