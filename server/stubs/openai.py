"""OpenAI Chat Completions stub: per-organisation requests and tokens per minute, x-ratelimit-* headers.

What the public docs say, and what this stub does with it
(platform.openai.com/docs/guides/rate-limits, "Rate limits in headers";
platform.openai.com/docs/guides/error-codes, 429 "Rate limit reached for requests" and
"You exceeded your current quota"; help.openai.com/en/articles/6891829; the header table was checked against a mirror of
the rate-limits guide, spybara.com/openai/api/history/docs/en/, as the official page
was not in the searchable corpus):

- ``POST /v1/chat/completions`` with ``Authorization: Bearer KEY``; each key plays one
  organisation. An unknown key: 401 ``invalid_api_key``.
- Two limits per key: requests per minute (``rpm``) and tokens per minute (``tpm``).
  Each is a continuously refilled bucket (the limit refills over the minute; ``minute_s``
  scales the minute so tests run fast).
- A request is charged at admission (the docs: the token limit counts the prompt and
  ``max_tokens``): estimated prompt tokens (characters of the messages' content / 4,
  rounded up) + ``max_tokens`` (or ``max_completion_tokens``; ``default_max_tokens`` if
  both are absent). Nothing is refunded when the completion is shorter.
- Every answer to a known key carries ``x-ratelimit-limit-requests``,
  ``x-ratelimit-limit-tokens``, ``x-ratelimit-remaining-requests``,
  ``x-ratelimit-remaining-tokens``, ``x-ratelimit-reset-requests``,
  ``x-ratelimit-reset-tokens``; a reset is the time until that bucket is full again,
  written as the docs' samples are (``12ms``, ``1.4s``, ``6m0s``).
  With ``limit_headers=False`` none of them is sent (an "OpenAI-compatible" provider
  that tells nothing of its limits).
- Over a limit: 429 ``{"error": {"message": "Rate limit reached for ... Please try again
  in 1.4s. ...", "type": "requests"|"tokens", "param": null, "code":
  "rate_limit_exceeded"}}``; "try again in" is the time until this request would fit.
  The refused request is charged nothing.
- A key listed in ``no_quota``: 429 ``insufficient_quota`` on every request (billing,
  not rate: retrying does not help).
- Limits per model (the guide: "rate limits vary by the model being used"; each model
  has its own requests and tokens per minute): with ``models`` (``{"gpt-4o-mini":
  {"rpm": 500, "tpm": 200000}, ...}``) every key has a requests and a tokens bucket per
  model, the ``x-ratelimit-*`` headers of an answer are those of the model its request
  named, and a model not listed is 404 ``model_not_found`` ("The model `x` does not
  exist or you do not have access to it."), charged nothing. Without ``models`` every
  model shares one pair of buckets per key (``rpm``, ``tpm``).

Where the docs are silent (stated choices): the requests bucket is checked before the
tokens bucket (the 429 names the first that refuses); ``completion_tokens`` is
``ceil(max_tokens * completion_ratio)`` (deterministic, <= max_tokens).

Streaming (``"stream": true``), as the API reference describes it: ``text/event-stream``, one
``data:`` line per ``chat.completion.chunk`` (the role first, then the text in deltas, then the
finish reason), with ``stream_options.include_usage`` a last chunk with empty ``choices`` and the
usage (the others then carry ``"usage": null``), and ``data: [DONE]``. Pacing and faults:
``StreamOptions`` (``streaming``). Tokens are charged exactly as for an answer sent whole.

Ledger: one ``Record`` per request (``bucket="chat"``, with ``models`` the model's name; ``cost`` = tokens charged;
``detail`` = the prompt's identity when accepted, the error code when refused).
``state.answered`` keeps each answer's text (and a stream's progress, ``Answered``);
``state.book.prompts[key]`` counts each prompt accepted, ``state.book.duplicates(key)``
the repeats, ``state.book.refusals[key]`` the 429s by code.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .common import Clock, Ledger, Stub, mono_clock, serve, work
from .llm_common import (
    Answered,
    Bucket,
    Call,
    PromptBook,
    StreamOptions,
    answer_chat,
    chat_prompt_tokens,
    mask,
    prompt_identity,
)

PATH = "/v1/chat/completions"


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``12ms`` under a second, ``1.4s`` under a minute, ``6m0s`` above."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 1000) / 1000:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours}h{minutes}m{rest}s"
    return f"{minutes}m{rest}s"


def parse_duration(text: str) -> float:
    """Seconds in an OpenAI reset duration (``1h2m3.5s``, ``12ms``)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def error(status: int, message: str, type_: str, code: str | None, **extra: str) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=extra)


@dataclass
class OpenAIState:
    clock: Clock = mono_clock
    keys: Iterable[str] = ("sk-test",)
    rpm: int = 500
    tpm: int = 30_000
    minute_s: float = 60.0
    no_quota: Iterable[str] = ()
    default_max_tokens: int = 256
    completion_ratio: float = 0.5
    model: str = "gpt-4o-mini"
    latency: float = 0.0
    hold: asyncio.Event | None = None
    organization: str = "org-stub"  # the openai-organization header a success carries
    models: dict[str, dict[str, int]] | None = None  # per model {"rpm": .., "tpm": ..}; None: one for all
    streaming: StreamOptions = field(default_factory=StreamOptions)
    limit_headers: bool = True  # False: no x-ratelimit-* header at all (an "OpenAI-compatible" provider)
    ledger: Ledger = field(default_factory=Ledger)
    book: PromptBook = field(default_factory=PromptBook)
    answered: list[Answered] = field(default_factory=list)  # every answer's text, as written

    def __post_init__(self) -> None:
        self.keys = list(self.keys)
        self.no_quota = set(self.no_quota)
        t0 = self.clock()
        # The buckets by (key, model); without per-model limits every model is "" (one pair a key).
        self.limits = {m: (v["rpm"], v["tpm"]) for m, v in (self.models or {"": {}}).items() if m} or {
            "": (self.rpm, self.tpm)
        }
        self.requests = {
            (k, m): Bucket(rpm, self.minute_s, updated=t0)
            for k in self.keys
            for m, (rpm, _) in self.limits.items()
        }
        self.tokens = {
            (k, m): Bucket(tpm, self.minute_s, updated=t0)
            for k in self.keys
            for m, (_, tpm) in self.limits.items()
        }
        self.known = set(self.keys)
        self.seq = 0

    def lane(self, model: Any) -> str | None:
        """Whose buckets a request naming `model` spends: the model's ("" without per-model
        limits); None for a model this stub does not know."""
        if self.models is None:
            return ""
        return model if isinstance(model, str) and model in self.limits else None

    def allowed_capacity(
        self,
        start: float,
        end: float,
        *,
        key: str | None = None,
        bucket: str | None = None,
        model: str | None = None,
    ) -> float:
        """Tokens (or with ``bucket="requests"`` requests) an ideal client could be charged in
        [start, end): a full bucket + the refill, of ``model`` (every model's without one)."""
        n = 1 if key is not None else len(list(self.keys))
        lanes = [self.limits[model]] if model is not None else list(self.limits.values())
        size = sum(rpm if bucket == "requests" else tpm for rpm, tpm in lanes)
        return n * (size + size * max(0.0, end - start) / self.minute_s)

    def headers(self, key: str, now: float, model: str = "") -> dict[str, str]:
        if not self.limit_headers:
            return {}
        r, t = self.requests[key, model], self.tokens[key, model]
        return {
            "x-ratelimit-limit-requests": str(int(r.capacity)),
            "x-ratelimit-limit-tokens": str(int(t.capacity)),
            "x-ratelimit-remaining-requests": str(r.remaining(now)),
            "x-ratelimit-remaining-tokens": str(t.remaining(now)),
            "x-ratelimit-reset-requests": duration(r.full_in(now)),
            "x-ratelimit-reset-tokens": duration(t.full_in(now)),
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        now = self.clock()
        auth = request.headers.get("Authorization", "")
        scheme, _, key = auth.partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""
        call = Call(self.ledger, request, now, key, "chat")
        if key not in self.known:
            call.record(401, "unauthorized")
            return error(
                401,
                f"Incorrect API key provided: {mask(key)}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        if request.method != "POST" or request.path != PATH:
            call.record(404, "not_found")
            return error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error", None)
        body = await self.read_body(call)
        if isinstance(body, web.Response):
            return body
        lane = self.lane(body.get("model"))
        if lane is None:
            call.record(404, "model_not_found", detail="model_not_found")
            return error(
                404,
                f"The model `{body.get('model')}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            )
        call.model = lane
        if lane:
            call.bucket = lane  # with limits per model, the ledger names the model
        refused = self.check_quota(call)
        if refused is not None:
            return refused
        messages = body["messages"]
        prompt = chat_prompt_tokens(messages)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or self.default_max_tokens
        max_tokens = int(max_tokens)
        cost = prompt + max_tokens
        refused = self.check_limits(call, cost)
        if refused is not None:
            return refused
        headers = await self.admit(call, messages, cost)
        return await self.answer(request, body, key, now, prompt, max_tokens, headers)

    async def read_body(self, call: Call) -> dict[str, Any] | web.Response:
        try:
            body = await call.request.json()
            messages = body["messages"]
            if not isinstance(messages, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            call.record(400, "invalid_request")
            return error(
                400,
                "'messages' is a required property",
                "invalid_request_error",
                None,
                **self.headers(call.key, call.now, self.lane(None) or next(iter(self.limits))),
            )
        return body

    def check_quota(self, call: Call) -> web.Response | None:
        key = call.key
        if key not in self.no_quota:
            return None
        self.book.refusals[key]["insufficient_quota"] += 1
        call.record(429, "insufficient_quota", detail="insufficient_quota")
        return error(
            429,
            "You exceeded your current quota, please check your plan and billing details. For more "
            "information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "insufficient_quota",
            "insufficient_quota",
            **self.headers(key, call.now, call.model),
        )

    def check_limits(self, call: Call, cost: int) -> web.Response | None:
        """The requests bucket, then the tokens bucket; the first that refuses is named."""
        key, now, model = call.key, call.now, call.model
        r, t = self.requests[key, model], self.tokens[key, model]
        for kind, bucket, amount, unit, label in (
            ("requests", r, 1, "requests per min (RPM)", "requests"),
            ("tokens", t, cost, "tokens per min (TPM)", "tokens"),
        ):
            wait = bucket.wait_for(amount, now)
            if wait > 0:
                used = bucket.capacity - bucket.remaining(now)
                # "unsuccessful requests contribute to your per-minute limit, so continuously
                # resending a request won't work" (OpenAI's help on 429s): a refusal spends a
                # request too, down to an empty bucket, never its tokens; the wait it tells
                # counts that (a client that waits as told gets through)
                r.refill(now)
                r.level = max(0.0, r.level - 1.0)
                wait = max(wait, bucket.wait_for(amount, now))
                self.book.refusals[key]["rate_limit_exceeded"] += 1
                call.record(429, "rate_limited", detail=f"rate_limit_exceeded:{label}")
                return error(
                    429,
                    f"Rate limit reached for {model or self.model} in organization org-{mask(key)} on {unit}: "
                    f"Limit {int(bucket.capacity)}, Used {int(used)}, Requested {amount}. "
                    f"Please try again in {duration(wait)}. Visit "
                    "https://platform.openai.com/account/rate-limits to learn more.",
                    kind,
                    "rate_limit_exceeded",
                    **self.headers(key, now, model),
                )
        return None

    async def admit(self, call: Call, messages: list[Any], cost: int) -> dict[str, str]:
        """Charge an accepted request, record it, and the headers its answer carries."""
        key, now = call.key, call.now
        self.requests[key, call.model].take(1, now)
        self.tokens[key, call.model].take(cost, now)
        identity = prompt_identity(messages)
        self.book.prompts[key][identity] += 1
        call.record(200, "ok", cost=cost, detail=identity)
        headers = self.headers(key, now, call.model)
        await work(self.latency, self.hold)
        # as OpenAI's answers say it: the server's own time on the request, in whole ms
        headers["openai-processing-ms"] = str(max(0, round((self.clock() - now) * 1000)))
        headers["openai-organization"] = self.organization
        return headers

    async def answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        key: str,
        now: float,
        prompt: int,
        max_tokens: int,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        """An accepted request's completion: sent whole, or streamed when the body asks."""
        completion = min(max_tokens, math.ceil(max_tokens * self.completion_ratio))
        self.seq += 1
        headers = {**headers, "x-request-id": f"req_stub{self.seq:010d}"}  # as every OpenAI answer has
        log = Answered(f"chatcmpl-stub{self.seq:010d}", key, "stub " * completion)
        self.answered.append(log)
        return await answer_chat(
            request,
            body,
            log=log,
            created=int(now),
            model=body.get("model", self.model),
            prompt=prompt,
            completion=completion,
            max_tokens=max_tokens,
            headers=headers,
            streaming=self.streaming,
        )


async def start_openai(*, clock: Clock = mono_clock, **options: Any) -> Stub:
    """Start the OpenAI stub; options are `OpenAIState`'s (keys, rpm, tpm, minute_s, no_quota, ...)."""
    state = OpenAIState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
