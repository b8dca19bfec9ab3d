"""Anthropic's Message Batches at the gateway, with the official SDK as the client (retries off).

The shapes checked are the API reference's (docs.anthropic.com "Message Batches"): a
`message_batch` with `processing_status` in_progress / canceling / ended, `request_counts`
(processing, succeeded, errored, canceled, expired) that add up to the batch's requests,
RFC 3339 times, a `results_url` (here: the gateway's) whose JSONL has one
`{"custom_id", "result": {"type", ...}}` per request; a list newest first with `first_id`,
`last_id`, `has_more` and the `after_id` / `before_id` cursors; 400 `invalid_request_error`,
404 `not_found_error`; a batch deleted only once it ended ("If you'd like to delete an
in-progress batch, you must first cancel it").
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import aiohttp
import anthropic
import pytest

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.llm_common import prompt_identity

from .support import TOKEN, gateway_config, run_async, running_gateway

KEYS = ["sk-ant-batch-aaaaaaaaaaaa", "sk-ant-batch-bbbbbbbbbbbb"]
MODEL = "claude-haiku-4-5"


def params(n: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"line {n}"}]}


def requests(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}-{i}", "params": params(i)} for i in range(n)]


def client_of(gw) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=TOKEN, max_retries=0)


async def ended(client: anthropic.AsyncAnthropic, batch_id: str, limit_s: float = 8.0):
    """The batch once `ended` (polled, bounded)."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        batch = await client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert asyncio.get_running_loop().time() < deadline, f"not ended: {batch}"
        await asyncio.sleep(0.05)


async def results(client: anthropic.AsyncAnthropic, batch_id: str) -> list[Any]:
    return [r async for r in await client.messages.batches.results(batch_id)]


@run_async
async def test_200_requests_end_all_succeeded_and_results_come_from_the_gateway():
    async with await start_anthropic(keys=KEYS, rpm=1000, itpm=1_000_000, otpm=1_000_000) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                batch = await client.messages.batches.create(requests=requests(200))
                assert batch.type == "message_batch"
                assert batch.id.startswith("msgbatch_")
                assert batch.processing_status == "in_progress"
                assert batch.results_url is None
                assert batch.ended_at is None
                counts = batch.request_counts
                assert counts.processing == 200  # all processing from the start, as the API shows it
                assert (counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 0, 0, 0)
                done = await ended(client, batch.id)
                assert done.results_url == f"{gw.url}/v1/messages/batches/{batch.id}/results"
                assert done.request_counts.model_dump() == {
                    "processing": 0,
                    "succeeded": 200,
                    "errored": 0,
                    "canceled": 0,
                    "expired": 0,
                }
                assert isinstance(done.ended_at, datetime) and done.ended_at.tzinfo is not None
                assert done.created_at <= done.ended_at < done.expires_at
                assert done.cancel_initiated_at is None
                got = await results(client, batch.id)
    ids = [r.custom_id for r in got]
    assert sorted(ids) == sorted(f"r-{i}" for i in range(200))  # each exactly once
    for r in got:
        assert r.result.type == "succeeded", r
        assert r.result.message.type == "message"
        assert r.result.message.content[0].text.startswith("stub")
        assert r.result.message.usage.output_tokens == 4
    assert len(stub.ledger.accepted()) == 200
    assert stub.state.book.duplicates() == 0


@run_async
async def test_cancel_in_progress_ends_with_the_unsent_lines_canceled_and_never_sent():
    # 2 keys x 4 requests a second, each answer 0.2 s: 60 lines take seconds, a cancel lands early.
    async with await start_anthropic(
        keys=KEYS, rpm=4, itpm=1_000_000, otpm=1_000_000, minute_s=1.0, latency=0.2
    ) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                batch = await client.messages.batches.create(requests=requests(60))
                deadline = asyncio.get_running_loop().time() + 5
                while not stub.ledger.accepted():
                    assert asyncio.get_running_loop().time() < deadline, "nothing sent"
                    await asyncio.sleep(0.02)
                cancelled = await client.messages.batches.cancel(batch.id)
                assert cancelled.id == batch.id
                assert cancelled.processing_status in ("canceling", "ended")
                assert cancelled.cancel_initiated_at is not None
                done = await ended(client, batch.id)
                got = await results(client, batch.id)
                again = await client.messages.batches.cancel(batch.id)  # ended: nothing changes
    assert again.processing_status == "ended"
    assert again.request_counts == done.request_counts
    ids = [r.custom_id for r in got]
    assert sorted(ids) == sorted(f"r-{i}" for i in range(60))  # each exactly once
    by_type: dict[str, list[str]] = {}
    for r in got:
        by_type.setdefault(r.result.type, []).append(r.custom_id)
    counts = done.request_counts
    assert counts.processing == 0
    assert counts.canceled == len(by_type.get("canceled", [])) > 0
    assert counts.succeeded == len(by_type.get("succeeded", [])) > 0
    assert counts.errored == len(by_type.get("errored", [])) == 0
    assert counts.succeeded + counts.canceled == 60
    # The stub answered exactly the lines that succeeded, and never saw a canceled one.
    seen = {r.detail for r in stub.ledger.accepted()}
    want = {f"r-{i}": prompt_identity({"system": "", "messages": params(i)["messages"]}) for i in range(60)}
    assert {want[c] for c in by_type["succeeded"]} == seen
    assert not {want[c] for c in by_type["canceled"]} & seen
    assert len(stub.ledger.accepted()) == counts.succeeded


@pytest.mark.parametrize(
    ("bad", "index", "words"),
    [
        ({"custom_id": "r-1"}, 1, "requests.1.params"),
        ({"custom_id": "r-0", "params": params(9)}, 1, "requests.1.custom_id: 'r-0' is used twice"),
        ({"custom_id": "r-2", "params": "not an object"}, 1, "requests.1.params"),
        ({"custom_id": "r 2", "params": params(2)}, 1, "requests.1.custom_id"),
        ({"custom_id": "r-3", "params": params(3), "extra": 1}, 1, "extra"),
    ],
    ids=["no-params", "duplicate-custom-id", "params-not-object", "bad-custom-id", "unknown-field"],
)
@run_async
async def test_a_bad_request_is_400_naming_its_index_and_nothing_is_stored(bad, index, words):
    async with await start_anthropic(keys=KEYS, rpm=1000) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                with pytest.raises(anthropic.BadRequestError) as caught:
                    await client.messages.batches.create(
                        requests=[{"custom_id": "r-0", "params": params(0)}, bad]
                    )
                page = await client.messages.batches.list()
            files = gw.batches.store.list_files() if gw.batches is not None else None
    err = caught.value
    assert err.status_code == 400
    assert isinstance(err.body, dict) and err.body["error"]["type"] == "invalid_request_error"
    message = err.body["error"]["message"]
    assert f"requests.{index}" in message and words in message, message
    assert page.data == [] and files == []
    assert stub.ledger.records == []


@run_async
async def test_a_body_without_requests_is_400():
    async with await start_anthropic(keys=KEYS) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with aiohttp.ClientSession(headers={"x-api-key": TOKEN}) as http:
                for body in ({}, {"requests": []}, {"requests": "x"}, [1]):
                    async with http.post(f"{gw.url}/v1/messages/batches", json=body) as resp:
                        got = await resp.json()
                        assert resp.status == 400, body
                        assert got["type"] == "error"
                        assert got["error"]["type"] == "invalid_request_error"
    assert stub.ledger.records == []


@run_async
async def test_list_pages_newest_first_retrieve_unknown_is_404_and_delete_only_when_ended():
    async with await start_anthropic(keys=KEYS, rpm=1000) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                made = []
                for b in range(3):
                    made.append((await client.messages.batches.create(requests=requests(2, f"b{b}"))).id)
                for batch_id in made:
                    await ended(client, batch_id)
                first = await client.messages.batches.list(limit=2)
                assert [b.id for b in first.data] == made[::-1][:2]  # newest first
                assert first.has_more is True
                assert first.first_id == made[2] and first.last_id == made[1]
                second = await client.messages.batches.list(limit=2, after_id=first.last_id)
                assert [b.id for b in second.data] == [made[0]]
                assert second.has_more is False
                assert second.first_id == second.last_id == made[0]
                back = await client.messages.batches.list(limit=2, before_id=made[0])
                assert [b.id for b in back.data] == [made[2], made[1]]
                assert back.has_more is False
                newer = await client.messages.batches.list(limit=1, before_id=made[0])
                assert [b.id for b in newer.data] == [made[1]] and newer.has_more is True
                upward = [b.id async for b in client.messages.batches.list(limit=1, before_id=made[0])]
                assert upward == [made[1], made[2]]  # auto-paging towards the newest
                every = [b.id async for b in client.messages.batches.list(limit=1)]  # auto-paging
                assert every == made[::-1]

                with pytest.raises(anthropic.NotFoundError) as missing:
                    await client.messages.batches.retrieve("msgbatch_nosuchbatch")
                assert isinstance(missing.value.body, dict)
                assert missing.value.body["error"]["type"] == "not_found_error"
                for call in (client.messages.batches.cancel, client.messages.batches.delete):
                    with pytest.raises(anthropic.NotFoundError):
                        await call("msgbatch_nosuchbatch")
                with pytest.raises(anthropic.NotFoundError):
                    await client.messages.batches.results("msgbatch_nosuchbatch")

                deleted = await client.messages.batches.delete(made[0])
                assert deleted.id == made[0] and deleted.type == "message_batch_deleted"
                with pytest.raises(anthropic.NotFoundError):
                    await client.messages.batches.retrieve(made[0])
                with pytest.raises(anthropic.NotFoundError):
                    await client.messages.batches.delete(made[0])
                listed = [b.id async for b in client.messages.batches.list()]
                assert listed == [made[2], made[1]]
    assert len(stub.ledger.accepted()) == 6


@run_async
async def test_delete_of_an_in_progress_batch_is_refused_until_it_ends():
    async with await start_anthropic(keys=KEYS, rpm=1000, latency=0.3) as stub:
        async with running_gateway(gateway_config("anthropic", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                batch = await client.messages.batches.create(requests=requests(3))
                with pytest.raises(anthropic.BadRequestError) as refused:
                    await client.messages.batches.delete(batch.id)
                assert isinstance(refused.value.body, dict)
                assert refused.value.body["error"]["type"] == "invalid_request_error"
                still = await client.messages.batches.retrieve(batch.id)
                assert still.processing_status == "in_progress"
                with pytest.raises(anthropic.AnthropicError, match="results_url"):
                    await client.messages.batches.results(batch.id)  # no results before it ends
                done = await ended(client, batch.id)
                assert done.request_counts.succeeded == 3
                deleted = await client.messages.batches.delete(batch.id)
                assert deleted.id == batch.id
    assert len(stub.ledger.accepted()) == 3
