"""Batches in Redis (`--store redis://...`): several gateways on one real redis-server serve the
same batches; each line is sent by the gateway that claimed it, one gateway finishes the batch,
a gateway that stops or dies leaves its lines to the others, and a cancel on one stops them all."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from ratedeck.config import ConfigError
from ratedeck.gateway.batches import runner as batch_runner
from ratedeck.gateway.batches.records import CANCELLED, COMPLETED, FINAL, IN_PROGRESS, Batch, StoredFile
from ratedeck.gateway.batches.store import RedisBatchStore
from ratedeck.server.stubs.openai import start_openai
from tests.support.redis_server import free_port

from .support import TOKEN, gateway_config, run_async, running_gateway

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def quick(monkeypatch):
    """Small windows and quick rounds, so that two gateways share a short batch."""
    monkeypatch.setattr(batch_runner, "WINDOW", 8)
    monkeypatch.setattr(batch_runner, "SCAN_S", 0.3)
    monkeypatch.setattr(batch_runner, "POLL_S", 0.3)


def jsonl(n: int) -> bytes:
    lines = []
    for i in range(n):
        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": f"line {i}"}],
            "max_tokens": 5,
        }
        lines.append(
            json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        )
    return ("\n".join(lines) + "\n").encode()


async def create_batch(s: aiohttp.ClientSession, url: str, n: int) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", jsonl(n), filename="in.jsonl", content_type="application/jsonl")
    async with s.post(url + "/v1/files", data=form, headers=AUTH) as r:
        assert r.status == 200, await r.text()
        file_id = (await r.json())["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with s.post(url + "/v1/batches", json=body, headers=AUTH) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["id"]


async def get_batch(s: aiohttp.ClientSession, url: str, batch_id: str) -> dict:
    async with s.get(f"{url}/v1/batches/{batch_id}", headers=AUTH) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def until(s: aiohttp.ClientSession, url: str, batch_id: str, test, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await get_batch(s, url, batch_id)
        if test(got):
            return got
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.05)


async def custom_ids(s: aiohttp.ClientSession, url: str, got: dict) -> list[str]:
    ids = []
    for key in ("output_file_id", "error_file_id"):
        if got.get(key):
            async with s.get(f"{url}/v1/files/{got[key]}/content", headers=AUTH) as r:
                assert r.status == 200
                ids += [json.loads(x)["custom_id"] for x in (await r.text()).splitlines()]
    return ids


def sent(gw) -> int:
    return sum(gw.batches.sent.values())


@run_async
async def test_two_gateways_on_one_redis_serve_one_batch_once(redis_server, quick):
    stub = await start_openai(keys=["sk-a", "sk-b"], rpm=100_000, tpm=10_000_000, latency=0.05)
    async with stub:
        cfg = gateway_config("openai", stub.url, ["sk-a", "sk-b"]).replace(store=redis_server.url)
        async with running_gateway(cfg) as a, running_gateway(cfg) as b, aiohttp.ClientSession() as s:
            batch_id = await create_batch(s, a.url, 120)
            got = await until(s, b.url, batch_id, lambda g: g["status"] in FINAL)
            ids = await custom_ids(s, b.url, got)
            files = b.batches.store.list_files()
            answered = len(stub.ledger.accepted())
            by_a, by_b = sent(a), sent(b)
    assert got["status"] == COMPLETED, got
    assert got["request_counts"] == {"total": 120, "completed": 120, "failed": 0}
    assert sorted(ids) == sorted(f"c{i}" for i in range(120))  # each custom_id exactly once
    assert by_a > 0 and by_b > 0 and by_a + by_b == 120, (by_a, by_b)  # both served it, no line twice
    assert answered == 120
    assert len(files) == 2  # the input and one output: one gateway finished the batch


@run_async
async def test_a_gateway_stopped_mid_batch_leaves_its_lines_to_the_other(redis_server, quick, monkeypatch):
    monkeypatch.setattr(batch_runner, "CLAIM_TTL_S", 1.0)
    stub = await start_openai(keys=["sk-a"], rpm=100_000, tpm=10_000_000, latency=0.05)
    async with stub:
        cfg = gateway_config("openai", stub.url, ["sk-a"]).replace(store=redis_server.url)
        async with running_gateway(cfg) as b, aiohttp.ClientSession() as s:
            async with running_gateway(cfg) as a:
                batch_id = await create_batch(s, a.url, 120)
                await until(s, b.url, batch_id, lambda g: g["request_counts"]["completed"] >= 20)
            left_by_a = sent(a)
            got = await until(s, b.url, batch_id, lambda g: g["status"] in FINAL)
            ids = await custom_ids(s, b.url, got)
            by_b = sent(b)
            answered = len(stub.ledger.accepted())
    assert got["status"] == COMPLETED, got
    assert sorted(ids) == sorted(f"c{i}" for i in range(120))
    assert 20 <= left_by_a < 120 and by_b > 0
    assert left_by_a + by_b == answered == 120  # A's lines withdrawn at its stop given back, each sent once


@run_async
async def test_the_lines_of_a_gateway_that_died_are_taken_when_its_claims_expire(redis_server, quick):
    store = RedisBatchStore(redis_server.url)
    store.put_file(StoredFile("file-in", "in.jsonl", "batch", 1, jsonl(30), ""))
    store.put_batch(Batch("batch_dead", "openai", IN_PROGRESS, "file-in", total=30, created_at=1))
    for i in range(5):  # claimed by a gateway that was killed before it sent them
        assert store.claim("batch_dead", i, "dead-gateway", 1.5)
    for i in range(5, 10):
        store.record_line("batch_dead", i, {"custom_id": f"c{i}", "before": True}, "ok")
    stub = await start_openai(keys=["sk-a"], rpm=100_000, tpm=10_000_000)
    async with stub:
        cfg = gateway_config("openai", stub.url, ["sk-a"]).replace(store=redis_server.url)
        t0 = time.monotonic()
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            assert "batch_dead" in gw.batches.tasks  # taken up at start
            got = await until(s, gw.url, "batch_dead", lambda g: g["status"] in FINAL)
            took = time.monotonic() - t0
            ids = await custom_ids(s, gw.url, got)
    store.close()
    assert got["status"] == COMPLETED
    assert sorted(ids) == sorted(f"c{i}" for i in range(30))
    assert (
        len(stub.ledger.accepted()) == 25
    )  # the dead one's 5 after their claims expired, none recorded again
    assert took >= 1.0


@run_async
async def test_a_cancel_on_one_gateway_stops_the_other(redis_server, quick):
    stub = await start_openai(keys=["sk-a"], rpm=100_000, tpm=10_000_000, latency=0.2)
    async with stub:
        cfg = gateway_config("openai", stub.url, ["sk-a"]).replace(store=redis_server.url)
        async with running_gateway(cfg) as a, running_gateway(cfg) as b, aiohttp.ClientSession() as s:
            batch_id = await create_batch(s, a.url, 200)
            await until(s, a.url, batch_id, lambda g: g["request_counts"]["completed"] >= 16)
            async with s.post(f"{b.url}/v1/batches/{batch_id}/cancel", headers=AUTH) as r:
                assert r.status == 200
            got = await until(s, a.url, batch_id, lambda g: g["status"] in FINAL)
            ids = await custom_ids(s, a.url, got)
            counts = a.batches.store.counts(batch_id)
            answered = len(stub.ledger.accepted())
    assert got["status"] == CANCELLED
    assert sorted(ids) == sorted(f"c{i}" for i in range(200))  # each line once: answered or cancelled
    assert counts.cancelled > 100 and counts.done == 200
    assert answered == counts.done - counts.cancelled < 100  # neither gateway sent on past the cancel


def test_the_redis_store_keeps_a_lines_first_record_and_its_count_with_it(redis_server):
    store = RedisBatchStore(redis_server.url)
    other = RedisBatchStore(redis_server.url)
    try:
        store.put_batch(Batch("b1", "openai", IN_PROGRESS, "file-x", total=3, created_at=1))
        assert store.record_line("b1", 2, {"custom_id": "c2"}, "failed")
        assert not other.record_line("b1", 2, {"custom_id": "c2", "again": True}, "ok")
        assert store.record_line("b1", 0, {"custom_id": "c0"}, "ok")
        assert other.records("b1") == [({"custom_id": "c0"}, "ok"), ({"custom_id": "c2"}, "failed")]
        counts = other.counts("b1")
        assert (counts.done, counts.failed, counts.succeeded) == (2, 1, 1)
        assert other.done_lines("b1") == {0, 2} and other.open_batches() == ["b1"]
        # A line is one gateway's while its claim lives; never once it has a record.
        assert store.claim("b1", 1, "g1", 5.0) and store.claim("b1", 1, "g1", 5.0)
        assert not other.claim("b1", 1, "g2", 5.0) and not other.claim("b1", 0, "g2", 5.0)
        store.release("b1", 1, "g1")
        assert other.claim("b1", 1, "g2", 5.0)
        assert other.finalize("b1", "g2", 5.0) and not store.finalize("b1", "g1", 5.0)
        done = Batch("b1", "openai", COMPLETED, "file-x", total=3, created_at=1)
        store.put_batch(done)
        assert other.open_batches() == [] and [b.id for b in other.list_batches("openai")] == ["b1"]
        store.put_file(StoredFile("file-x", "x.jsonl", "batch", 5, b"\x00bytes\n", "team"))
        assert other.get_file("file-x") == StoredFile("file-x", "x.jsonl", "batch", 5, b"\x00bytes\n", "team")
        assert [f.id for f in other.list_files()] == ["file-x"]
        assert other.delete_file("file-x") and not other.delete_file("file-x")
    finally:
        store.close()
        other.close()


@run_async
async def test_a_redis_that_does_not_answer_is_one_line_naming_store():
    stub = await start_openai(keys=["sk-a"])
    async with stub:
        url = f"redis://127.0.0.1:{free_port()}/0"
        cfg = gateway_config("openai", stub.url, ["sk-a"]).replace(store=url)
        with pytest.raises(ConfigError) as caught:
            async with running_gateway(cfg):
                pass
    text = str(caught.value)
    assert "--store" in text and "\n" not in text, text
