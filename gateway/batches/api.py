"""The Batch APIs at the gateway, in the providers' own shapes.

OpenAI: `POST /v1/files` (multipart, `purpose=batch`), `GET /v1/files`, `GET /v1/files/{id}`,
`GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`, `POST /v1/batches`, `GET /v1/batches`
(newest first; `after`, `limit`), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

Anthropic: `POST /v1/messages/batches` (`requests`), `GET /v1/messages/batches` (newest
first; `before_id`, `after_id`, `limit`), `GET /v1/messages/batches/{id}`,
`GET /v1/messages/batches/{id}/results` (JSONL), `POST /v1/messages/batches/{id}/cancel`,
`DELETE /v1/messages/batches/{id}`. A batch's `results_url` points at this gateway.

A client (`[[gateway.clients]]`, by its token) sees only its own files and batches; another's
are 404 to it. Any other path under these prefixes is answered here (404, or 405 with `Allow`),
never sent to the target with the keys. Batch ids sort as the batches were made, so the lists
are newest first within a second too.

The lines run through the gateway's keys (runner.py): the answers come at the keys' own rate
limits and prices, in minutes, not in the Batch APIs' 24 hours nor at their discount; an
OpenAI batch's `metadata` says so (`ratedeck`), and so do the docs (docs/gateway.md).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ratedeck.gateway.server_log import why_of

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
#: OpenAI's bounds of a batch's `metadata`: pairs, a key's and a value's characters.
_METADATA_MAX, _KEY_MAX, _VALUE_MAX = 16, 64, 512
#: Anthropic's bounds of a message batch: its requests, and a request's `custom_id`.
_MESSAGE_REQUESTS_MAX = 100_000
_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
#: The `api` of a deleted message batch: kept so that its id stays gone (the store deletes no batch).
DELETED = "anthropic:deleted"

#: The paths the Batch APIs own (answered here, never sent to the target).
_PREFIXES = ("/v1/files", "/v1/batches", "/v1/messages/batches")

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, code: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}, status=status
    )


def _anthropic_error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response({"type": "error", "error": {"type": type_, "message": message}}, status=status)


async def _no_route(anthropic: bool, methods: list[str], request: web.Request, client: str) -> web.Response:
    """A path under the Batch APIs' prefixes that no route has (404), or not with this method (405)."""
    where = f"{request.method} {request.rel_url.path}"
    status, text = (
        (405, f"{where}: allowed {', '.join(sorted(set(methods)))}")
        if methods
        else (404, f"Not found: {where}")
    )
    answer = (
        _anthropic_error(status, text, "not_found_error" if status == 404 else "invalid_request_error")
        if anthropic
        else _error(status, text, "not_found" if status == 404 else "method_not_allowed")
    )
    if methods:
        answer.headers["Allow"] = ", ".join(sorted(set(methods)))
    return answer


def _rfc3339(t: int | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class BatchApi:
    """The routes above over a `BatchRunner` (its store); `route(method, path)` finds a handler."""

    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner
        self.store = runner.store
        self._last_ns = 0  # the time in the last batch id made here
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

    def _new_batch_id(self, prefix: str) -> str:
        """A batch id that sorts as the batches were made (the lists' order is newest first, and
        `created_at` is whole seconds): the time in ns, in hex, then random hex."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return f"{prefix}{self._last_ns:016x}{secrets.token_hex(4)}"

    def route(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
        """The handler for `method path` and its path's parts, or None (not a Batch API call).

        A path under the Batch APIs' prefixes is always answered here, never sent to the target
        with the keys: one no route has is 404, a route's other methods 405."""
        path = path.rstrip("/") or "/"
        if not any(path == p or path.startswith(p + "/") for p in _PREFIXES):
            return None
        methods = []
        for m, pattern, handler in self._routes:
            found = pattern.fullmatch(path)
            if found and m == method:
                return handler, found.groupdict()
            if found:
                methods.append(m)
        anthropic = path.startswith("/v1/messages/batches")
        return functools.partial(_no_route, anthropic, methods), {}

    # ---------------------------------------------------------- the client's own files and batches
    def _file(self, file_id: str, client: str) -> StoredFile | None:
        """The file, if it is `client`'s (a client sees only its own files and batches)."""
        f = self.store.get_file(file_id)
        return f if f is not None and f.client == client else None

    def _batch(self, batch_id: str, api: str, client: str) -> Batch | None:
        batch = self.store.get_batch(batch_id)
        return batch if batch is not None and batch.api == api and batch.client == client else None

    def _batches(self, api: str, client: str) -> list[Batch]:
        """`client`'s batches of `api`, newest first."""
        mine = [b for b in self.store.list_batches(api) if b.client == client]
        return sorted(mine, key=lambda b: (b.created_at, b.id), reverse=True)

    # ------------------------------------------------------------ OpenAI: files
    async def create_file(self, request: web.Request, client: str) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            return _error(
                400, "upload the file as multipart/form-data with 'file' and 'purpose'", "invalid_file"
            )
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "the upload is over the gateway's --max-body-mb", "file_too_large")
        except (ValueError, HttpProcessingError, web.RequestPayloadError) as exc:  # a broken multipart body
            return _error(400, f"the upload cannot be read ({why_of(exc)})", "invalid_file")
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
        data = [f.openai() for f in self.store.list_files() if f.client == client]
        return web.json_response({"object": "list", "data": data, "has_more": False})

    async def get_file(self, request: web.Request, client: str, id: str = "") -> web.Response:
        f = self._file(id, client)
        if f is None:
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.json_response(f.openai())

    async def file_content(self, request: web.Request, client: str, id: str = "") -> web.Response:
        f = self._file(id, client)
        if f is None:
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.Response(body=f.content, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request, client: str, id: str = "") -> web.Response:
        if self._file(id, client) is None or not self.store.delete_file(id):
            return _error(404, f"No such File object: {id}", "file_not_found")
        return web.json_response({"id": id, "object": "file", "deleted": True})

    # ------------------------------------------------------------ OpenAI: batches
    async def create_batch(self, request: web.Request, client: str) -> web.Response:
        body = await _json(request)
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request")
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        window, metadata = body.get("completion_window", "24h"), body.get("metadata")
        f = self._file(file_id, client) if isinstance(file_id, str) else None
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
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= _KEY_MAX and len(v) <= _VALUE_MAX
                for k, v in metadata.items()
            )
        ):
            return _error(
                400,
                f"metadata must be up to {_METADATA_MAX} pairs of strings: keys up to {_KEY_MAX} "
                f"characters, values up to {_VALUE_MAX}",
                "invalid_request",
            )
        meta = dict(metadata or {})
        if len(meta) < _METADATA_MAX:
            meta.setdefault("ratedeck", HONEST)
        batch = Batch(
            id=self._new_batch_id("batch_"),
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
        batches = self._batches("openai", client)
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
        batch = self._batch(id, "openai", client)
        if batch is None:
            return _error(404, f"No such Batch object: {id}", "batch_not_found")
        return web.json_response(self.openai_batch(batch))

    async def cancel_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self._batch(id, "openai", client)
        if batch is None:
            return _error(404, f"No such Batch object: {id}", "batch_not_found")
        if batch.status in FINAL:  # OpenAI's answer, word for word
            return _error(
                409, f"Cannot cancel a batch with status '{batch.status}'.", "batch_not_cancellable"
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
        if len(requests) > _MESSAGE_REQUESTS_MAX:
            return _anthropic_error(
                400, f"requests: at most {_MESSAGE_REQUESTS_MAX} in a batch, got {len(requests)}"
            )
        if (wrong := _check_message_requests(requests)) is not None:
            return _anthropic_error(400, wrong)
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
            id=self._new_batch_id("msgbatch_"),
            api="anthropic",
            status=VALIDATING,
            input_file_id=f.id,
            endpoint="/v1/messages",
            client=client,
            created_at=now_s(),
            total=len(requests),  # all `processing` from the start, as the API shows them
        )
        self.runner.start(batch)
        return web.json_response(self.anthropic_batch(batch, request))

    async def list_message_batches(self, request: web.Request, client: str) -> web.Response:
        batches = self._batches("anthropic", client)
        try:
            limit = max(1, min(1000, int(request.query.get("limit", "20"))))
        except ValueError:
            return _anthropic_error(400, "limit: must be a whole number from 1 to 1000")
        ids = [b.id for b in batches]
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after and before:
            return _anthropic_error(400, "after_id and before_id: give one of them, not both")
        if before:  # the page just newer than it (the list is newest first); more: newer still
            newer = batches[: ids.index(before)] if before in ids else []
            page, more = newer[-limit:], len(newer) > limit
        else:  # after_id: the page just older than it
            older = batches
            if after:
                older = batches[ids.index(after) + 1 :] if after in ids else []
            page, more = older[:limit], len(older) > limit
        return web.json_response(
            {
                "data": [self.anthropic_batch(b, request) for b in page],
                "has_more": more,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def get_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self._batch(id, "anthropic", client)
        if batch is None:
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        return web.json_response(self.anthropic_batch(batch, request))

    async def message_batch_results(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self._batch(id, "anthropic", client)
        if batch is None:
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        if batch.status not in FINAL or batch.output_file_id is None:
            return _anthropic_error(400, f"message batch {id} has not ended: its results are not ready")
        f = self.store.get_file(batch.output_file_id)
        content = f.content if f is not None else b""
        return web.Response(body=content, content_type="application/binary")

    async def cancel_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self._batch(id, "anthropic", client)
        if batch is None:
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        got = self.runner.cancel(id) if batch.status not in FINAL else batch
        assert got is not None
        return web.json_response(self.anthropic_batch(got, request))

    async def delete_message_batch(self, request: web.Request, client: str, id: str = "") -> web.Response:
        batch = self._batch(id, "anthropic", client)
        if batch is None:
            return _anthropic_error(404, f"message batch {id} not found", "not_found_error")
        if batch.status not in FINAL:
            return _anthropic_error(400, f"message batch {id} is still processing: cancel it first")
        # The store has no delete of a batch: it is kept as a tombstone no API serves (nor the
        # runner takes up, nor the snapshot shows), and its requests and results are deleted.
        batch.api = DELETED
        self.store.put_batch(batch)
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id is not None:
                self.store.delete_file(file_id)
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


def _check_message_requests(requests: list[Any]) -> str | None:
    """Why `requests` is not a message batch's, naming the first wrong request by its index
    (`requests.N.field: ...`, as the API does), or None."""
    seen: dict[str, int] = {}
    for n, r in enumerate(requests):
        at = f"requests.{n}"
        if not isinstance(r, dict):
            return f"{at}: must be an object {{custom_id, params}}"
        for name in ("custom_id", "params"):
            if name not in r:
                return f"{at}.{name}: Field required"
        extra = sorted(str(k) for k in r if k not in ("custom_id", "params"))
        if extra:
            return f"{at}: only custom_id and params are allowed; unknown: {', '.join(extra)}"
        cid, params = r["custom_id"], r["params"]
        if not isinstance(cid, str) or not _CUSTOM_ID.fullmatch(cid):
            return f"{at}.custom_id: must be 1 to 64 letters, digits, '_' or '-', got {_shown(cid)}"
        if cid in seen:
            return f"{at}.custom_id: {cid!r} is used twice (requests.{seen[cid]} has it)"
        seen[cid] = n
        if not isinstance(params, dict):
            return f"{at}.params: must be an object (a Messages API body), got {_shown(params)}"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None
