"""OpenAI's Batch API at the gateway with the official SDK (issue 43): a batch through the keys,
its output read back; on `--store sqlite:...`, a gateway killed with SIGKILL mid-batch and
started again finishes it with every custom_id once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import openai
import pytest

from ratedeck.bench.measure_batch_api import TOKEN as COMMAND_TOKEN
from ratedeck.bench.measure_batch_api import _free_port, gateway, openai_lines
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEYS = ["sk-bt-aaaaaaaaaaaaaaaa", "sk-bt-bbbbbbbbbbbbbbbb", "sk-bt-cccccccccccccccc"]


def content(n: int) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in openai_lines(n)).encode()


async def final(client: openai.AsyncOpenAI, batch_id: str, seconds: float = 40.0):
    async with asyncio.timeout(seconds):
        while True:
            try:
                batch = await client.batches.retrieve(batch_id)
            except openai.APIConnectionError:  # the gateway is starting again
                await asyncio.sleep(0.1)
                continue
            if batch.status in ("completed", "failed", "cancelled"):
                return batch
            await asyncio.sleep(0.2)


async def output(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    text = (await client.files.content(file_id)).text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@run_async
async def test_a_batch_goes_through_the_keys_and_its_output_has_each_custom_id_once():
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000, latency=0.01) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            client = openai.AsyncOpenAI(api_key=TOKEN, base_url=gw.url + "/v1", max_retries=0)
            f = await client.files.create(file=("batch.jsonl", content(60)), purpose="batch")
            assert f.purpose == "batch" and f.bytes == len(content(60))
            made = await client.batches.create(
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"job": "x"},
            )
            assert made.status == "validating" and made.metadata is not None and made.metadata["job"] == "x"
            assert "rate limits" in made.metadata["ratedeck"]  # says where its answers come from
            batch = await final(client, made.id)
            records = await output(client, batch.output_file_id)
            snap = gw.snapshot()
    assert batch.status == "completed" and batch.error_file_id is None
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        60,
        60,
        0,
    )
    assert batch.in_progress_at is not None and batch.completed_at is not None
    assert sorted(r["custom_id"] for r in records) == sorted(f"request-{i}" for i in range(60))
    assert {r["response"]["status_code"] for r in records} == {200}
    assert all(r["response"]["body"]["object"] == "chat.completion" and r["error"] is None for r in records)
    assert len(stub.ledger.records) == 60 and {r.key for r in stub.ledger.records} <= set(KEYS)
    (row,) = snap.clients.batches
    assert (row.status, row.total, row.done, row.failed, row.left) == ("completed", 60, 60, 0, 0)


@run_async
async def test_failed_answers_go_to_the_error_file_and_a_cancel_stops_the_lines_not_sent():
    async with await start_openai(keys=KEYS[:1], rpm=1000, tpm=2_000, latency=0.01) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS[:1])) as gw:
            client = openai.AsyncOpenAI(api_key=TOKEN, base_url=gw.url + "/v1", max_retries=0)
            lines = openai_lines(30)
            del lines[0]["body"]["messages"]  # the stub refuses it: 400
            data = "".join(json.dumps(line) + "\n" for line in lines).encode()
            f = await client.files.create(file=("b.jsonl", data), purpose="batch")
            made = await client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            await asyncio.sleep(0.5)  # 2,000 tokens a minute: five lines, then the bucket is dry
            cancelling = await client.batches.cancel(made.id)
            batch = await final(client, made.id)
            good = await output(client, batch.output_file_id)
            bad = await output(client, batch.error_file_id)
    assert cancelling.status in ("cancelling", "cancelled")
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    ids = [r["custom_id"] for r in good + bad]
    assert sorted(ids) == sorted(f"request-{i}" for i in range(30))  # every line once
    refused = [r for r in bad if r["response"] is not None]
    assert [r["custom_id"] for r in refused] == ["request-0"] and refused[0]["response"]["status_code"] == 400
    cancelled = [r for r in bad if r["response"] is None]
    assert len(cancelled) >= 20 and all(r["error"]["code"] == "batch_cancelled" for r in cancelled)
    sent = len(stub.ledger.records)
    assert sent == len(good) + len(refused) and sent <= 8  # the cancelled ones never reached the upstream


@pytest.mark.slow
@run_async
async def test_a_gateway_killed_mid_batch_on_sqlite_finishes_it_with_each_custom_id_once(tmp_path: Path):
    n = 90
    # 3 keys x 6,000 tokens a "minute" of 6 s (400 a line): 45 lines at once, then 7.5 a second
    async with await start_openai(keys=KEYS, rpm=10_000, tpm=6_000, minute_s=6.0, latency=0.05) as stub:
        port = _free_port()
        flags = ("--store", f"sqlite:{tmp_path / 'gw.db'}")
        procs = [await asyncio.to_thread(gateway, "openai", stub.url, KEYS, port, tmp_path, *flags)]
        try:
            client = openai.AsyncOpenAI(
                api_key=COMMAND_TOKEN, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
            )
            f = await client.files.create(file=("batch.jsonl", content(n)), purpose="batch")
            made = await client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            async with asyncio.timeout(30):
                while True:
                    b = await client.batches.retrieve(made.id)
                    assert b.request_counts is not None
                    if b.request_counts.completed >= n // 2:
                        break
                    await asyncio.sleep(0.1)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            killed_at = b.request_counts.completed
            procs.append(await asyncio.to_thread(gateway, "openai", stub.url, KEYS, port, tmp_path, *flags))
            batch = await final(client, made.id, 60)
            records = await output(client, batch.output_file_id)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(20)
                    except subprocess.TimeoutExpired:
                        p.kill()
    assert killed_at < n
    assert batch.status == "completed"
    assert sorted(r["custom_id"] for r in records) == sorted(f"request-{i}" for i in range(n))
    assert {r["response"]["status_code"] for r in records} == {200}
    # only lines in flight at the kill may have reached the upstream twice
    assert stub.state.book.duplicates() <= 10
    mode = stat.S_IMODE(os.stat(tmp_path / "gw.db").st_mode)
    assert mode == 0o600, oct(mode)  # what clients sent is in it: the user's alone
    log = (tmp_path / "gateway.out").read_text()
    assert "taken up again" in log and "Traceback" not in log
