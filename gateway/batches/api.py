"""The Batch APIs at the gateway, in the providers' own shapes.

OpenAI: `POST /v1/files` (multipart, `purpose=batch`), `GET /v1/files`, `GET /v1/files/{id}`,
`GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`, `POST /v1/batches`, `GET /v1/batches`
(newest first; `after`, `limit`), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

Anthropic: `POST /v1/messages/batches` (`requests`), `GET /v1/messages/batches` (newest
first; `before_id`, `after_id`, `limit`), `GET /v1/messages/batches/{id}`,
`GET /v1/messages/batches/{id}/results` (JSONL), `POST /v1/messages/batches/{id}/cancel`,
`DELETE /v1/messages/batches/{id}`. A batch's `results_url` points at this gateway.

The lines run through the gateway's keys (runner.py): the answers come at the keys' own rate
limits and prices, in minutes, not in the Batch APIs' 24 hours nor at their discount; an
OpenAI batch's `metadata` says so (`ratedeck`), and so do the docs (docs/gateway.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    FINAL,
    FINALIZING,
    HONEST,
    IN_PROGRESS,
    VALIDATING,
    Batch,
    StoredFile,
    new_id,
)
from .runner import BatchRunner, now_s, parse_lines

#: The endpoints an OpenAI batch may name (OpenAI's list).
OPENAI_ENDPOINTS = (
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
)
#: A day: when a batch "expires" in the API's terms (it never waits that long here).
DAY_S = 86_400
_METADATA_MAX = 16

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}, status=status
    )


def _anthropic_error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response({"type": "error", "error": {"type": type_, "message": message}}, status=status)


def _rfc3339(t: int | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class BatchApi:
    """The routes above over a `BatchRunner` (its store); `route(method, path)` finds a handler."""

    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner
        self.store = runner.store
        r = re.compile
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("POST", r(r"/v1/files"), self.create_file),
            ("GET", r(r"/v1/files"), self.list_files),
            ("GET", r(r"/v1/files/(?P<id>[\w-]+)"), self.get_file),
            ("GET", r(r"/v1/files/(?P<id>[\w-]+)/content"), self.file_content),
            ("DELETE", r(r"/v1/files/(?P<id>[\w-]+)"), self.delete_file),
            ("POST", r(r"/v1/batches"), self.create_batch),
            ("GET", r(r"/v1/batches"), self.list_batches),
            ("GET", r(r"/v1/batches/(?P<id>[\w-]+)"), self.get_batch),
            ("POST", r(r"/v1/batches/(?P<id>[\w-]+)/cancel"), self.cancel_batch),
            ("POST", r(r"/v1/messages/batches"), self.create_message_batch),
            ("GET", r(r"/v1/messages/batches"), self.list_message_batches),
            ("GET", r(r"/v1/messages/batches/(?P<id>[\w-]+)"), self.get_message_batch),
            ("GET", r(r"/v1/messages/batches/(?P<id>[\w-]+)/results"), self.message_batch_results),
            ("POST", r(r"/v1/messages/batches/(?P<id>[\w-]+)/cancel"), self.cancel_message_batch),
            ("DELETE", r(r"/v1/messages/batches/(?P<id>[\w-]+)"), self.delete_message_batch),
        ]

    def route(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
        """The handler for `method path` and its path's parts, or None (not a Batch API call)."""
        if not (
            path.startswith("/v1/files")
            or path.startswith("/v1/batches")
            or path.startswith("/v1/messages/batches")
        ):
            return None
        path = path.rstrip("/")
        for m, pattern, handler in self._routes:
            found = pattern.fullmatch(path)
            if found and m == method:
                return handler, found.groupdict()
        return None

    # ------------------------------------------------------------ OpenAI: files
    async def create_file(self, request: web.Request, client: str) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            return _error(
                400, "upload the file as multipart/form-data with 'file' and 'purpose'", "invalid_file"
            )
        try:
            form = await request.post()
        except ValueError as exc:
            return _error(400, f"the upload cannot be read ({exc})", "invalid_file")
        purpose = form.get("purpose")
        upload = form.get("file")
        if purpose != "batch":
            return _error(
                400,
                f"this gateway keeps files for batches only (purpose 'batch'), got {purpose!r}",
                "invalid_purpose",
            )
        if not isinstance(upload, web.FileField):
            return _error(400, "no 'file' part in the upload", "invalid_file")
        content = upload.file.read()
        f = StoredFile(
            id=new_id("file-"),
            filename=str(upload.filename or "batch.jsonl")[:200],
            purpose="batch",
            created_at=now_s(),
            content=content,
            client=client,
        )
        self.store.put_file(f)
        return web.json_response(f.openai())

    async def list_files(self, request: web.Request, client: str) -> web.Response:
        data = [f.openai() for f in self.store.list_files()]
        return web.json_response({"object": "list", "data": data, "has_more": False})

    async def get_file(self, request: web.Request, client: str, id: str = "") -> web.Response:
        f = self.store.get_file(id)
        if f is None:
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.json_response(f.openai())

    async def file_content(self, request: web.Request, client: str, id: str = "") -> web.Response:
        f = self.store.get_file(id)
        if f is None:
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.Response(body=f.content, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request, client: str, id: str = "") -> web.Response:
        if not self.store.delete_file(id):
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.json_response({"id": id, "object": "file", "deleted": True})

    # ------------------------------------------------------------ OpenAI: batches
    async def create_batch(self, request: web.Request, client: str) -> web.Response:
        body = await _json(request)
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request")
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        window, metadata = body.get("completion_window", "24h"), body.get("metadata")
        f = self.store.get_file(file_id) if isinstance(file_id, str) else None
        if f is None:
            return _error(400, f"input_file_id: no such file {file_id!r}", "invalid_request")
        if f.purpose != "batch":
            return _error(
                400,
                f"input_file_id: file {file_id!r} is not a batch input (purpose {f.purpose!r})",
                "invalid_request",
            )
        if endpoint not in OPENAI_ENDPOINTS:
            return _error(
                400,
                f"endpoint must be one of {', '.join(OPENAI_ENDPOINTS)}, got {endpoint!r}",
                "invalid_request",
            )
        if window != "24h":
            return _error(400, f"completion_window must be '24h', got {window!r}", "invalid_request")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > _METADATA_MAX
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            return _error(400, "metadata must be up to 16 string keys and values", "invalid_request")
        meta = dict(metadata or {})
        if len(meta) < _METADATA_MAX:
            meta.setdefault("ratedeck", HONEST)
        batch = Batch(
            id=new_id("batch_"),
            api="openai",
            status=VALIDATING,
            input_file_id=f.id,
            endpoint=str(endpoint),
            completion_window=str(window),
            metadata=meta,
            client=client,
            created_at=now_s(),
        )
        self.runner.start(batch)
        return web.json_response(self.openai_batch(batch))

    async def list_batches(self, request: web.Request, client: str) -> web.Response:
        batches = sorted(self.store.list_batches("openai"), key=lambda b: (b.created_at, b.id), reverse=True)
        try:
            limit = max(1, min(100, int(request.query.get("limit", "20"))))
        except ValueError:
            return _error(400, "limit must be a whole number from 1 to 100", "invalid_request")
        after = request.query.get("after")
        if after:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        data = [self.openai_batch(b) for b in page]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(batches) > limit,
            }
        )

    async def get_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "openai":
            return _error(404, f"No such Batch object: {id}", "batch_not_found")
        return web.json_response(self.openai_batch(batch))

    async def cancel_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "openai":
            return _error(404, f"No such Batch object: {id}", "batch_not_found")
        if batch.status in FINAL:
            return _error(
                409, f"the batch is {batch.status}: it cannot be cancelled", "batch_not_cancellable"
            )
        got = self.runner.cancel(id)
        assert got is not None
        return web.json_response(self.openai_batch(got))

    def openai_batch(self, batch: Batch) -> dict[str, Any]:
        counts = self.store.counts(batch.id)
        t = batch.times
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": {"object": "list", "data": [{"param": None, **e} for e in batch.errors]}
            if batch.errors
            else None,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": batch.created_at,
            "in_progress_at": t.get(IN_PROGRESS),
            "expires_at": batch.created_at + DAY_S,
            "finalizing_at": t.get(FINALIZING),
            "completed_at": t.get(COMPLETED),
            "failed_at": t.get(FAILED),
            "expired_at": None,
            "cancelling_at": t.get(CANCELLING),
            "cancelled_at": t.get(CANCELLED),
            "request_counts": {
                "total": batch.total,
                "completed": counts.succeeded,
                "failed": counts.failed + counts.cancelled + counts.expired,
            },
            "metadata": batch.metadata,
        }

    # ------------------------------------------------------------ Anthropic: message batches
    async def create_message_batch(self, request: web.Request, client: str) -> web.Response:
        body = await _json(request)
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return _anthropic_error(400, "requests: must be a non-empty list of {custom_id, params}")
        content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests).encode()
        _lines, errors = parse_lines(content, "anthropic")
        if errors:
            first = errors[0]
            at = f"requests.{first['line'] - 1}: " if first.get("line") else ""
            return _anthropic_error(400, f"{at}{first['message']}")
        f = StoredFile(
            id=new_id("file-"),
            filename="message_batch_requests.jsonl",
            purpose="message_batch_requests",
            created_at=now_s(),
            content=content,
            client=client,
        )
        self.store.put_file(f)
        batch = Batch(
            id=new_id("msgbatch_"),
            api="anthropic",
            status=VALIDATING,
            input_file_id=f.id,
            endpoint="/v1/messages",
            client=client,
            created_at=now_s(),
        )
        self.runner.start(batch)
        return web.json_response(self.anthropic_batch(batch, request))

    async def list_message_batches(self, request: web.Request, client: str) -> web.Response:
        batches = sorted(
            self.store.list_batches("anthropic"), key=lambda b: (b.created_at, b.id), reverse=True
        )
        try:
            limit = max(1, min(1000, int(request.query.get("limit", "20"))))
        except ValueError:
            return _anthropic_error(400, "limit: must be a whole number from 1 to 1000")
        ids = [b.id for b in batches]
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after:  # older than it (the list is newest first)
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        elif before:
            batches = batches[: ids.index(before)] if before in ids else []
            batches = batches[-limit:]
        page = batches[:limit]
        return web.json_response(
            {
                "data": [self.anthropic_batch(b, request) for b in page],
                "has_more": len(batches) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def get_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "anthropic":
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        return web.json_response(self.anthropic_batch(batch, request))

    async def message_batch_results(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "anthropic":
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        if batch.status not in FINAL or batch.output_file_id is None:
            return _anthropic_error(400, f"message batch {id} has not ended: its results are not ready")
        f = self.store.get_file(batch.output_file_id)
        content = f.content if f is not None else b""
        return web.Response(body=content, content_type="application/binary")

    async def cancel_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "anthropic":
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        got = self.runner.cancel(id) if batch.status not in FINAL else batch
        assert got is not None
        return web.json_response(self.anthropic_batch(got, request))

    async def delete_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self.store.get_batch(id)
        if batch is None or batch.api != "anthropic":
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        if batch.status not in FINAL:
            return _anthropic_error(400, f"message batch {id} is still processing: cancel it first")
        return web.json_response({"id": id, "type": "message_batch_deleted"})

    def anthropic_batch(self, batch: Batch, request: web.Request) -> dict[str, Any]:
        counts = self.store.counts(batch.id)
        ended = batch.status in FINAL
        status = "ended" if ended else ("canceling" if batch.status == CANCELLING else "in_progress")
        t = batch.times
        ended_at = t.get(COMPLETED) or t.get(CANCELLED) or t.get(FAILED)
        origin = f"{request.scheme}://{request.host}"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {
                "processing": max(0, batch.total - counts.done) if not ended else 0,
                "succeeded": counts.succeeded,
                "errored": counts.failed,
                "canceled": counts.cancelled,
                "expired": counts.expired,
            },
            "ended_at": _rfc3339(ended_at),
            "created_at": _rfc3339(batch.created_at),
            "expires_at": _rfc3339(batch.created_at + DAY_S),
            "archived_at": None,
            "cancel_initiated_at": _rfc3339(t.get(CANCELLING)),
            "results_url": f"{origin}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None
