"""Batch files in the providers' own formats: read as workload lines, answered in their output format.

Two input formats are read as they are (the format is the first line's, and every line
must agree):

- OpenAI Batch input: ``{"custom_id", "method", "url", "body"}``, ``url`` a path on the
  target (``/v1/chat/completions``);
- Anthropic Message Batches requests: ``{"custom_id", "params"}``, ``params`` the body of a
  ``POST /v1/messages``.

Each line becomes ratedeck's own workload line (`translate`): ``_id`` is the ``custom_id``,
``_method``, ``_path`` and ``_body`` (the body, sent as it is) come from the line, and
``_batch`` names the format, so a results file (here or after a store) answers each line in
that API's output format (`output_record`): OpenAI's ``{"id", "custom_id", "response",
"error"}``, Anthropic's ``{"custom_id", "result"}``. ``_batch`` stays with the line's
parameters, which an object body never sends.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

#: The field of a translated line that names its batch format (kept in the request's params).
BATCH_FIELD = "_batch"

#: Where an Anthropic batch request goes.
ANTHROPIC_PATH = "/v1/messages"


class BatchFormat(StrEnum):
    """A provider's batch file format."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"

    @property
    def shown(self) -> str:
        return "an OpenAI Batch" if self is BatchFormat.OPENAI else "an Anthropic Message Batches"


_OPENAI_FIELDS = frozenset(("custom_id", "method", "url", "body"))
_ANTHROPIC_FIELDS = frozenset(("custom_id", "params"))


class BatchLineError(ValueError):
    """What is wrong with one batch line (the reader adds the file and line number)."""


def format_of(obj: dict[str, Any]) -> BatchFormat | None:
    """The batch format a line is written in; None: ratedeck's own workload line.

    A batch line names itself with `custom_id` beside the format's own fields and carries no
    underscore field (a ratedeck line may have a `custom_id` field of its own)."""
    if "custom_id" not in obj or any(isinstance(k, str) and k.startswith("_") for k in obj):
        return None
    openai = {"url", "method", "body"} & obj.keys()
    if "params" in obj and not openai:
        return BatchFormat.ANTHROPIC
    return BatchFormat.OPENAI if openai else None


def translate(obj: dict[str, Any], fmt: BatchFormat) -> dict[str, Any]:
    """`obj`, a line of a `fmt` batch file, as ratedeck's own workload line; `BatchLineError` if it is not one."""
    fields = _OPENAI_FIELDS if fmt is BatchFormat.OPENAI else _ANTHROPIC_FIELDS
    missing = sorted(fields - obj.keys())
    extra = sorted(obj.keys() - fields)
    what = f"{fmt.shown} line"
    if missing:
        raise BatchLineError(
            f"{what} needs {', '.join(missing)} (it has {', '.join(sorted(obj)) or 'nothing'})"
        )
    if extra:
        raise BatchLineError(f"{what} has only {', '.join(sorted(fields))}; unknown: {', '.join(extra)}")
    cid = obj["custom_id"]
    if not isinstance(cid, str) or not cid.strip():
        raise BatchLineError(f"custom_id must be a non-empty string, got {_show(cid)}")
    if fmt is BatchFormat.ANTHROPIC:
        params = obj["params"]
        if not isinstance(params, dict):
            raise BatchLineError(f"params must be a JSON object (the /v1/messages body), got {_show(params)}")
        return {
            "_id": cid,
            "_method": "POST",
            "_path": ANTHROPIC_PATH,
            "_body": params,
            BATCH_FIELD: fmt.value,
        }
    method, url, body = obj["method"], obj["url"], obj["body"]
    if not isinstance(method, str) or method.upper() not in ("POST", "PUT", "PATCH", "DELETE"):
        raise BatchLineError(f"method must be POST (or PUT, PATCH, DELETE), got {_show(method)}")
    if not isinstance(url, str) or not url.startswith("/") or any(c in url for c in "\r\n "):
        raise BatchLineError(f"url must be a path on the target starting with /, got {_show(url)}")
    if not isinstance(body, dict):
        raise BatchLineError(f"body must be a JSON object, got {_show(body)}")
    return {"_id": cid, "_method": method.upper(), "_path": url, "_body": body, BATCH_FIELD: fmt.value}


def batch_format(params: dict[str, Any] | None) -> BatchFormat | None:
    """The batch format of the line a request was made from (its params), or None."""
    value = params.get(BATCH_FIELD) if params else None
    try:
        return BatchFormat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- output


#: Endings with no answer to give, and the OpenAI error code (and Anthropic result type) for each.
_NO_ANSWER = {
    "expired": ("batch_expired", "expired", "the request's time-to-live passed before it could be sent"),
    "queued": ("batch_cancelled", "canceled", "the run stopped before the request was sent"),
    "shed": ("batch_cancelled", "canceled", "the request was refused before it was sent"),
    "in_flight": ("request_incomplete", "errored", "the run stopped before its answer came"),
    "uncertain": ("request_uncertain", "errored", "the request may have been done; no answer settles it"),
    "graveyard": ("request_failed", "errored", "the request failed"),
}


def output_record(
    fmt: BatchFormat,
    custom_id: Any,
    ending: str,
    status: int | None,
    body: Any,
    request_id: str | None,
    error: str | None,
) -> dict[str, Any]:
    """One line of `fmt`'s output file for a request that ended `ending`.

    `status` and `body` are the last answer's (None: no HTTP answer), `request_id` the
    server's id of it, `error` what the engine last noted. OpenAI writes the answer of every
    line that got one, errors included, and an `error` object for the rest; Anthropic a
    `result` whose type is succeeded (the message), errored (the error), canceled or expired.
    """
    if fmt is BatchFormat.OPENAI:
        return _openai(custom_id, ending, status, body, request_id, error)
    return _anthropic(custom_id, ending, status, body, request_id, error)


def _openai(
    custom_id: Any, ending: str, status: int | None, body: Any, request_id: str | None, error: str | None
) -> dict[str, Any]:
    line_id = "batch_req_" + hashlib.sha256(f"{custom_id}|{request_id}".encode()).hexdigest()[:24]
    record: dict[str, Any] = {"id": line_id, "custom_id": custom_id}
    if status is not None and ending not in ("queued", "expired", "shed", "in_flight"):
        record["response"] = {"status_code": status, "request_id": request_id, "body": body}
        record["error"] = None
        return record
    code, _kind, message = _NO_ANSWER.get(ending, ("request_failed", "errored", "the request failed"))
    record["response"] = None
    record["error"] = {"code": code, "message": f"{message}: {error}" if error else message}
    return record


def _anthropic(
    custom_id: Any, ending: str, status: int | None, body: Any, request_id: str | None, error: str | None
) -> dict[str, Any]:
    record: dict[str, Any] = {"custom_id": custom_id}
    if ending == "succeeded" and status is not None and 200 <= status < 300:
        record["result"] = {"type": "succeeded", "message": body}
    elif ending in ("queued", "shed", "expired"):
        record["result"] = {"type": _NO_ANSWER[ending][1]}
    else:
        if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
            err = dict(body)  # the API's own ErrorResponse
        else:
            message = _NO_ANSWER.get(ending, ("", "", "the request failed"))[2]
            if status is not None:
                message = f"HTTP {status}: {message}"
            err = {
                "type": "error",
                "error": {"type": "api_error", "message": f"{message}: {error}" if error else message},
            }
        err.setdefault("request_id", request_id)
        record["result"] = {"type": "errored", "error": err}
    if request_id is not None:
        record["request_id"] = request_id
    return record


def failed(record: dict[str, Any]) -> bool:
    """Whether an output line belongs in the errors file (the Batch APIs' error file)."""
    if "result" in record:
        return record["result"].get("type") != "succeeded"
    response = record.get("response")
    return response is None or not 200 <= int(response.get("status_code") or 0) < 300
