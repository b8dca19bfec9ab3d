"""Azure OpenAI chat-completions stub: one resource (one host in one region), limits per deployment.

What Microsoft's docs say (learn.microsoft.com, Azure OpenAI "Manage quota" and "quotas and
limits"; the Dev Proxy page "Azure OpenAI 429: token and request rate limits explained"), and
what this stub does with it:

- A resource has two keys (KEY1, KEY2) that share its quota: ``keys`` lists the accepted
  ones; the key comes in the ``api-key`` header (``Authorization: Bearer KEY`` is taken too).
  Missing or unknown: 401 ``{"error": {"code": "401", "message": "Access denied due to invalid
  subscription key or wrong API endpoint. ..."}}``.
- ``POST /openai/deployments/{deployment}/chat/completions?api-version=...`` (without
  ``api-version``: 404 ``{"error": {"code": "404", "message": "Resource not found"}}``), and the
  v1 path ``POST /openai/v1/chat/completions`` whose body's ``model`` names the deployment. A
  deployment this resource does not have: 404 ``DeploymentNotFound``.
- Each deployment (``deployments``: name -> ``{"model": ..., "tpm": ..., "rpm": ...}``) has
  its own limits. Tokens per minute is a continuously refilled bucket (capacity ``tpm``,
  refill ``tpm / minute_s`` a second, full at start); requests per minute defaults to 6 per
  1,000 TPM and is enforced over 10-second windows ("RPM is evaluated over 1 or 10 seconds"):
  at most ``rpm / 6`` (at least 1) accepted requests in any sliding ``minute_s / 6`` seconds.
- Limits are enforced at arrival, on an estimate: the prompt (characters of the messages'
  content / 4, rounded up) + ``max_tokens`` (or ``max_completion_tokens``,
  ``default_max_tokens`` without either) times ``best_of`` when given. Nothing is refunded
  when the completion is shorter.
- Over a limit: 429 with ``retry-after`` (whole seconds, rounded up) and ``retry-after-ms``:
  when this request would fit both limits; body ``{"error": {"code": "429", "message":
  "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version V have
  exceeded token rate limit|call rate limit of your current OpenAI S0 pricing tier. Please
  retry after N seconds. ..."}}`` (the v1 path's version is ``v1``). The call rate limit is
  checked first. A refusal charges nothing.
- A success is OpenAI's ``chat.completion`` (``model`` = the deployment's model), and carries
  ``x-ratelimit-remaining-requests`` and ``x-ratelimit-remaining-tokens`` only (no limit, no
  reset headers), ``apim-request-id`` and ``x-request-id``. Streaming as the OpenAI stub does
  (``llm_common.answer_chat``), with a usage chunk for ``stream_options.include_usage``.

Stated choices where the docs are silent: ``x-ratelimit-remaining-requests`` is what the
10-second window still admits (the limit actually enforced), ``x-ratelimit-remaining-tokens``
the bucket's level; 429s carry both too. ``completion_tokens`` is ``ceil(max_tokens *
completion_ratio)``. A request whose estimate exceeds the whole ``tpm`` never fits: it is
refused every time, told to retry after at least a (scaled) minute.

The audit: one ``Record`` per arrival in ``stub.ledger`` (``key`` = the key masked
(``llm_common.mask``), ``bucket`` = the deployment (the v1 path's model, "" if none), ``cost``
= tokens charged, ``outcome`` ``ok`` / ``rate_limited`` (``detail`` "tokens" or "requests") /
``unauthorized`` / ``not_found`` / ``deployment_not_found`` / ``invalid_request`` /
``unanswered`` (arrived while dark on "hang")). ``state.audit(deployment)`` sums it:
tokens charged, 429s, and the capacity ``stub.allowed_capacity(start, end, bucket=deployment)``
(a full bucket at ``start`` + the refill until ``end``).

Going dark, for failover tests: ``await state.go_dark("refuse")`` closes the listener and drops
every open connection (new ones are refused); ``await state.go_dark("hang")`` keeps accepting
but answers nothing; ``await state.come_back()`` answers again (listening on the same port
after "refuse"; requests parked by "hang" are dropped, never answered).
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .common import Clock, Ledger, Stub, mono_clock, serve, sliding_capacity, work
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

DEPLOYMENT_PATH = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")
V1_PATH = "/openai/v1/chat/completions"

ACCESS_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid "
    "key for an active subscription and use a correct regional API endpoint for your resource."
)
NO_DEPLOYMENT = (
    "The API deployment for this resource does not exist. If you created the deployment within the "
    "last 5 minutes, please wait a moment and try again."
)
DARK_MODES = ("refuse", "hang")


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def rate_limited_message(api_version: str, limit: str, seconds: int) -> str:
    return (
        f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {api_version} "
        f"have exceeded {limit} of your current OpenAI S0 pricing tier. Please retry after {seconds} "
        "seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further "
        "increase the default rate limit."
    )


@dataclass
class Deployment:
    """One deployment's limits: a tokens bucket and a sliding window of accepted arrivals."""

    name: str
    model: str
    tpm: int
    rpm: int
    window: float  # seconds: a sixth of the (scaled) minute, 10 s
    tokens: Bucket
    arrivals: deque[float] = field(default_factory=deque)

    @property
    def per_window(self) -> int:
        return max(1, self.rpm // 6)

    def in_window(self, now: float) -> int:
        while self.arrivals and self.arrivals[0] <= now - self.window:
            self.arrivals.popleft()
        return len(self.arrivals)

    def requests_wait(self, now: float) -> float:
        """Seconds until the window admits one more request (0 if it does now)."""
        n = self.in_window(now)
        if n < self.per_window:
            return 0.0
        return max(0.0, self.arrivals[n - self.per_window] + self.window - now)

    def remaining_requests(self, now: float) -> int:
        return max(0, self.per_window - self.in_window(now))


@dataclass
class AzureState:
    clock: Clock = mono_clock
    keys: Iterable[str] = ("key1-stub-0123456789", "key2-stub-0123456789")
    deployments: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"gpt-4o-mini": {"model": "gpt-4o-mini", "tpm": 20_000}}
    )
    minute_s: float = 60.0
    default_max_tokens: int = 256  # as the OpenAI stub charges a request without max_tokens
    completion_ratio: float = 0.5
    latency: float = 0.0
    hold: asyncio.Event | None = None
    streaming: StreamOptions = field(default_factory=StreamOptions)
    ledger: Ledger = field(default_factory=Ledger)
    book: PromptBook = field(default_factory=PromptBook)
    answered: list[Answered] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.keys = list(self.keys)
        self.known = set(self.keys)
        self.started = self.clock()
        self.limits: dict[str, Deployment] = {}
        for name, spec in self.deployments.items():
            tpm = int(spec["tpm"])
            rpm = int(spec.get("rpm") or tpm * 6 // 1000)
            bucket = Bucket(tpm, self.minute_s, updated=self.started)
            model = str(spec.get("model", name))
            self.limits[name] = Deployment(name, model, tpm, rpm, self.minute_s / 6, bucket)
        self.seq = 0
        self.dark = ""  # "", "refuse" or "hang"
        self.wake = asyncio.Event()  # set to drop the requests "hang" parked
        self.runner: web.AppRunner | None = None
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    # ------------------------------------------------------------ the audit

    def allowed_capacity(
        self,
        start: float,
        end: float,
        *,
        key: str | None = None,
        bucket: str | None = None,
        unit: str = "tokens",
    ) -> float:
        """Tokens (``unit="requests"``: requests) deployment ``bucket`` (every one without) could
        be charged in [start, end): a full bucket at start + the refill. Both keys share the
        resource's quota, so ``key`` changes nothing."""
        deps = [self.limits[bucket]] if bucket is not None else list(self.limits.values())
        span = max(0.0, end - start)
        if unit == "requests":
            total = 0
            for d in deps:
                occupied = self.ledger.arrivals(
                    bucket=d.name, outcome="ok", start=start - d.window, end=start
                )
                total += sliding_capacity(d.per_window, d.window, occupied, start, end)
            return float(total)
        return sum(d.tpm + d.tpm * span / self.minute_s for d in deps)

    def audit(
        self, deployment: str | None = None, start: float | None = None, end: float | None = None
    ) -> dict[str, float]:
        """Tokens charged, requests accepted, 429s and the token capacity of ``deployment`` (every
        one without) over [start, end) (default: from the stub's start to now)."""
        start = self.started if start is None else start
        rows = {"bucket": deployment, "start": start, "end": end}  # end None: every record so far
        return {
            "tokens_charged": self.ledger.charged(**rows),
            "accepted": float(len(self.ledger.accepted(**rows))),
            "rate_limited": float(len(self.ledger.refused("rate_limited", **rows))),
            "capacity": self.allowed_capacity(start, self.clock() if end is None else end, bucket=deployment),
        }

    # ------------------------------------------------------------ going dark

    def bind(self, runner: web.AppRunner) -> None:
        self.runner = runner
        host, port = runner.addresses[0][:2]
        self.address = (host, port)

    async def go_dark(self, how: str = "refuse") -> None:
        """Stop answering: "refuse" closes the listener and drops every open connection;
        "hang" accepts connections and requests and answers none."""
        if how not in DARK_MODES:
            raise ValueError(f"go_dark: {how!r} is not one of {DARK_MODES}")
        assert self.runner is not None and self.runner.server is not None
        if how == "refuse" and self.dark != "refuse":
            for site in list(self.runner.sites):
                await site.stop()
            self.release()
            for conn in self.runner.server.connections:
                conn.force_close()
        self.dark = how

    async def come_back(self) -> None:
        """Answer again; after "refuse", listen again on the same port."""
        was, self.dark = self.dark, ""
        self.release()
        if was == "refuse":
            assert self.runner is not None
            site = web.TCPSite(self.runner, *self.address, backlog=1024)
            await site.start()

    def release(self) -> None:
        """Drop the requests "hang" parked: their connections close, unanswered."""
        self.wake.set()
        self.wake = asyncio.Event()

    async def on_shutdown(self, app: web.Application) -> None:
        self.release()  # a parked request must not hold the stub's close

    async def park(self, call: Call) -> web.Response:
        call.record(0, "unanswered")
        await self.wake.wait()
        if call.request.protocol is not None:
            call.request.protocol.force_close()
        return web.Response(status=503)  # never written: the connection is gone

    # ------------------------------------------------------------ requests

    def headers(self, dep: Deployment, now: float) -> dict[str, str]:
        return {
            "x-ratelimit-remaining-requests": str(dep.remaining_requests(now)),
            "x-ratelimit-remaining-tokens": str(dep.tokens.remaining(now)),
            "apim-request-id": str(uuid.uuid4()),
            "x-request-id": str(uuid.uuid4()),
        }

    def authorized_key(self, request: web.Request) -> str:
        key = request.headers.get("api-key", "")
        if not key:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else ""
        return key

    async def handle(self, request: web.Request) -> web.StreamResponse:
        now = self.clock()
        key = self.authorized_key(request)
        call = Call(self.ledger, request, now, mask(key), "")
        if self.dark == "hang":
            return await self.park(call)
        if key not in self.known:
            call.record(401, "unauthorized")
            return error(401, "401", ACCESS_DENIED)
        match = DEPLOYMENT_PATH.match(request.path)
        api_version = request.query.get("api-version", "") if match else "v1"
        if request.method != "POST" or not api_version or (match is None and request.path != V1_PATH):
            call.record(404, "not_found")
            return error(404, "404", "Resource not found")
        try:
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise TypeError
        except (ValueError, TypeError):
            call.record(400, "invalid_request")
            return web.json_response(
                {
                    "error": {
                        "message": "'messages' is a required property",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=400,
            )
        name = match.group(1) if match else body.get("model")
        call.bucket = name if isinstance(name, str) else ""
        dep = self.limits.get(call.bucket)
        if dep is None:
            call.record(404, "deployment_not_found")
            return error(404, "DeploymentNotFound", NO_DEPLOYMENT)
        prompt = chat_prompt_tokens(body["messages"])
        max_tokens = int(body.get("max_completion_tokens", body.get("max_tokens")) or self.default_max_tokens)
        best_of = body.get("best_of")
        cost = prompt + max_tokens * (best_of if isinstance(best_of, int) and best_of > 1 else 1)
        refused = self.check_limits(call, dep, cost, api_version)
        if refused is not None:
            return refused
        dep.tokens.take(cost, now)
        dep.arrivals.append(now)
        identity = prompt_identity(body["messages"])
        self.book.prompts[call.key][identity] += 1
        call.record(200, "ok", cost=cost, detail=identity)
        headers = self.headers(dep, now)
        await work(self.latency, self.hold)
        completion = min(max_tokens, math.ceil(max_tokens * self.completion_ratio))
        self.seq += 1
        log = Answered(f"chatcmpl-azstub{self.seq:010d}", call.key, "stub " * completion)
        self.answered.append(log)
        return await answer_chat(
            request,
            body,
            log=log,
            created=int(now),
            model=dep.model,
            prompt=prompt,
            completion=completion,
            max_tokens=max_tokens,
            headers=headers,
            streaming=self.streaming,
        )

    def check_limits(self, call: Call, dep: Deployment, cost: int, api_version: str) -> web.Response | None:
        """The call rate (10-second window), then the token bucket; the wait told is when the
        request fits both."""
        now = call.now
        by_requests = dep.requests_wait(now)
        by_tokens = dep.tokens.wait_for(min(cost, dep.tokens.capacity), now)
        if cost > dep.tokens.capacity:
            by_tokens = max(by_tokens, dep.tokens.period)  # never fits: a full minute, every time
        if by_requests <= 0 and by_tokens <= 0:
            return None
        limit = "call rate limit" if by_requests > 0 else "token rate limit"
        wait = max(by_requests, by_tokens)
        seconds = max(1, math.ceil(wait - 1e-6))
        self.book.refusals[call.key]["429"] += 1
        call.record(429, "rate_limited", detail="requests" if by_requests > 0 else "tokens")
        headers = {
            **self.headers(dep, now),
            "retry-after": str(seconds),
            "retry-after-ms": str(max(1, math.ceil(wait * 1000 - 1e-3))),
        }
        return error(429, "429", rate_limited_message(api_version, limit, seconds), headers)


async def start_azure(*, clock: Clock = mono_clock, **options: Any) -> Stub:
    """Start one Azure OpenAI resource; options are `AzureState`'s (keys, deployments, minute_s,
    default_max_tokens, completion_ratio, latency, hold, streaming)."""
    state = AzureState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    app.on_shutdown.append(state.on_shutdown)
    stub = await serve(app, ledger=state.ledger, clock=clock, state=state)
    state.bind(stub.runner)
    return stub
