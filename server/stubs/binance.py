"""Binance Spot REST stub: request weight per IP in aligned windows, 429 then 418 bans, signed endpoints.

What the public docs say, and what this stub does with it
(binance-spot-api-docs rest-api.md "LIMITS", "Request Security", errors.md, enums.md):

- Every route has a weight; the REQUEST_WEIGHT limit is per IP (6000 per 1 MINUTE by
  default, ``weight_limits`` takes ``(limit, seconds)`` pairs). Windows are aligned to
  the interval: a 1 MINUTE window starts every minute on the clock and the count
  resets to zero when the next starts. Every answer carries
  ``X-MBX-USED-WEIGHT-(intervalNum)(intervalLetter)`` for each weight limiter (a 10 s
  window is ``X-MBX-USED-WEIGHT-10S``). RAW_REQUESTS (61000 per 5 MINUTE,
  ``raw_limits``) counts requests. ``/api/v3/exchangeInfo`` lists the limits in force.
- Weights used: ping 1, time 1, exchangeInfo 20, depth by limit (1-100: 5,
  101-500: 25, 501-1000: 50, 1001-5000: 250), ticker/price 2 with a symbol and 4
  without, POST order 1, POST order/test 1 (20 with computeCommissionRates),
  account 20.
- Over a limit: 429, ``{"code": -1003, ...}`` and ``Retry-After`` (seconds to wait to
  prevent a ban). Failing to back off after 429s: an automated IP ban, 418 with
  ``Retry-After`` until the ban ends; bans scale for repeat offenders from 2 minutes to
  3 days (``ban_base``, ``ban_max``; each ban doubles, capped).
- ORDERS limits count orders per account (API key): 429 -1015 "Too many new orders"
  with ``Retry-After`` when exceeded; every successful order carries
  ``X-MBX-ORDER-COUNT-(intervalNum)(intervalLetter)`` (``order_limits``, default
  100 per 10 s and 200,000 per day).
- SIGNED (TRADE, USER_DATA) endpoints: ``X-MBX-APIKEY`` header; ``timestamp`` (ms, or
  µs) and optional ``recvWindow`` (default 5000, at most 60000); accepted only if
  ``timestamp < serverTime + 1000`` and ``serverTime - timestamp <= recvWindow``, else
  400 -1021; ``signature`` = hex HMAC-SHA256, keyed by the secret, of the query string
  concatenated without separator to the body (the ``signature`` parameter itself
  left out), compared case-insensitively; wrong: 400 -1022. A missing/unknown key:
  401 -2014/-2015. A reused ``newClientOrderId``: 400 -2010 "Duplicate order sent.".

Where the docs are silent (the stricter plausible choice, stated):

- A request is refused when its weight would take the window over the limit.
- Every request that reaches the API uses its weight, refused (429) and failed (bad
  signature, bad params) ones too, so ``X-MBX-USED-WEIGHT`` can exceed the limit.
  Requests answered 418 during a ban use nothing.
- "Failing to back off": after a 429, each request from that IP arriving before the
  Retry-After it was given is a violation; ``ban_after`` violations (default 3) start
  a ban. Requests during a ban do not extend it.
- Every order counts as unfilled (the stub fills none), so every order uses the ORDERS
  limit.

``allowed_capacity(start, end, key=IP, bucket="weight")``: the weight an ideal client
could have been served in [start, end): for each aligned window overlapping it, the
limit, less what was used in the first one before ``start``; the tightest weight
limiter wins. Units are weight, as are ``cost`` in the ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from .common import Clock, Ledger, Stub, interval_name, serve, wall_clock, work

ORDER_PARAMS = frozenset(
    {
        "symbol",
        "side",
        "type",
        "timeInForce",
        "quantity",
        "quoteOrderQty",
        "price",
        "newClientOrderId",
        "strategyId",
        "strategyType",
        "stopPrice",
        "trailingDelta",
        "icebergQty",
        "newOrderRespType",
        "selfTradePreventionMode",
        "pegPriceType",
        "pegOffsetValue",
        "pegOffsetType",
        "computeCommissionRates",
        "recvWindow",
        "timestamp",
        "signature",
    }
)


def depth_weight(limit: int) -> int:
    if limit <= 100:
        return 5
    if limit <= 500:
        return 25
    if limit <= 1000:
        return 50
    return 250


def split_signature(raw: str) -> tuple[str, str | None]:
    """The raw (still percent-encoded) parameter string without its signature, and the signature."""
    kept, sig = [], None
    for part in raw.split("&") if raw else []:
        if part.startswith("signature="):
            sig = part[len("signature=") :]
        else:
            kept.append(part)
    return "&".join(kept), sig


def malformed(name: str) -> str:
    return f"Mandatory parameter '{name}' was not sent, was empty/null, or malformed."


def ban_body(until: float) -> dict[str, Any]:
    return {
        "code": -1003,
        "msg": f"Way too much request weight used; IP banned until {int(until * 1000)}. Please use WebSocket Streams for live updates to avoid bans.",
    }


@dataclass
class _Call:
    """One request on its way through the checks: who sent it, what it asked, how to answer."""

    state: BinanceState
    now: float
    ip: str
    method: str
    path: str
    raw_query: str
    body: str
    params: dict[str, str]
    backoff: bool = False
    weight: int = 0

    def record(
        self, status: int, outcome: str, cost: float = 0, backoff: bool = False, detail: str = ""
    ) -> None:
        self.state.ledger.add(
            at=self.now,
            key=self.ip,
            method=self.method,
            path=self.path,
            status=status,
            outcome=outcome,
            bucket="weight",
            cost=cost,
            during_backoff=backoff,
            detail=detail,
        )

    def reply(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> web.Response:
        headers = self.state.used_headers(self.ip, self.now)
        headers.update(extra or {})
        return web.json_response(payload, status=status, headers=headers)

    def fail(
        self, status: int, code: int, msg: str, outcome: str, extra: dict[str, str] | None = None
    ) -> web.Response:
        """A refusal after the limiters: it has used its weight."""
        self.record(status, outcome, cost=self.weight, backoff=self.backoff, detail=str(code))
        return self.reply(status, {"code": code, "msg": msg}, extra)


class BinanceState:
    def __init__(
        self,
        *,
        keys: dict[str, str] | None = None,
        clock: Clock = wall_clock,
        weight_limits: Iterable[tuple[int, float]] = ((6000, 60.0),),
        raw_limits: Iterable[tuple[int, float]] = ((61000, 300.0),),
        order_limits: Iterable[tuple[int, float]] = ((100, 10.0), (200000, 86400.0)),
        ban_after: int = 3,
        ban_base: float = 120.0,
        ban_max: float = 259200.0,
        symbols: Iterable[str] = ("BTCUSDT", "ETHUSDT", "LTCBTC", "BNBBTC"),
        ip_header: str | None = None,
        latency: float = 0.0,
        hold: asyncio.Event | None = None,
    ) -> None:
        self.keys = dict(keys if keys is not None else {"stub-api-key": "stub-secret"})
        self.clock = clock
        self.weight_limits = [(int(n), float(s)) for n, s in weight_limits]
        self.raw_limits = [(int(n), float(s)) for n, s in raw_limits]
        self.order_limits = [(int(n), float(s)) for n, s in order_limits]
        self.ban_after, self.ban_base, self.ban_max = ban_after, ban_base, ban_max
        self.symbols = set(symbols)
        self.ip_header = ip_header
        self.latency, self.hold = latency, hold
        self.ledger = Ledger()
        self.weight: dict[tuple[str, int, int], int] = defaultdict(int)  # (ip, limiter, window index)
        self.raw: dict[tuple[str, int, int], int] = defaultdict(int)
        self.orders: dict[tuple[str, int, int], int] = defaultdict(int)  # (api key, limiter, window)
        self.backoff_until: dict[str, float] = {}
        self.violations: dict[str, int] = defaultdict(int)
        self.ban_until: dict[str, float] = {}
        self.bans: dict[str, int] = defaultdict(int)
        self.ban_log: list[tuple[str, float, float]] = []  # (ip, from, until)
        self.client_ids: set[tuple[str, str]] = set()
        self.order_seq = 0

    # -- headers and capacity ----------------------------------------------------------

    def used_headers(self, ip: str, now: float) -> dict[str, str]:
        out = {}
        for i, (_, secs) in enumerate(self.weight_limits):
            num, letter, _ = interval_name(secs)
            out[f"X-MBX-USED-WEIGHT-{num}{letter}"] = str(self.weight[(ip, i, int(now // secs))])
        return out

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = None, bucket: str | None = None
    ) -> float:
        if end <= start:
            return 0
        ip = key or "ip:127.0.0.1"
        caps = []
        for limit, secs in self.weight_limits:
            first = int(start // secs)
            last = math.ceil(end / secs) - 1
            used_before = self.ledger.charged(key=ip, start=first * secs, end=start)
            caps.append(max(0, limit - used_before) + limit * (last - first))
        return min(caps)

    def ban_duration(self, ip: str) -> float:
        return min(self.ban_max, self.ban_base * 2 ** self.bans[ip])

    # -- the request path -----------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        call = await self.read_call(request)
        banned = self.check_ban(call)
        if banned is not None:
            return banned
        route = self.route(call.method, call.path, call.params)
        if route is None:
            call.record(404, "not_found")
            return call.reply(404, {"code": -1000, "msg": "Not found."})
        call.weight, signed, action = route
        limited = self.charge_limits(call)
        if limited is not None:
            return limited
        api_key = None
        if signed:
            api_key = request.headers.get("X-MBX-APIKEY")
            refused = self.check_signed(call, api_key)
            if refused is not None:
                return refused
        return await self.answer(call, action, api_key)

    async def read_call(self, request: web.Request) -> _Call:
        now = self.clock()  # the arrival, before the body is read
        method = request.method
        addr = request.headers.get(self.ip_header) if self.ip_header else None
        raw_query = request.raw_path.partition("?")[2]
        body = await request.text() if method in ("POST", "PUT", "DELETE") else ""
        params: dict[str, str] = {}
        for k, v in parse_qsl(body, keep_blank_values=True):
            params[k] = v
        for k, v in parse_qsl(raw_query, keep_blank_values=True):  # the query string wins
            params[k] = v
        return _Call(
            state=self,
            now=now,
            ip=f"ip:{addr or request.remote}",
            method=method,
            path=request.path,
            raw_query=raw_query,
            body=body,
            params=params,
        )

    def check_ban(self, call: _Call) -> web.Response | None:
        """An IP ban comes first; failing to back off after a 429 may start one now."""
        ip, now = call.ip, call.now
        if now < self.ban_until.get(ip, -math.inf):
            until = self.ban_until[ip]
            call.record(418, "banned", backoff=True)
            return call.reply(418, ban_body(until), {"Retry-After": str(max(1, math.ceil(until - now)))})
        call.backoff = now < self.backoff_until.get(ip, -math.inf)
        if call.backoff:
            self.violations[ip] += 1
            if self.violations[ip] >= self.ban_after:
                dur = self.ban_duration(ip)
                self.bans[ip] += 1
                self.violations[ip] = 0
                self.ban_until[ip] = now + dur
                self.ban_log.append((ip, now, now + dur))
                call.record(418, "banned", backoff=True, detail="ban starts")
                return call.reply(418, ban_body(now + dur), {"Retry-After": str(max(1, math.ceil(dur)))})
        return None

    def charge_limits(self, call: _Call) -> web.Response | None:
        """The limiters: refuse when this request's weight would take a window over."""
        ip, now, weight = call.ip, call.now, call.weight
        over: tuple[str, int, float] | None = None
        for i, (limit, secs) in enumerate(self.weight_limits):
            if self.weight[(ip, i, int(now // secs))] + weight > limit:
                over = over or ("weight", limit, secs)
        for i, (limit, secs) in enumerate(self.raw_limits):
            if self.raw[(ip, i, int(now // secs))] + 1 > limit:
                over = over or ("raw", limit, secs)
        for i, (_, secs) in enumerate(self.weight_limits):
            self.weight[(ip, i, int(now // secs))] += weight
        for i, (_, secs) in enumerate(self.raw_limits):
            self.raw[(ip, i, int(now // secs))] += 1
        if over is None:
            return None
        kind, limit, secs = over
        wait_until = (int(now // secs) + 1) * secs
        self.backoff_until[ip] = max(self.backoff_until.get(ip, -math.inf), wait_until)
        num, _, name = interval_name(secs)
        msg = (
            f"Too much request weight used; current limit is {limit} request weight per {num} {name}. Please use WebSocket Streams for live updates to avoid polling the API."
            if kind == "weight"
            else "Too many requests queued."
        )
        call.record(429, "rate_limited", cost=weight, backoff=call.backoff, detail=kind)
        return call.reply(
            429, {"code": -1003, "msg": msg}, {"Retry-After": str(max(1, math.ceil(wait_until - now)))}
        )

    def check_signed(self, call: _Call, api_key: str | None) -> web.Response | None:
        """SIGNED endpoints: the key, then the parameters, the signature, the timestamp."""
        params = call.params
        if not api_key:
            return call.fail(401, -2014, "API-key format invalid.", "unauthorized")
        if api_key not in self.keys:
            return call.fail(401, -2015, "Invalid API-key, IP, or permissions for action.", "unauthorized")
        if "timestamp" not in params or not params["timestamp"].isdigit():
            return call.fail(400, -1102, malformed("timestamp"), "invalid_request")
        try:
            recv_window = float(params.get("recvWindow", "5000"))
        except ValueError:
            return call.fail(400, -1102, malformed("recvWindow"), "invalid_request")
        if recv_window > 60000:
            return call.fail(
                400,
                -1102,
                "Param 'recvWindow' contains unexpected value. Cannot be greater than 60000.",
                "invalid_request",
            )
        q, qsig = split_signature(call.raw_query)
        b, bsig = split_signature(call.body)
        sig = qsig or bsig
        if not sig:
            return call.fail(400, -1102, malformed("signature"), "invalid_request")
        expected = hmac.new(self.keys[api_key].encode(), (q + b).encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, sig.lower()):
            return call.fail(400, -1022, "Signature for this request is not valid.", "bad_signature")
        ts = int(params["timestamp"])
        ts_ms = ts / 1000 if ts >= 10**14 else ts  # microseconds are accepted too
        server_ms = call.now * 1000
        if not (ts_ms < server_ms + 1000):
            return call.fail(
                400,
                -1021,
                "Timestamp for this request was 1000ms ahead of the server's time.",
                "bad_timestamp",
            )
        if server_ms - ts_ms > recv_window:
            return call.fail(
                400, -1021, "Timestamp for this request is outside of the recvWindow.", "bad_timestamp"
            )
        return None

    async def answer(self, call: _Call, action: Any, api_key: str | None) -> web.Response:
        params = call.params
        if params.get("symbol") is not None and params["symbol"] not in self.symbols:
            return call.fail(400, -1121, "Invalid symbol.", "invalid_request")
        status, payload, extra = await action(params, api_key, call.now, call.weight)
        if status >= 400:
            outcome = "order_limited" if payload["code"] == -1015 else "invalid_request"
            return call.fail(status, payload["code"], payload["msg"], outcome, extra)
        call.record(status, "ok", cost=call.weight, backoff=call.backoff)
        return call.reply(status, payload, extra)

    def route(self, method: str, path: str, params: dict[str, str]) -> tuple[int, bool, Any] | None:
        if method == "GET" and path == "/api/v3/ping":
            return 1, False, self.ok({})
        if method == "GET" and path == "/api/v3/time":
            return 1, False, self.server_time
        if method == "GET" and path == "/api/v3/exchangeInfo":
            return 20, False, self.exchange_info
        if method == "GET" and path == "/api/v3/depth":
            try:
                limit = int(params.get("limit", "100"))
            except ValueError:
                limit = 100
            return depth_weight(limit), False, self.depth
        if method == "GET" and path == "/api/v3/ticker/price":
            return (2 if "symbol" in params else 4), False, self.ticker
        if method == "POST" and path == "/api/v3/order":
            return 1, True, self.new_order
        if method == "POST" and path == "/api/v3/order/test":
            return (20 if params.get("computeCommissionRates") == "true" else 1), True, self.test_order
        if method == "GET" and path == "/api/v3/account":
            return 20, True, self.account
        return None

    # -- endpoints ----------------------------------------------------------------------

    def ok(self, payload: Any) -> Any:
        async def action(
            params: dict[str, str], api_key: str | None, now: float, weight: int
        ) -> tuple[int, Any, dict[str, str]]:
            await work(self.latency, self.hold)
            return 200, payload, {}

        return action

    async def server_time(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        await work(self.latency, self.hold)
        return 200, {"serverTime": int(now * 1000)}, {}

    async def exchange_info(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        await work(self.latency, self.hold)
        limits = []
        for kind, table in (
            ("REQUEST_WEIGHT", self.weight_limits),
            ("ORDERS", self.order_limits),
            ("RAW_REQUESTS", self.raw_limits),
        ):
            for limit, secs in table:
                num, _, name = interval_name(secs)
                limits.append({"rateLimitType": kind, "interval": name, "intervalNum": num, "limit": limit})
        symbols = [{"symbol": s, "status": "TRADING"} for s in sorted(self.symbols)]
        return (
            200,
            {"timezone": "UTC", "serverTime": int(now * 1000), "rateLimits": limits, "symbols": symbols},
            {},
        )

    async def depth(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        if "symbol" not in params:
            return (
                400,
                {
                    "code": -1102,
                    "msg": "Mandatory parameter 'symbol' was not sent, was empty/null, or malformed.",
                },
                {},
            )
        await work(self.latency, self.hold)
        return (
            200,
            {
                "lastUpdateId": 1,
                "bids": [["4.00000000", "431.00000000"]],
                "asks": [["4.00000200", "12.00000000"]],
            },
            {},
        )

    async def ticker(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        await work(self.latency, self.hold)
        if "symbol" in params:
            return 200, {"symbol": params["symbol"], "price": "1.00000000"}, {}
        return 200, [{"symbol": s, "price": "1.00000000"} for s in sorted(self.symbols)], {}

    def check_order(self, params: dict[str, str]) -> dict[str, Any] | None:
        for name in params:
            if name not in ORDER_PARAMS:
                return {
                    "code": -1104,
                    "msg": f"Not all sent parameters were read; read '{len(params) - 1}' parameter(s) but was sent '{len(params)}'.",
                }
        for name in ("symbol", "side", "type"):
            if not params.get(name):
                return {
                    "code": -1102,
                    "msg": f"Mandatory parameter '{name}' was not sent, was empty/null, or malformed.",
                }
        if params["side"] not in ("BUY", "SELL"):
            return {"code": -1117, "msg": "Invalid side."}
        return None

    async def test_order(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        problem = self.check_order(params)
        if problem:
            return 400, problem, {}
        await work(self.latency, self.hold)
        return 200, {}, {}

    async def new_order(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        assert api_key is not None
        problem = self.check_order(params)
        if problem:
            return 400, problem, {}
        for i, (limit, secs) in enumerate(self.order_limits):
            if self.orders[(api_key, i, int(now // secs))] + 1 > limit:
                num, _, name = interval_name(secs)
                wait = (int(now // secs) + 1) * secs - now
                return (
                    429,
                    {
                        "code": -1015,
                        "msg": f"Too many new orders; current limit is {limit} orders per {num} {name}.",
                    },
                    {"Retry-After": str(max(1, math.ceil(wait)))},
                )
        client_id = params.get("newClientOrderId")
        if client_id and (api_key, client_id) in self.client_ids:
            return 400, {"code": -2010, "msg": "Duplicate order sent."}, {}
        for i, (_, secs) in enumerate(self.order_limits):
            self.orders[(api_key, i, int(now // secs))] += 1
        self.order_seq += 1
        client_id = client_id or f"stub{self.order_seq:018d}"
        self.client_ids.add((api_key, client_id))
        await work(self.latency, self.hold)
        headers = {}
        for i, (_, secs) in enumerate(self.order_limits):
            num, letter, _ = interval_name(secs)
            headers[f"X-MBX-ORDER-COUNT-{num}{letter}"] = str(self.orders[(api_key, i, int(now // secs))])
        return (
            200,
            {
                "symbol": params["symbol"],
                "orderId": self.order_seq,
                "orderListId": -1,
                "clientOrderId": client_id,
                "transactTime": int(now * 1000),
            },
            headers,
        )

    async def account(
        self, params: dict[str, str], api_key: str | None, now: float, weight: int
    ) -> tuple[int, Any, dict[str, str]]:
        await work(self.latency, self.hold)
        return (
            200,
            {
                "makerCommission": 15,
                "takerCommission": 15,
                "canTrade": True,
                "updateTime": int(now * 1000),
                "accountType": "SPOT",
                "balances": [{"asset": "BTC", "free": "1.00000000", "locked": "0.00000000"}],
            },
            {},
        )


async def start_binance(*, clock: Clock = wall_clock, **options: Any) -> Stub:
    """Start the Binance stub; options are `BinanceState`'s (keys, weight limits, bans, ...)."""
    state = BinanceState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
