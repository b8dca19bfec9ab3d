"""OpenAI's Batch API at the gateway: the edge cases, in raw HTTP (aiohttp) and with the official SDK.

The answers checked are the API reference's (platform.openai.com "Files", "Batch"): an upload
is multipart with `purpose=batch`; a batch names an uploaded file, one of the endpoints, the
`24h` window and up to 16 metadata pairs (keys up to 64 characters, values up to 512); a bad
input file fails the batch with `errors.data[]` naming the line; the list is newest first with
`after` and `limit`; a batch that ended cannot be cancelled (409, "Cannot cancel a batch with
status '...'"); and every route wants the gateway's token.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest

from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEYS = ["sk-bapi-aaaaaaaaaaaaaaaa", "sk-bapi-bbbbbbbbbbbbbbbb"]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"


def line(i: int, **changes: Any) -> dict[str, Any]:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 8}
    return {"custom_id": f"c-{i}", "method": "POST", "url": CHAT, "body": body, **changes}


def jsonl(*lines: Any) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def client_of(gw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=TOKEN, base_url=gw.url + "/v1", max_retries=0)


async def final(client: openai.AsyncOpenAI, batch_id: str, limit_s: float = 8.0):
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled"):
            return batch
        assert asyncio.get_running_loop().time() < deadline, f"not final: {batch}"
        await asyncio.sleep(0.05)


async def uploaded(client: openai.AsyncOpenAI, content: bytes) -> str:
    return (await client.files.create(file=("in.jsonl", content), purpose="batch")).id


def stored(gw) -> tuple[int, int]:
    """(files, batches) the gateway keeps."""
    assert gw.batches is not None
    store = gw.batches.store
    return len(store.list_files()), len(store.list_batches("openai")) + len(store.list_batches("anthropic"))


@run_async
async def test_an_upload_must_be_multipart_with_purpose_batch_and_a_file():
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with aiohttp.ClientSession(headers=AUTH) as http:
                url = f"{gw.url}/v1/files"
                async with http.post(url, json={"purpose": "batch", "file": "x"}) as resp:
                    assert resp.status == 400
                    err = (await resp.json())["error"]
                    assert err["type"] == "invalid_request_error" and "multipart" in err["message"]
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                async with http.post(url, data=form) as resp:  # urlencoded, no file
                    assert resp.status == 400
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                form.add_field("other", b"x", filename="x.jsonl")
                async with http.post(url, data=form) as resp:  # multipart, no 'file' part
                    assert resp.status == 400
                    assert "file" in (await resp.json())["error"]["message"]
            async with client_of(gw) as client:
                for purpose in ("fine-tune", "assistants"):
                    with pytest.raises(openai.BadRequestError) as caught:
                        await client.files.create(file=("in.jsonl", jsonl(line(0))), purpose=purpose)  # type: ignore[arg-type]
                    assert purpose in caught.value.message
                good = await client.files.create(file=("in.jsonl", jsonl(line(0))), purpose="batch")
                listed = await client.files.list()
            files, batches = stored(gw)
    assert good.purpose == "batch" and good.bytes == len(jsonl(line(0))) and good.filename == "in.jsonl"
    assert [f.id for f in listed.data] == [good.id]
    assert (files, batches) == (1, 0)
    assert stub.ledger.records == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"input_file_id": "file-nosuchfile"}, "file-nosuchfile"),
        ({"endpoint": "/v1/images/generations"}, "endpoint"),
        ({"endpoint": None}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": ["k", "v"]}, "metadata"),
    ],
    ids=[
        "unknown-file",
        "wrong-endpoint",
        "no-endpoint",
        "window-1h",
        "metadata-17-keys",
        "metadata-key-65",
        "metadata-value-513",
        "metadata-not-string",
        "metadata-not-object",
    ],
)
@run_async
async def test_a_bad_batch_create_is_400_and_nothing_is_made(changes, words):
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0)))
                body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **changes}
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.post("/batches", cast_to=object, body=body)
                page = await client.batches.list()
                # The limits themselves are fine: 16 pairs, a key of 64, a value of 512.
                ok = await client.batches.create(
                    input_file_id=file_id,
                    endpoint=CHAT,
                    completion_window="24h",
                    metadata={"k" * 64: "v" * 512, **{f"m{i}": "v" for i in range(15)}},
                )
                done = await final(client, ok.id)
    assert caught.value.status_code == 400
    assert words in caught.value.message, caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "invalid_request_error"
    assert page.data == []
    assert done.status == "completed" and done.metadata is not None and len(done.metadata) == 16
    assert len(stub.ledger.records) == 1  # only the good batch's line


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        ("{not json", "invalid_json_line"),
        (line(1, url="/v1/embeddings"), "mismatched_endpoint"),
        (line(0), "duplicate_custom_id"),
        ({"custom_id": "c-1", "method": "POST", "url": CHAT}, "invalid_request"),
        (["a list"], "invalid_request"),
    ],
    ids=["not-json", "other-endpoint", "duplicate-custom-id", "no-body", "not-an-object"],
)
@run_async
async def test_a_bad_input_file_fails_the_batch_naming_the_line_and_sends_nothing(bad, code):
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0), "", bad, line(2)))  # the bad one: line 3
                made = await client.batches.create(
                    input_file_id=file_id, endpoint=CHAT, completion_window="24h"
                )
                batch = await final(client, made.id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data
    first = batch.errors.data[0]
    assert (first.line, first.code) == (3, code), first
    assert first.message
    assert batch.output_file_id is None and batch.error_file_id is None
    assert stub.ledger.records == []


@run_async
async def test_an_empty_or_not_utf8_file_fails_the_batch():
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                got = []
                for content in (b"\n\n", b"\xff\xfe{}\n"):
                    file_id = await uploaded(client, content)
                    made = await client.batches.create(
                        input_file_id=file_id, endpoint=CHAT, completion_window="24h"
                    )
                    got.append(await final(client, made.id))
    for batch, code in zip(got, ("empty_file", "invalid_file"), strict=True):
        assert batch.status == "failed"
        assert batch.errors is not None and batch.errors.data[0].code == code
        assert batch.errors.data[0].line is None
    assert stub.ledger.records == []


@run_async
async def test_the_list_pages_newest_first_with_after_and_limit():
    async with await start_openai(keys=KEYS, rpm=1000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0)))
                made = [
                    (
                        await client.batches.create(
                            input_file_id=file_id, endpoint=CHAT, completion_window="24h"
                        )
                    ).id
                    for _ in range(3)
                ]
                async with aiohttp.ClientSession(headers=AUTH) as http:
                    pages = []
                    after = ""
                    for _ in range(4):
                        query = {"limit": "1", **({"after": after} if after else {})}
                        async with http.get(f"{gw.url}/v1/batches", params=query) as resp:
                            assert resp.status == 200
                            page = await resp.json()
                        pages.append(page)
                        if not page["has_more"]:
                            break
                        after = page["last_id"]
                    async with http.get(f"{gw.url}/v1/batches", params={"limit": "x"}) as resp:
                        assert resp.status == 400
                every = [b.id async for b in client.batches.list(limit=2)]  # the SDK's auto-paging
                for batch_id in made:
                    await final(client, batch_id)
    assert [p["data"][0]["id"] for p in pages] == made[::-1]
    assert [p["has_more"] for p in pages] == [True, True, False]
    assert all(p["object"] == "list" and p["first_id"] == p["last_id"] == p["data"][0]["id"] for p in pages)
    assert every == made[::-1]
    assert len(stub.ledger.records) == 3


@run_async
async def test_cancel_of_an_ended_batch_is_409_as_openai_answers_and_unknown_is_404():
    async with await start_openai(keys=KEYS, rpm=1000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0), line(1)))
                made = await client.batches.create(
                    input_file_id=file_id, endpoint=CHAT, completion_window="24h"
                )
                done = await final(client, made.id)
                with pytest.raises(openai.ConflictError) as refused:
                    await client.batches.cancel(made.id)
                after = await client.batches.retrieve(made.id)
                with pytest.raises(openai.NotFoundError):
                    await client.batches.cancel("batch_nosuchbatch")
                with pytest.raises(openai.NotFoundError):
                    await client.batches.retrieve("batch_nosuchbatch")
    assert done.status == "completed"
    assert refused.value.status_code == 409
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["message"] == "Cannot cancel a batch with status 'completed'."
    assert refused.value.body["type"] == "invalid_request_error"
    assert after.status == "completed" and after.cancelling_at is None
    assert len(stub.ledger.records) == 2


@run_async
async def test_a_deleted_file_is_gone_and_its_content_is_404():
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0)))
                assert (await client.files.content(file_id)).content == jsonl(line(0))
                deleted = await client.files.delete(file_id)
                for call in (client.files.content, client.files.retrieve, client.files.delete):
                    with pytest.raises(openai.NotFoundError):
                        await call(file_id)
                with pytest.raises(openai.BadRequestError):  # a batch of a deleted file
                    await client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
                listed = await client.files.list()
    assert deleted.id == file_id and deleted.deleted is True
    assert listed.data == []
    assert stub.ledger.records == []


@run_async
async def test_a_wrong_token_is_401_on_every_batch_route_and_changes_nothing():
    async with await start_openai(keys=KEYS, rpm=1000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with client_of(gw) as client:
                file_id = await uploaded(client, jsonl(line(0)))
                made = await client.batches.create(
                    input_file_id=file_id, endpoint=CHAT, completion_window="24h"
                )
                await final(client, made.id)
            before = stored(gw)
            batch_before = gw.batches.store.get_batch(made.id) if gw.batches is not None else None
            base = gw.url
            routes: list[tuple[str, str, Any]] = [
                ("GET", "/v1/files", None),
                ("GET", f"/v1/files/{file_id}", None),
                ("GET", f"/v1/files/{file_id}/content", None),
                ("DELETE", f"/v1/files/{file_id}", None),
                (
                    "POST",
                    "/v1/batches",
                    {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
                ),
                ("GET", "/v1/batches", None),
                ("GET", f"/v1/batches/{made.id}", None),
                ("POST", f"/v1/batches/{made.id}/cancel", None),
                ("POST", "/v1/messages/batches", {"requests": [{"custom_id": "a", "params": {}}]}),
                ("GET", "/v1/messages/batches", None),
                ("GET", "/v1/messages/batches/msgbatch_x", None),
                ("GET", "/v1/messages/batches/msgbatch_x/results", None),
                ("POST", "/v1/messages/batches/msgbatch_x/cancel", None),
                ("DELETE", "/v1/messages/batches/msgbatch_x", None),
            ]
            statuses = {}
            async with aiohttp.ClientSession() as http:
                for headers in (
                    {},
                    {"Authorization": "Bearer not-the-token"},
                    {"x-api-key": "not-the-token"},
                ):
                    form = aiohttp.FormData()
                    form.add_field("purpose", "batch")
                    form.add_field("file", jsonl(line(5)), filename="in.jsonl")
                    async with http.post(f"{base}/v1/files", data=form, headers=headers) as resp:
                        statuses["POST /v1/files", str(headers)] = resp.status
                    for method, path, body in routes:
                        async with http.request(method, base + path, json=body, headers=headers) as resp:
                            statuses[f"{method} {path}", str(headers)] = resp.status
                            if resp.status == 401:
                                assert "token" in (await resp.json())["error"]["message"]
            after = stored(gw)
            batch_after = gw.batches.store.get_batch(made.id) if gw.batches is not None else None
            file_after = gw.batches.store.get_file(file_id) if gw.batches is not None else None
    assert {k: v for k, v in statuses.items() if v != 401} == {}
    assert len(statuses) == 3 * (len(routes) + 1)
    assert after == before == (2, 1)  # the input file and the output file; one batch
    assert batch_after == batch_before and file_after is not None
    assert len(stub.ledger.records) == 1


@run_async
async def test_a_path_under_the_batch_apis_no_route_has_is_answered_here_not_sent_to_the_target():
    async with await start_openai(keys=KEYS) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with aiohttp.ClientSession(headers=AUTH) as http:
                got = {}
                for method, path in [
                    ("DELETE", "/v1/batches/batch_x"),
                    ("PUT", "/v1/files"),
                    ("GET", "/v1/batches/batch_x/output"),
                    ("POST", "/v1/files/file-x/content"),
                    ("GET", "/v1/messages/batches/msgbatch_x/other"),
                    ("PATCH", "/v1/messages/batches/msgbatch_x"),
                ]:
                    async with http.request(method, gw.url + path, json={}) as resp:
                        got[method, path] = (resp.status, resp.headers.get("Allow"), await resp.json())
    assert {k: v[0] for k, v in got.items()} == {
        ("DELETE", "/v1/batches/batch_x"): 405,
        ("PUT", "/v1/files"): 405,
        ("GET", "/v1/batches/batch_x/output"): 404,
        ("POST", "/v1/files/file-x/content"): 405,
        ("GET", "/v1/messages/batches/msgbatch_x/other"): 404,
        ("PATCH", "/v1/messages/batches/msgbatch_x"): 405,
    }
    assert got["DELETE", "/v1/batches/batch_x"][1] == "GET"
    assert got["PUT", "/v1/files"][1] == "GET, POST"
    assert got["PATCH", "/v1/messages/batches/msgbatch_x"][1] == "DELETE, GET"
    assert got["GET", "/v1/batches/batch_x/output"][2]["error"]["type"] == "invalid_request_error"
    assert got["GET", "/v1/messages/batches/msgbatch_x/other"][2]["error"]["type"] == "not_found_error"
    assert stub.ledger.records == []


@run_async
async def test_each_client_sees_only_its_own_files_and_batches():
    a, b = "tok-team-a-0123456789", "tok-team-b-0123456789"
    async with await start_openai(keys=KEYS, rpm=1000) as stub:
        clients = [{"name": "a", "token": a}, {"name": "b", "token": b}]
        cfg = gateway_config("openai", stub.url, KEYS, gateway={"clients": clients})
        async with running_gateway(cfg, clients=cfg.gateway.clients, token=None) as gw:
            base = gw.url + "/v1"
            async with (
                openai.AsyncOpenAI(api_key=a, base_url=base, max_retries=0) as ca,
                openai.AsyncOpenAI(api_key=b, base_url=base, max_retries=0) as cb,
            ):
                file_id = await uploaded(ca, jsonl(line(0)))
                made = await ca.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
                done = await final(ca, made.id)
                assert done.status == "completed" and done.output_file_id is not None
                assert (await ca.files.content(done.output_file_id)).content
                for call, arg in [
                    (cb.files.retrieve, file_id),
                    (cb.files.content, file_id),
                    (cb.files.delete, file_id),
                    (cb.files.content, done.output_file_id),
                    (cb.batches.retrieve, made.id),
                    (cb.batches.cancel, made.id),
                ]:
                    with pytest.raises(openai.NotFoundError):
                        await call(arg)
                with pytest.raises(openai.BadRequestError):  # b cannot run a's file
                    await cb.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
                b_files, b_batches = await cb.files.list(), await cb.batches.list()
                a_files, a_batches = await ca.files.list(), await ca.batches.list()
    assert b_files.data == [] and b_batches.data == []
    assert {f.id for f in a_files.data} == {file_id, done.output_file_id}
    assert [x.id for x in a_batches.data] == [made.id]
    assert len(stub.ledger.records) == 1


@run_async
async def test_a_broken_or_too_big_upload_is_answered_not_a_500():
    auth = {"Authorization": f"Bearer {TOKEN}"}
    broken = b'--zzz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--zzz\r\nbroken'
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS), max_body_mb=1) as gw:
            async with aiohttp.ClientSession() as s:
                headers = {**auth, "Content-Type": "multipart/form-data; boundary=zzz"}
                async with s.post(gw.url + "/v1/files", data=broken, headers=headers) as r:
                    cut = (r.status, await r.json())
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                form.add_field("file", b"x" * (2 * 1024 * 1024), filename="big.jsonl")
                async with s.post(gw.url + "/v1/files", data=form, headers=auth) as r:
                    big = (r.status, await r.json())
            kept = stored(gw)
    assert cut[0] == 400 and cut[1]["error"]["code"] == "invalid_file"
    assert big[0] == 413 and big[1]["error"]["code"] == "file_too_large"
    assert kept == (0, 0) and not stub.ledger.records
