"""The Batch APIs' runner over each one-gateway store (memory, SQLite), on a fake source: a
gateway started again sends only the lines with no record, a line's first record is kept,
a cancel records the lines not sent, and the SQLite file is the user's alone."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from typing import Any

import pytest

from ratedeck.core.vocab import Ending
from ratedeck.gateway.batches.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FINAL,
    IN_PROGRESS,
    VALIDATING,
    Batch,
    StoredFile,
)
from ratedeck.gateway.batches.runner import BatchRunner
from ratedeck.gateway.batches.store import BatchStore, MemoryBatchStore, SqliteBatchStore

from .support import run_async


class FakeRequest:
    def __init__(self, shape: Any, on_done: Any) -> None:
        self.shape = shape
        self.on_done = on_done
        self.line_id: str | None = None
        self.result = None
        self.last_status: int | None = None
        self.request_id: str | None = None
        self.last_error: str | None = None
        self.cancelled = False
        self.first_sent_at: float | None = None


class FakeSource:
    """A `LiveSource` that answers every line 200 at once, or holds them (`hold`) until `answer`."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.sent: list[str] = []
        self.held: list[FakeRequest] = []

    def make(self, shape: Any, *, ttl_s: float | None, on_done: Any, flow: int = 0) -> FakeRequest:
        return FakeRequest(shape, on_done)

    async def submit(self, req: FakeRequest) -> None:
        if self.hold:
            self.held.append(req)
        else:
            self.answer(req)

    def answer(self, req: FakeRequest) -> None:
        assert req.line_id is not None
        self.sent.append(req.line_id)
        req.first_sent_at = 1.0
        req.last_status = 200
        req.request_id = f"req-{req.line_id}"
        req.on_done(req, Ending.SUCCEEDED)

    def withdraw(self, req: FakeRequest) -> bool:
        req.cancelled = True
        if req in self.held:
            self.held.remove(req)
            req.on_done(req, Ending.SHED)
            return True
        return False


def line(i: int) -> str:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 5}
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


def new_batch(store: BatchStore, n: int, batch_id: str = "batch_1", status: str = VALIDATING) -> Batch:
    content = "".join(line(i) + "\n" for i in range(n)).encode()
    store.put_file(StoredFile("file-in", "in.jsonl", "batch", 1, content, "default"))
    batch = Batch(batch_id, "openai", status, "file-in", client="default", created_at=1)
    store.put_batch(batch)
    return batch


async def ended(store: BatchStore, batch_id: str, timeout_s: float = 5.0) -> Batch:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        batch = store.get_batch(batch_id)
        assert batch is not None
        if batch.status in FINAL:
            return batch
        assert asyncio.get_running_loop().time() < deadline, batch.status
        await asyncio.sleep(0.01)


def output_ids(store: BatchStore, batch: Batch) -> list[str]:
    ids = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            f = store.get_file(file_id)
            assert f is not None
            ids += [json.loads(x)["custom_id"] for x in f.content.decode().splitlines()]
    return ids


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    s: BatchStore = (
        MemoryBatchStore() if request.param == "memory" else SqliteBatchStore(str(tmp_path / "b.db"))
    )
    yield s
    if request.param == "sqlite":
        s.close()


def runner_over(store: BatchStore, source: FakeSource) -> BatchRunner:
    return BatchRunner(store, source, redact=lambda s: s)  # type: ignore[arg-type]


@run_async
async def test_a_batch_runs_every_line_once(store):
    source = FakeSource()
    runner = runner_over(store, source)
    runner.start(new_batch(store, 30))
    batch = await ended(store, "batch_1")
    assert batch.status == COMPLETED and batch.total == 30
    assert sorted(source.sent) == sorted(f"c{i}" for i in range(30))
    assert output_ids(store, batch) == [f"c{i}" for i in range(30)]  # in the input's order
    assert store.counts("batch_1").done == 30
    assert runner.tasks == {} and runner.claimed.get("batch_1") is None


@run_async
async def test_resume_sends_only_the_lines_with_no_record(store):
    new_batch(store, 20, status=IN_PROGRESS)
    for i in range(0, 20, 3):  # answered before the gateway was killed
        assert store.record_line("batch_1", i, {"custom_id": f"c{i}", "before": True}, "ok")
    source = FakeSource()
    runner = runner_over(store, source)
    assert runner.resume() == 1
    batch = await ended(store, "batch_1")
    assert batch.status == COMPLETED
    assert sorted(source.sent) == sorted(f"c{i}" for i in range(20) if i % 3)
    ids = output_ids(store, batch)
    assert ids == [f"c{i}" for i in range(20)]
    records = [r for r, _ in store.records("batch_1")]
    assert all(r.get("before") for i, r in enumerate(records) if i % 3 == 0)


def test_record_line_keeps_the_first(store):
    new_batch(store, 3)
    assert store.record_line("batch_1", 1, {"custom_id": "c1", "n": 1}, "ok")
    assert not store.record_line("batch_1", 1, {"custom_id": "c1", "n": 2}, "failed")
    assert store.records("batch_1") == [({"custom_id": "c1", "n": 1}, "ok")]
    assert store.counts("batch_1").done == 1 and store.counts("batch_1").failed == 0
    assert store.done_lines("batch_1") == {1}
    # One gateway holds the store: every claim is granted, at no cost.
    assert not store.shared
    assert store.claim("batch_1", 2, "me", 1.0) and store.finalize("batch_1", "me", 1.0)


@run_async
async def test_a_cancel_records_the_lines_not_sent_and_lets_those_in_flight_end(store):
    source = FakeSource(hold=True)
    runner = runner_over(store, source)
    runner.start(new_batch(store, 10))
    while len(source.held) < 10:
        await asyncio.sleep(0.01)
    in_flight = source.held[:3]
    for req in in_flight:
        source.held.remove(req)
    cancelling = runner.cancel("batch_1")
    assert cancelling is not None and cancelling.status == CANCELLING
    for req in in_flight:  # sent before the cancel: their answers are kept
        source.answer(req)
    batch = await ended(store, "batch_1")
    assert batch.status == CANCELLED
    kinds = {r["custom_id"]: k for r, k in store.records("batch_1")}
    assert kinds == {f"c{i}": ("ok" if i < 3 else "cancelled") for i in range(10)}
    counts = store.counts("batch_1")
    assert (counts.done, counts.cancelled) == (10, 7)


def test_the_sqlite_file_is_the_users_alone(tmp_path):
    path = tmp_path / "batches.db"
    s = SqliteBatchStore(str(path))
    try:
        new_batch(s, 2)
        s.record_line("batch_1", 0, {"custom_id": "c0"}, "ok")
    finally:
        s.close()
    for f in tmp_path.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f.name


def test_the_eta_is_the_refill_rate_not_the_first_bursts():
    from collections import deque

    from ratedeck.gateway.batches.runner import ETA_WINDOW_S

    runner = BatchRunner(MemoryBatchStore(), FakeSource(), str)  # type: ignore[arg-type]
    # 120 lines answered at once by the full buckets at t=0, then 2 a second
    ends = [0.0] * 120 + [1.0 + 0.5 * i for i in range(60)]
    runner.ends["b"] = deque(ends, maxlen=200)
    runner.first_end["b"] = 0.0
    assert runner._eta("b", 100, now=5.0) is None  # too early to tell the burst from the rate
    eta = runner._eta("b", 100, now=30.5)
    assert eta == pytest.approx(100 / 2.0, rel=0.05)  # 50 s; the burst would have said ~14 s
    assert runner._eta("b", 0, now=30.5) == 0.0
    assert runner._eta("b", 10, now=30.5 + ETA_WINDOW_S + 1) is None  # nothing ended lately: unknown
