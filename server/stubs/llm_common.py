"""What the two LLM stubs (openai, anthropic) share: a continuously refilled bucket, token estimates.

Both OpenAI and Anthropic describe their per-minute limits as buckets that refill
continuously (a limit of N per minute refills N/60 per second up to N), not as fixed
windows. ``minute_s`` scales the "minute" so tests and benchmarks run fast.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .common import Ledger

# a clock near 1.7e9 s has a 2.4e-7 s resolution: at thousands of tokens a second that is ~1e-3
# token of noise, which must not turn "full" into "one short"
EPS = 1e-3


@dataclass
class Bucket:
    """``capacity`` units, refilled at ``capacity / period`` per second, starting full."""

    capacity: float
    period: float
    level: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = self.capacity

    @property
    def rate(self) -> float:
        return self.capacity / self.period if self.period > 0 else math.inf

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are available (0 if they are now)."""
        self.refill(now)
        missing = amount - self.level
        return 0.0 if missing <= EPS else missing / self.rate

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)

    def full_in(self, now: float) -> float:
        """Seconds until the bucket is full again: the documented "reset"."""
        self.refill(now)
        return max(0.0, (self.capacity - self.level) / self.rate)

    def remaining(self, now: float) -> int:
        self.refill(now)
        return max(0, math.floor(self.level + EPS))


def estimate_tokens(text: str) -> int:
    """The stubs' prompt-token estimate: characters / 4, rounded up."""
    return math.ceil(len(text) / 4)


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_identity(payload: Any) -> str:
    """A stable hash of a prompt (the messages, and the system prompt where there is one)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class PromptBook:
    """Per key: how many times each prompt was accepted, and refusals by code."""

    prompts: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    refusals: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def duplicates(self, key: str | None = None) -> int:
        """Accepted requests whose prompt had already been accepted on the same key (or any key)."""
        if key is None:
            merged: Counter[str] = Counter()
            for c in self.prompts.values():
                merged.update(c)
            return sum(n - 1 for n in merged.values() if n > 1)
        return sum(n - 1 for n in self.prompts[key].values() if n > 1)


def mask(key: str) -> str:
    return f"{key[:4]}...{key[-2:]}" if len(key) > 8 else "****"


@dataclass
class Call:
    """One request to an LLM stub: its arrival, the key it came with, and its ledger record."""

    ledger: Ledger
    request: web.Request
    now: float
    key: str
    bucket: str
    model: str = ""  # whose buckets it spends, with limits per model ("" without)

    def record(self, status: int, outcome: str, cost: float = 0.0, detail: str = "") -> None:
        self.ledger.add(
            at=self.now,
            key=self.key,
            method=self.request.method,
            path=self.request.path,
            status=status,
            outcome=outcome,
            bucket=self.bucket,
            cost=cost,
            detail=detail,
        )


# ---------------------------------------------------------------- streamed answers ("stream": true)


@dataclass
class Answered:
    """One answer as the stub wrote it, kept so a test can compare what a client received
    with what the server sent; a stream's fields move while it is being written."""

    id: str
    key: str
    text: str  # the whole answer's text
    streamed: bool = False
    total: int = 0  # events the whole stream has
    events: int = 0  # events written so far
    sent_text: str = ""  # the text of the events written so far
    ended: str = ""  # "" while being written; "done", "broken" (break_after), "client_gone"
    connection: Any = None  # the stream's connection (its transport), while it is written

    def hung_up(self) -> bool:
        """The client closed the stream's connection (the stub has seen it go)."""
        return self.connection is None or self.connection.is_closing()

    @property
    def writing(self) -> bool:
        return self.ended == ""


@dataclass
class StreamOptions:
    """How the LLM stubs stream: pacing and the faults a test asks for.

    ``event_s`` spreads the answer over time, as a model's tokens come (a real wait
    between events); ``break_after`` cuts the connection after that many events (no
    closing chunk: the client sees an incomplete body); ``hold`` stops the stream after
    ``hold_after`` events until a test sets it, so a test can look at a half-written
    answer without timing anything.
    """

    event_s: float = 0.002
    tokens_per_event: int = 1
    break_after: int | None = None
    hold_after: int = 1
    hold: asyncio.Event | None = None


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line, its ``data:`` line (JSON unless a
    string), and the blank line that ends it."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def pieces(tokens: int, per_event: int, word: str = "stub ") -> list[str]:
    """The answer's text (``word`` per token) cut into one piece per event."""
    step = max(1, per_event)
    return [word * min(step, tokens - i) for i in range(0, tokens, step)]


async def write_stream(
    request: web.Request,
    events: list[tuple[bytes, str]],
    headers: dict[str, str],
    options: StreamOptions,
    log: Answered,
) -> web.StreamResponse:
    """Write ``events`` (each its bytes and the answer text it carries) as a ``text/event-stream``,
    paced and faulted as ``options`` says, keeping ``log`` up to date as each goes out."""
    resp = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", **headers},
    )
    log.streamed, log.total = True, len(events)
    log.connection = request.transport
    try:
        await resp.prepare(request)
        for i, (event, text) in enumerate(events):
            if options.break_after is not None and i == options.break_after:
                log.ended = "broken"
                if request.transport is not None:
                    request.transport.close()  # what was written goes out, the closing chunk never
                return resp
            if i and options.event_s > 0:
                await asyncio.sleep(options.event_s)
            await resp.write(event)
            log.events, log.sent_text = i + 1, log.sent_text + text
            if options.hold is not None and log.events == options.hold_after:
                await options.hold.wait()
        await resp.write_eof()
        log.ended = "done"
    except (ConnectionError, RuntimeError):  # the client hung up (aiohttp's reset is a ConnectionError)
        log.ended = "client_gone"
    return resp


# ---------------------------------------------------------------- OpenAI-shaped chat answers


def chat_usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_prompt_tokens(messages: list[Any]) -> int:
    """The prompt estimate of an OpenAI-shaped ``messages`` list (``estimate_tokens`` of each content)."""
    return sum(estimate_tokens(content_text(m.get("content"))) for m in messages if isinstance(m, dict))


def chat_chunks(
    answer_id: str,
    created: int,
    model: str,
    completion: int,
    finish: str,
    usage: dict[str, int] | None,
    tokens_per_event: int,
) -> list[tuple[bytes, str]]:
    """A streamed answer as OpenAI sends it: a first chunk with the role, the text in
    ``chat.completion.chunk`` deltas, one with the finish reason; with ``include_usage`` every
    chunk has ``"usage": null`` and one more, with no choices, carries the usage; then
    ``data: [DONE]``."""
    base = {"id": answer_id, "object": "chat.completion.chunk", "created": created, "model": model}
    extra = {"usage": None} if usage is not None else {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return sse({**base, "system_fingerprint": None, "choices": [choice], **extra})

    events = [(chunk({"role": "assistant", "content": "", "refusal": None}), "")]
    events += [(chunk({"content": p}), p) for p in pieces(completion, tokens_per_event)]
    events.append((chunk({}, finish), ""))
    if usage is not None:
        events.append((sse({**base, "system_fingerprint": None, "choices": [], "usage": usage}), ""))
    events.append((sse("[DONE]"), ""))
    return events


async def answer_chat(
    request: web.Request,
    body: dict[str, Any],
    *,
    log: Answered,
    created: int,
    model: str,
    prompt: int,
    completion: int,
    max_tokens: int,
    headers: dict[str, str],
    streaming: StreamOptions,
) -> web.StreamResponse:
    """An accepted chat request's ``chat.completion`` (``log.text`` as its content): sent whole,
    or streamed (``chat_chunks``) when the body asks ``"stream": true``."""
    finish = "length" if completion == max_tokens else "stop"
    usage = chat_usage(prompt, completion)
    if body.get("stream") is True:
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        events = chat_chunks(
            log.id,
            created,
            model,
            completion,
            finish,
            usage if with_usage else None,
            streaming.tokens_per_event,
        )
        return await write_stream(request, events, headers, streaming, log)
    answer = {
        "id": log.id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": log.text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage,
    }
    log.sent_text, log.ended = log.text, "done"
    return web.Response(text=json.dumps(answer), content_type="application/json", headers=headers)
