"""Anthropic Messages stub: requests, input and output tokens per minute as token buckets, 429 and 529.

What the public docs say, and what this stub does with it
(docs.anthropic.com/en/api/rate-limits, "Rate limits" and "Response headers";
docs.anthropic.com/en/api/errors, HTTP errors 429 ``rate_limit_error`` and 529
``overloaded_error``; docs.anthropic.com/en/api/versioning; the official pages were not in
the searchable corpus, so header names and error shapes were checked against secondary
pages quoting them, e.g. runcycles.io/troubleshoot/anthropic-rate-limit-error):

- ``POST /v1/messages`` with ``x-api-key: KEY`` and ``anthropic-version`` (required: a
  400 ``invalid_request_error`` without it). An unknown key: 401 ``authentication_error``.
- Per key, three limits: requests (``rpm``), input tokens (``itpm``) and output tokens
  (``otpm``) per minute, each a token bucket "continuously replenished up to your
  maximum limit" (the docs' words); ``minute_s`` scales the minute.
- Input tokens are charged at admission (estimated: characters / 4 of the system prompt
  and the messages' text, rounded up). Output tokens are reserved from ``max_tokens`` at
  the start and settled to the real output at the end: the unused part goes back to the
  bucket (the docs: "OTPM rate limits are estimated based on max_tokens at the beginning
  of each request and adjusted at the end of the request").
- Every answer to a known key carries ``anthropic-ratelimit-requests-limit``,
  ``-remaining``, ``-reset`` and the same for ``anthropic-ratelimit-input-tokens-*`` and
  ``anthropic-ratelimit-output-tokens-*``; a reset is the RFC 3339 time the bucket is
  fully replenished (with milliseconds, since the minute may be scaled).
- Over a limit: 429 with ``retry-after`` (whole seconds, rounded up) and
  ``{"type": "error", "error": {"type": "rate_limit_error", "message": ...}}``; the
  refused request is charged nothing.
- Limits per model (the docs: "rate limits are applied separately for each model; therefore
  you can use different models up to their respective limits simultaneously"): with
  ``models`` (``{"claude-haiku-4-5": {"rpm": 50, "itpm": 50000, "otpm": 10000}, ...}``)
  every key has the three buckets per model, an answer's headers are those of the model
  its request named, and a model not listed is 404 ``not_found_error`` ("model: x"),
  charged nothing. Without ``models`` every model shares one set per key.
- ``overload_share`` of requests (or an exact ``overload_pattern`` of booleans) answer
  529 ``overloaded_error``, charging nothing (server load, not the key's limits).

Where the docs are silent (stated choices): the limits are checked requests, input,
output; ``output_tokens`` is ``ceil(max_tokens * output_ratio)`` (deterministic,
<= max_tokens); the headers of a success are taken after the settle. The combined
``anthropic-ratelimit-tokens-*`` headers are not sent.

Streaming (``"stream": true``), as the Messages streaming docs describe it: named events
``message_start`` (usage: the input tokens), ``content_block_start``, ``ping``,
``content_block_delta`` (``text_delta``), ``content_block_stop``, ``message_delta`` (the stop
reason; usage: the output tokens), ``message_stop``. Its headers go out first, so they show
the output reserved, not yet settled; the settle and the ledger's record come when the stream
ends, however it ends. Pacing and faults: ``StreamOptions`` (``streaming``).

Ledger: one ``Record`` per request (``bucket="messages"``; ``cost`` = input + settled
output tokens; ``detail`` = the prompt's identity when accepted, the error type when
refused). ``state.answered`` keeps each answer's text (and a stream's progress, ``Answered``);
``state.book`` counts prompts per key (duplicates) and refusals by type.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .common import Clock, Ledger, Stub, mono_clock, serve, work
from .llm_common import (
    Answered,
    Bucket,
    Call,
    PromptBook,
    StreamOptions,
    content_text,
    estimate_tokens,
    pieces,
    prompt_identity,
    sse,
    write_stream,
)

PATH = "/v1/messages"


def rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def error(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"type": "error", "error": {"type": type_, "message": message}}
    return web.json_response(body, status=status, headers=headers or {})


@dataclass
class AnthropicState:
    clock: Clock = mono_clock
    keys: Iterable[str] = ("sk-ant-test",)
    rpm: int = 50
    itpm: int = 30_000
    otpm: int = 8_000
    minute_s: float = 60.0
    overload_share: float = 0.0
    overload_pattern: list[bool] | None = None
    output_ratio: float = 0.5
    model: str = "claude-sonnet-4-5"
    latency: float = 0.0
    hold: asyncio.Event | None = None
    seed: int = 0
    # Wall time minus the clock's: resets are wall-clock times, as the real API's are (a test's
    # fake clock already reads wall-like times: 0).
    wall_offset: float | None = None
    organization: str = "00000000-stub-org"  # the anthropic-organization-id a success carries
    models: dict[str, dict[str, int]] | None = None  # per model {"rpm", "itpm", "otpm"}; None: one for all
    streaming: StreamOptions = field(default_factory=StreamOptions)
    ledger: Ledger = field(default_factory=Ledger)
    book: PromptBook = field(default_factory=PromptBook)
    answered: list[Answered] = field(default_factory=list)  # every answer's text, as written

    def __post_init__(self) -> None:
        self.keys = list(self.keys)
        t0 = self.clock()
        self.buckets = {
            k: {
                "requests": Bucket(self.rpm, self.minute_s, updated=t0),
                "input-tokens": Bucket(self.itpm, self.minute_s, updated=t0),
                "output-tokens": Bucket(self.otpm, self.minute_s, updated=t0),
            }
            for k in self.keys
        }
        limits = {m: (v["rpm"], v["itpm"], v["otpm"]) for m, v in (self.models or {}).items()}
        self.model_buckets = {
            (k, m): {
                "requests": Bucket(rpm, self.minute_s, updated=t0),
                "input-tokens": Bucket(itpm, self.minute_s, updated=t0),
                "output-tokens": Bucket(otpm, self.minute_s, updated=t0),
            }
            for k in self.keys
            for m, (rpm, itpm, otpm) in limits.items()
        }
        self.rng = random.Random(self.seed)
        self.seq = 0
        self.output_used: dict[str, int] = dict.fromkeys(self.keys, 0)  # settled output tokens, per key
        if self.wall_offset is None:
            self.wall_offset = time.time() - time.monotonic() if self.clock is mono_clock else 0.0

    def allowed_capacity(
        self,
        start: float,
        end: float,
        *,
        key: str | None = None,
        bucket: str | None = None,
        model: str | None = None,
    ) -> float:
        """Units of ``bucket`` (default output-tokens) an ideal client could use in [start, end),
        of ``model`` with limits per model (every model's without one)."""
        name = bucket if bucket in ("requests", "input-tokens") else "output-tokens"
        if self.models is not None:
            first = self.keys[0] if isinstance(self.keys, list) else next(iter(self.keys))
            names = [model] if model is not None else list(self.models)
            limit = sum(int(self.model_buckets[first, m][name].capacity) for m in names)
        else:
            limit = {"requests": self.rpm, "input-tokens": self.itpm}.get(name, self.otpm)
        n = 1 if key is not None else len(list(self.keys))
        return n * (limit + limit * max(0.0, end - start) / self.minute_s)

    def bank(self, key: str, model: str = "") -> dict[str, Bucket]:
        """The buckets a request of `key` naming `model` spends (the key's own without ``models``)."""
        return self.model_buckets[key, model] if self.models is not None else self.buckets[key]

    def headers(self, key: str, now: float, model: str = "") -> dict[str, str]:
        out = {}
        offset = self.wall_offset or 0.0
        for name, b in self.bank(key, model).items():
            out[f"anthropic-ratelimit-{name}-limit"] = str(int(b.capacity))
            out[f"anthropic-ratelimit-{name}-remaining"] = str(b.remaining(now))
            out[f"anthropic-ratelimit-{name}-reset"] = rfc3339(now + offset + b.full_in(now))
        return out

    def overloaded(self) -> bool:
        if self.overload_pattern is not None:
            return self.overload_pattern.pop(0) if self.overload_pattern else False
        return self.overload_share > 0 and self.rng.random() < self.overload_share

    async def handle(self, request: web.Request) -> web.StreamResponse:
        now = self.clock()
        key = request.headers.get("x-api-key", "")
        call = Call(self.ledger, request, now, key, "messages")
        if key not in self.buckets:
            call.record(401, "unauthorized")
            return error(401, "authentication_error", "invalid x-api-key")
        if request.method != "POST" or request.path != PATH:
            call.record(404, "not_found")
            return error(404, "not_found_error", f"Not found: {request.method} {request.path}")
        if not request.headers.get("anthropic-version"):
            call.record(400, "invalid_request", detail="anthropic-version")
            return error(
                400, "invalid_request_error", "anthropic-version: header is required", self.headers(key, now)
            )
        if self.models is not None:
            call.model = next(iter(self.models))  # the headers of an answer to no model
        body = await self.read_body(call)
        if isinstance(body, web.Response):
            return body
        if self.models is not None:
            model = body.get("model")
            if not isinstance(model, str) or model not in self.models:
                call.record(404, "model_not_found", detail="not_found_error")
                return error(404, "not_found_error", f"model: {model}")
            call.model = call.bucket = model
        if self.overloaded():
            self.book.refusals[key]["overloaded_error"] += 1
            call.record(529, "overloaded", detail="overloaded_error")
            return error(529, "overloaded_error", "Overloaded", self.headers(key, now, call.model))
        messages, max_tokens = body["messages"], int(body["max_tokens"])
        system = body.get("system", "")
        text = content_text(system) + "".join(
            content_text(m.get("content")) for m in messages if isinstance(m, dict)
        )
        input_tokens = estimate_tokens(text)
        wants = {"requests": 1, "input-tokens": input_tokens, "output-tokens": max_tokens}
        refused = self.charge_limits(call, wants)
        if refused is not None:
            return refused
        identity = prompt_identity({"system": system, "messages": messages})
        self.book.prompts[key][identity] += 1

        await work(self.latency, self.hold)
        return await self.answer(
            request,
            body,
            key,
            input_tokens,
            max_tokens,
            lambda cost: call.record(200, "ok", cost, identity),
            call.model,
        )

    async def read_body(self, call: Call) -> dict[str, Any] | web.Response:
        try:
            body = await call.request.json()
            messages = body["messages"]
            max_tokens = int(body["max_tokens"])
            if not isinstance(messages, list) or max_tokens < 1:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            call.record(400, "invalid_request")
            return error(
                400,
                "invalid_request_error",
                "messages: field required; max_tokens: field required (>= 1)",
                self.headers(call.key, call.now, call.model),
            )
        return body

    def charge_limits(self, call: Call, wants: dict[str, int]) -> web.Response | None:
        """Every bucket must have room; the refusal names the first that has none."""
        key, now = call.key, call.now
        b = self.bank(key, call.model)
        waits = {name: b[name].wait_for(amount, now) for name, amount in wants.items()}
        over = [name for name, w in waits.items() if w > 0]
        if not over:
            for name, amount in wants.items():
                b[name].take(amount, now)
            return None
        wait = max(waits.values())
        self.book.refusals[key]["rate_limit_error"] += 1
        call.record(429, "rate_limited", detail=f"rate_limit_error:{over[0]}")
        headers = {"retry-after": str(max(1, math.ceil(wait))), **self.headers(key, now, call.model)}
        kind = over[0].replace("-", " ")
        return error(
            429,
            "rate_limit_error",
            f"This request would exceed the rate limit for your organization of "
            f"{int(b[over[0]].capacity)} {kind} per minute. For details, refer to: "
            "https://docs.anthropic.com/en/api/rate-limits.",
            headers,
        )

    async def answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        key: str,
        input_tokens: int,
        max_tokens: int,
        record: Callable[[float], None],
        lane: str = "",
    ) -> web.StreamResponse:
        """An accepted request's message, sent whole or streamed when the body asks, its output
        settled (and `record`ed with its cost) once it is written."""
        b = self.bank(key, lane)
        output_tokens = min(max_tokens, math.ceil(max_tokens * self.output_ratio))
        self.seq += 1
        answer_id = f"msg_stub{self.seq:012d}"
        text = "stub " * output_tokens
        log = Answered(answer_id, key, text)
        self.answered.append(log)
        stop = "max_tokens" if output_tokens == max_tokens else "end_turn"
        model = body.get("model", self.model)
        account = {"anthropic-organization-id": self.organization, "request-id": f"req_stub{self.seq:012d}"}
        if body.get("stream") is True:
            # The headers go before the answer: they show the output reserved, not yet settled.
            headers = {**self.headers(key, self.clock(), lane), **account}
            events = self.events(answer_id, model, input_tokens, output_tokens, stop)
            try:
                return await write_stream(request, events, headers, self.streaming, log)
            finally:  # settled as an answer sent whole is, however the stream ended
                b["output-tokens"].give_back(max_tokens - output_tokens, self.clock())
                self.output_used[key] += output_tokens
                record(input_tokens + output_tokens)
        end = self.clock()
        b["output-tokens"].give_back(max_tokens - output_tokens, end)  # the settle
        self.output_used[key] += output_tokens
        record(input_tokens + output_tokens)
        answer = {
            "id": answer_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        log.sent_text, log.ended = text, "done"
        return web.Response(
            text=json.dumps(answer),
            content_type="application/json",
            headers={**self.headers(key, end, lane), **account},
        )

    def events(
        self, answer_id: str, model: str, input_tokens: int, output_tokens: int, stop: str
    ) -> list[tuple[bytes, str]]:
        """A streamed message as Anthropic sends it: ``message_start`` (its usage: the input
        tokens, one output token), ``content_block_start``, ``ping``, the text in
        ``content_block_delta`` events, ``content_block_stop``, ``message_delta`` (the stop reason
        and the output tokens), ``message_stop``."""
        message: dict[str, Any] = {
            "id": answer_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }
        events = [
            (sse({"type": "message_start", "message": message}, "message_start"), ""),
            (
                sse(
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                    "content_block_start",
                ),
                "",
            ),
            (sse({"type": "ping"}, "ping"), ""),
        ]
        for piece in pieces(output_tokens, self.streaming.tokens_per_event):
            delta = {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }
            events.append((sse(delta, "content_block_delta"), piece))
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
        events += [
            (sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), ""),
            (sse(delta, "message_delta"), ""),
            (sse({"type": "message_stop"}, "message_stop"), ""),
        ]
        return events


async def start_anthropic(*, clock: Clock = mono_clock, **options: Any) -> Stub:
    """Start the Anthropic stub; options are `AnthropicState`'s (keys, rpm, itpm, otpm, minute_s, ...)."""
    state = AnthropicState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
