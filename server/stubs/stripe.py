"""Stripe API (v1) stub: per-key rate limits, form-encoded params, idempotent requests, injected failures.

What the public docs say, and what this stub does with it
(docs.stripe.com/rate-limits, /api/idempotent_requests, /error-low-level, /api/errors):

- Rate limits per account (API key): live mode 100 requests per second, sandbox/test
  mode 25 (``rate_limit``, ``window``); individual endpoints 25 per second by default
  (``endpoint_limit``; an endpoint is a method and path template, e.g.
  ``POST /v1/charges``); a concurrency limiter exists (``concurrency_limit``, None =
  off, its number is not published). Over a limit: 429 with
  ``{"error": {"type": "rate_limit_error", ...}}`` and a ``Stripe-Rate-Limited-Reason``
  header (``global-rate``, ``endpoint-rate``, ``global-concurrency``). Older docs split
  the limit into 100 read + 100 write (25 + 25 in test mode); ``split_read_write=True``
  plays that instead.
- No ``Retry-After`` and no ``Stripe-Should-Retry`` is documented on a 429, so none is
  sent (a client must back off on its own). Defaults are test-mode numbers.
- Requests: ``Authorization: Bearer sk_test_...`` (or HTTP Basic with the key as user);
  a POST body is ``application/x-www-form-urlencoded``; an unknown parameter is a 400
  ``invalid_request_error`` "Received unknown parameter: NAME" with ``param``; a
  missing one "Missing required param: NAME.".
- Idempotency (``Idempotency-Key`` header on POST): the status and body of the first
  request are saved once the endpoint begins executing, and replayed for a retry with
  the same key, including 500s. A key reused with different parameters or another
  endpoint is a 400 ``idempotency_error``. Parameters that fail validation, and a
  request that overlaps another still running with the same key, save nothing (the
  overlap is a 409 ``idempotency_key_in_use``). Rate limiters run before the
  idempotency layer, so a 429 is never saved. Keys expire after 24 hours
  (``idempotency_ttl``).
- Injected failures (``fail_after_write`` fraction, or an exact ``fail_pattern`` of
  booleans per write): the object is written, then a 500 ``api_error`` is answered,
  the case where a client cannot know a write happened. ``state.writes`` is every
  object written; ``state.duplicate_writes()`` names the logical requests written more
  than once (grouped by ``logical_param``, default ``metadata[order_id]``, or by the
  whole parameter set when that is absent). ``writes_by_key()`` counts them per
  account. A replayed answer carries ``Idempotent-Replayed: true``, as Stripe's do
  (``replayed_header=False`` leaves it out, for a client that must cope without it).

Where the docs are silent (the stricter plausible choice, stated):

- Each limit is a sliding window: never more than the limit in any ``window``-long
  interval (stricter than a token bucket, which lets a burst double at the start).
- Refused requests do not use budget (``count_refused=True`` makes them).
- A replay counts against the rate limits like any request.

``allowed_capacity(start, end, key=KEY, bucket=ENDPOINT|None)``: the requests an ideal
client could have been served in [start, end) under the binding sliding window (the
endpoint's when given and smaller, else the global one), given what it had used in
the window before ``start``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from .common import Clock, Ledger, Stub, mono_clock, serve, sliding_capacity, work

# the parameters each endpoint accepts (top-level names; brackets are nested values)
COMMON = {"expand", "metadata"}
CHARGE_PARAMS = COMMON | {
    "amount",
    "currency",
    "customer",
    "description",
    "receipt_email",
    "shipping",
    "source",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "capture",
    "on_behalf_of",
    "transfer_data",
    "transfer_group",
    "application_fee_amount",
    "radar_options",
}
INTENT_PARAMS = COMMON | {
    "amount",
    "currency",
    "customer",
    "description",
    "receipt_email",
    "payment_method",
    "payment_method_types",
    "automatic_payment_methods",
    "confirm",
    "capture_method",
    "confirmation_method",
    "setup_future_usage",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "shipping",
    "off_session",
    "return_url",
}
CUSTOMER_PARAMS = COMMON | {"email", "name", "description", "phone", "address", "payment_method", "shipping"}
LIST_PARAMS = {"limit", "starting_after", "ending_before", "created", "expand"}

Endpoint = tuple[str, str, str, frozenset[str], tuple[str, ...]]  # method, template, object, params, required
ENDPOINTS: list[Endpoint] = [
    ("POST", "/v1/charges", "charge", frozenset(CHARGE_PARAMS), ("amount", "currency")),
    ("POST", "/v1/payment_intents", "payment_intent", frozenset(INTENT_PARAMS), ("amount", "currency")),
    ("POST", "/v1/customers", "customer", frozenset(CUSTOMER_PARAMS), ()),
    ("GET", "/v1/charges", "list", frozenset(LIST_PARAMS | {"customer", "payment_intent"}), ()),
    ("GET", "/v1/charges/{id}", "charge", frozenset({"expand"}), ()),
    ("GET", "/v1/payment_intents/{id}", "payment_intent", frozenset({"expand", "client_secret"}), ()),
    ("GET", "/v1/customers/{id}", "customer", frozenset({"expand"}), ()),
    ("GET", "/v1/balance", "balance", frozenset({"expand"}), ()),
]
PREFIX = {"charge": "ch", "payment_intent": "pi", "customer": "cus"}


def error(type_: str, message: str, **more: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, **more}}


@dataclass
class Saved:
    method: str
    path: str
    params: tuple[tuple[str, str], ...]
    created: float
    status: int = 0
    text: str = ""
    in_progress: bool = True


@dataclass
class Write:
    id: str
    object: str
    logical: str
    params: dict[str, str]
    at: float
    idempotency_key: str | None
    failed: bool  # answered 500 although written
    key: str = ""  # the account (API key) it was written on


@dataclass
class Sliding:
    limit: int
    window: float
    times: deque[float] = field(default_factory=deque)

    def full(self, now: float) -> bool:
        while self.times and self.times[0] <= now - self.window:
            self.times.popleft()
        return len(self.times) >= self.limit


@dataclass
class _Call:
    """One request on its way through the checks: whose it is, what it asked, how to answer."""

    ledger: Ledger
    now: float
    key: str
    method: str
    path: str
    endpoint: str
    request_id: str

    def reply(
        self, status: int, body: Any = None, *, text: str | None = None, extra: dict[str, str] | None = None
    ) -> web.Response:
        headers = {"Request-Id": self.request_id, **(extra or {})}
        if text is None:
            text = json.dumps(body, indent=2)
        return web.Response(status=status, text=text, content_type="application/json", headers=headers)

    def record(
        self, status: int, outcome: str, cost: float = 0, backoff: bool = False, detail: str = ""
    ) -> None:
        self.ledger.add(
            at=self.now,
            key=self.key,
            method=self.method,
            path=self.path,
            status=status,
            outcome=outcome,
            bucket=self.endpoint,
            cost=cost,
            during_backoff=backoff,
            detail=detail,
        )


class StripeState:
    def __init__(
        self,
        *,
        keys: Iterable[str] = ("sk_test_stub",),
        clock: Clock = mono_clock,
        rate_limit: int = 25,
        window: float = 1.0,
        endpoint_limit: int | None = 25,
        split_read_write: bool = False,
        concurrency_limit: int | None = None,
        count_refused: bool = False,
        fail_after_write: float = 0.0,
        fail_pattern: Iterable[bool] | None = None,
        seed: int = 0,
        logical_param: str | None = "metadata[order_id]",
        idempotency_ttl: float = 86400.0,
        latency: float = 0.0,
        hold: asyncio.Event | None = None,
        replayed_header: bool = True,
    ) -> None:
        self.replayed_header = replayed_header
        self.keys = set(keys)
        self.clock = clock
        self.rate_limit, self.window = rate_limit, window
        self.endpoint_limit = endpoint_limit
        self.split_read_write = split_read_write
        self.concurrency_limit = concurrency_limit
        self.count_refused = count_refused
        self.fail_after_write = fail_after_write
        self.fail_pattern = list(fail_pattern) if fail_pattern is not None else None
        self.rng = random.Random(seed)
        self.logical_param = logical_param
        self.idempotency_ttl = idempotency_ttl
        self.latency, self.hold = latency, hold
        self.ledger = Ledger()
        self.global_logs: dict[str, Sliding] = {}
        self.endpoint_logs: dict[tuple[str, str], Sliding] = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self.streak: dict[str, bool] = defaultdict(bool)
        self.saved: dict[tuple[str, str], Saved] = {}
        self.writes: list[Write] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.request_seq = 0

    # -- accounting -------------------------------------------------------------------

    def writes_by_logical(self, object_: str | None = None) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for w in self.writes:
            if object_ is None or w.object == object_:
                out[w.logical] += 1
        return dict(out)

    def writes_by_key(self) -> dict[str, int]:
        """Objects written on each account (API key)."""
        out: dict[str, int] = defaultdict(int)
        for w in self.writes:
            out[w.key] += 1
        return dict(out)

    def duplicate_writes(self, object_: str | None = None) -> dict[str, int]:
        """Logical requests written more than once (the duplicate charges)."""
        return {k: n for k, n in self.writes_by_logical(object_).items() if n > 1}

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = None, bucket: str | None = None
    ) -> float:
        if key is None:
            if len(self.keys) != 1:
                raise ValueError("several keys: say which (key=...)")
            key = next(iter(self.keys))
        limit = self.rate_limit
        rows = self.ledger.select(key=key, start=start - self.window, end=start)  # before the run
        if bucket is not None and self.endpoint_limit is not None and self.endpoint_limit < limit:
            limit = self.endpoint_limit
            rows = [r for r in rows if r.bucket == bucket]
        elif self.split_read_write and bucket is not None:
            rows = [r for r in rows if r.bucket.startswith("GET ") == bucket.startswith("GET ")]
        occupied = [r.at for r in rows if r.cost > 0]
        return sliding_capacity(limit, self.window, occupied, start, end)

    # -- the request path -----------------------------------------------------------

    def match(self, method: str, path: str) -> tuple[Endpoint | None, str | None]:
        for ep in ENDPOINTS:
            m, template = ep[0], ep[1]
            if m != method:
                continue
            pattern = "^" + re.sub(r"\{id\}", r"(?P<id>[A-Za-z0-9_]+)", template) + "$"
            hit = re.match(pattern, path)
            if hit:
                return ep, hit.groupdict().get("id")
        return None, None

    def api_key(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            return value.strip()
        if scheme.lower() == "basic":
            try:
                return base64.b64decode(value).decode().split(":", 1)[0]
            except (ValueError, UnicodeDecodeError):
                return None
        return None

    def limited(self, key: str, endpoint: str, is_read: bool, now: float) -> str | None:
        if self.concurrency_limit is not None and self.in_flight[key] >= self.concurrency_limit:
            return "global-concurrency"
        gkey = f"{key}|{'read' if is_read else 'write'}" if self.split_read_write else key
        g = self.global_logs.setdefault(gkey, Sliding(self.rate_limit, self.window))
        if g.full(now):
            return "global-rate"
        if self.endpoint_limit is not None:
            e = self.endpoint_logs.setdefault((key, endpoint), Sliding(self.endpoint_limit, self.window))
            if e.full(now):
                return "endpoint-rate"
        return None

    def charge_limits(self, key: str, endpoint: str, is_read: bool, now: float) -> None:
        gkey = f"{key}|{'read' if is_read else 'write'}" if self.split_read_write else key
        self.global_logs.setdefault(gkey, Sliding(self.rate_limit, self.window)).times.append(now)
        if self.endpoint_limit is not None:
            self.endpoint_logs.setdefault(
                (key, endpoint), Sliding(self.endpoint_limit, self.window)
            ).times.append(now)

    async def handle(self, request: web.Request) -> web.Response:
        ep, obj_id = self.match(request.method, request.path)
        call = self.start_call(request, ep)
        refused = self.check_key(call)
        if refused is None:
            refused = self.check_limits(call)
        if refused is not None:
            return refused
        if ep is None:
            call.record(404, "not_found", cost=1)
            return call.reply(
                404,
                error(
                    "invalid_request_error",
                    f"Unrecognized request URL ({call.method}: {call.path}). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.",
                ),
            )
        pairs = await self.read_params(call, request)
        if isinstance(pairs, web.Response):
            return pairs
        params = tuple(sorted(pairs))
        idem = request.headers.get("Idempotency-Key") if call.method == "POST" else None
        if idem:
            answered = self.check_idempotency(call, idem, params)
            if answered is not None:
                return answered
        problem = self.validate(ep, pairs)
        if problem is not None:  # validation failures are not saved
            call.record(400, "invalid_request", cost=1, detail=problem["error"]["message"])
            return call.reply(400, problem)
        return await self.run(call, ep, obj_id, pairs, params, idem)

    def start_call(self, request: web.Request, ep: Endpoint | None) -> _Call:
        now = self.clock()
        method, path = request.method, request.path
        self.request_seq += 1
        return _Call(
            ledger=self.ledger,
            now=now,
            key=self.api_key(request) or "",
            method=method,
            path=path,
            endpoint=f"{method} {ep[1]}" if ep else f"{method} {path}",
            request_id=f"req_stub{self.request_seq:012d}",
        )

    def check_key(self, call: _Call) -> web.Response | None:
        key = call.key
        if key in self.keys:
            return None
        call.record(401, "unauthorized")
        if not key:
            msg = "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."
        else:
            msg = f"Invalid API Key provided: {key[:8]}{'*' * max(0, len(key) - 12)}{key[-4:]}"
        return call.reply(401, error("invalid_request_error", msg))

    def check_limits(self, call: _Call) -> web.Response | None:
        """Rate limiters first: before validation and before the idempotency layer."""
        key, endpoint, now = call.key, call.endpoint, call.now
        is_read = call.method == "GET"
        reason = self.limited(key, endpoint, is_read, now)
        backoff = self.streak[key]
        if reason is None:
            self.streak[key] = False
            self.charge_limits(key, endpoint, is_read, now)
            return None
        self.streak[key] = True
        if self.count_refused:
            self.charge_limits(key, endpoint, is_read, now)
        call.record(429, "rate_limited", cost=1 if self.count_refused else 0, backoff=backoff, detail=reason)
        return call.reply(
            429,
            error(
                "rate_limit_error",
                "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
                code="rate_limit",
            ),
            extra={"Stripe-Rate-Limited-Reason": reason},
        )

    async def read_params(self, call: _Call, request: web.Request) -> list[tuple[str, str]] | web.Response:
        """The query string of a GET; a POST's form body, then its query string."""
        if call.method == "GET":
            return list(parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True))
        ctype = request.headers.get("Content-Type", "application/x-www-form-urlencoded").split(";")[0].strip()
        raw = await request.text()
        if raw and ctype != "application/x-www-form-urlencoded":
            call.record(400, "invalid_request", cost=1, detail="content-type")
            return call.reply(
                400,
                error(
                    "invalid_request_error",
                    "Invalid request (check that your POST content type is application/x-www-form-urlencoded). If you have any questions, we can help at https://support.stripe.com/.",
                ),
            )
        return list(parse_qsl(raw, keep_blank_values=True)) + list(
            parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True)
        )

    def check_idempotency(
        self, call: _Call, idem: str, params: tuple[tuple[str, str], ...]
    ) -> web.Response | None:
        """A saved answer for this key is replayed; a mismatch or an overlap is refused."""
        if len(idem) > 255:
            call.record(400, "invalid_request", cost=1, detail="idempotency key length")
            return call.reply(
                400,
                error("invalid_request_error", "Idempotency-Key must be at most 255 characters long."),
            )
        slot = (call.key, idem)
        saved = self.saved.get(slot)
        if saved is not None and call.now - saved.created >= self.idempotency_ttl:
            del self.saved[slot]
            saved = None
        if saved is None:
            return None
        if (saved.method, saved.path, saved.params) != (call.method, call.path, params):
            call.record(400, "idempotency_error", cost=1)
            return call.reply(
                400,
                error(
                    "idempotency_error",
                    f"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{idem}' if you meant to execute a different request.",
                ),
            )
        if saved.in_progress:
            call.record(409, "idempotency_in_use", cost=1)
            return call.reply(
                409,
                error(
                    "invalid_request_error",
                    f"There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): {idem}. Please try again later.",
                    code="idempotency_key_in_use",
                ),
            )
        call.record(saved.status, "replayed", cost=1)
        replayed = {"Idempotent-Replayed": "true"} if self.replayed_header else {}
        return call.reply(saved.status, text=saved.text, extra={"Idempotency-Key": idem, **replayed})

    async def run(
        self,
        call: _Call,
        ep: Endpoint,
        obj_id: str | None,
        pairs: list[tuple[str, str]],
        params: tuple[tuple[str, str], ...],
        idem: str | None,
    ) -> web.Response:
        """Execute, saving the answer under the idempotency key once execution begins."""
        key, now = call.key, call.now
        slot = (key, idem) if idem else None
        if slot is not None:
            self.saved[slot] = Saved(call.method, call.path, params, created=now)
        self.in_flight[key] += 1
        try:
            await work(self.latency, self.hold)
            status, body = self.execute(ep, obj_id, dict(pairs), idem, now, key)
        except BaseException:
            if slot is not None:
                self.saved.pop(slot, None)
            raise
        finally:
            self.in_flight[key] -= 1
        text = json.dumps(body, indent=2)
        if slot is not None:
            s = self.saved[slot]
            s.status, s.text, s.in_progress = status, text, False
        outcome = (
            "ok"
            if status < 400
            else "server_error"
            if status >= 500
            else "not_found"
            if status == 404
            else "invalid_request"
        )
        call.record(status, outcome, cost=1)
        extra = {"Idempotency-Key": idem} if idem else None
        return call.reply(status, text=text, extra=extra)

    def validate(self, ep: Endpoint, pairs: list[tuple[str, str]]) -> dict[str, Any] | None:
        _, _, _, allowed, required = ep
        for name, _value in pairs:
            base = name.split("[", 1)[0]
            if base not in allowed:
                return error("invalid_request_error", f"Received unknown parameter: {name}", param=name)
        names = {n for n, _ in pairs}
        for req in required:
            if req not in names or not dict(pairs)[req]:
                return error("invalid_request_error", f"Missing required param: {req}.", param=req)
        values = dict(pairs)
        if "amount" in values:
            try:
                amount = int(values["amount"])
            except ValueError:
                return error("invalid_request_error", f"Invalid integer: {values['amount']}", param="amount")
            if amount < 1:
                return error(
                    "invalid_request_error", "This value must be greater than or equal to 1.", param="amount"
                )
        if "currency" in values and not re.fullmatch(r"[a-zA-Z]{3}", values["currency"]):
            return error(
                "invalid_request_error", f"Invalid currency: {values['currency']}.", param="currency"
            )
        return None

    def next_fails(self) -> bool:
        if self.fail_pattern is not None:
            return self.fail_pattern.pop(0) if self.fail_pattern else False
        return self.fail_after_write > 0 and self.rng.random() < self.fail_after_write

    def execute(
        self,
        ep: Endpoint,
        obj_id: str | None,
        values: dict[str, str],
        idem: str | None,
        now: float,
        key: str = "",
    ) -> tuple[int, Any]:
        method, template, obj, _, _ = ep
        if method == "GET":
            if obj == "balance":
                return 200, {
                    "object": "balance",
                    "available": [{"amount": 0, "currency": "usd"}],
                    "livemode": False,
                }
            if obj == "list":
                limit = max(1, min(100, int(values.get("limit", "10") or 10)))
                charges = [o for o in self.objects.values() if o["object"] == "charge"]
                return 200, {
                    "object": "list",
                    "url": template,
                    "has_more": len(charges) > limit,
                    "data": charges[:limit],
                }
            found = self.objects.get(obj_id or "")
            if found is None or found["object"] != obj:
                return 404, error(
                    "invalid_request_error", f"No such {obj}: '{obj_id}'", code="resource_missing", param="id"
                )
            return 200, found
        # a write: it happens, then the answer may still fail
        n = len(self.writes) + 1
        new_id = f"{PREFIX[obj]}_stub{n:020d}"
        metadata = {
            k[len("metadata[") : -1]: v
            for k, v in values.items()
            if k.startswith("metadata[") and k.endswith("]")
        }
        body: dict[str, Any] = {
            "id": new_id,
            "object": obj,
            "created": int(time.time()),
            "livemode": False,
            "metadata": metadata,
        }
        if obj in ("charge", "payment_intent"):
            body.update(
                amount=int(values["amount"]),
                currency=values["currency"].lower(),
                description=values.get("description"),
            )
        if obj == "charge":
            body.update(captured=values.get("capture", "true") != "false", paid=True, status="succeeded")
        if obj == "payment_intent":
            body.update(status="succeeded" if values.get("confirm") == "true" else "requires_payment_method")
        if obj == "customer":
            body.update(
                email=values.get("email"), name=values.get("name"), description=values.get("description")
            )
        if self.logical_param and self.logical_param in values:
            logical = values[self.logical_param]
        else:
            logical = "&".join(f"{k}={v}" for k, v in sorted(values.items()))
        failed = self.next_fails()
        self.writes.append(Write(new_id, obj, logical, dict(values), now, idem, failed, key))
        self.objects[new_id] = body
        if failed:
            return 500, error("api_error", "An unknown error occurred")
        return 200, body


async def start_stripe(*, clock: Clock = mono_clock, **options: Any) -> Stub:
    """Start the Stripe stub; options are `StripeState`'s (keys, limits, failures, ...)."""
    state = StripeState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
