"""Kraken Spot REST stub: signed private calls, increasing nonces, the decaying call counter, the trading counter.

What the public docs say, and what this stub does with it
(docs.kraken.com guides: Spot REST Authentication, Spot REST Rate Limits, Spot Trading
Limits; support.kraken.com "API error messages"):

- Private calls: ``POST /0/private/<Method>``, form-encoded body with ``nonce`` (an
  always-increasing unsigned 64-bit integer), headers ``API-Key`` and ``API-Sign`` =
  base64(HMAC-SHA512(key = base64-decoded secret, message = URI path +
  SHA256(nonce + POST data))). The documented example (AddOrder, nonce
  1616492376594) verifies here.
- Every answer is HTTP 200 with JSON ``{"error": [...], "result": {...}}``; errors are
  strings: ``EAPI:Invalid key`` (unknown key), ``EAPI:Invalid signature``,
  ``EAPI:Invalid nonce``, ``EAPI:Rate limit exceeded``, ``EOrder:Rate limit exceeded``,
  ``EGeneral:Invalid arguments``, ``EQuery:Unknown asset pair``.
- The REST call counter per API key starts at 0; every call adds 1, ledger and trade
  history calls (Ledgers, QueryLedgers, TradesHistory, QueryTrades) add 2; AddOrder and
  CancelOrder are not on it. It decays per second by tier: starter 15 max / 0.33 per
  s, intermediate 20 / 0.5, pro 20 / 1 (``tier``, or ``max_counter``/``decay``). Over the
  maximum: ``EAPI:Rate limit exceeded``; "additional calls will be restricted for a few
  seconds (or possibly longer if calls continue to be made while the rate limits are
  active)".
- The trading engine keeps a counter per key and pair: AddOrder +1 (applied on receipt,
  even if the order then fails validation), CancelOrder +8/+6/+5/+4/+2/+1 for an order
  younger than 5/10/15/45/90/300 s; threshold 60/125/180, decay 1/2.34/3.75 per s by
  tier; over it ``EOrder:Rate limit exceeded``.
- Public ``GET /0/public/Time`` and ``/0/public/SystemStatus`` cost nothing.

Where the docs are silent (the stricter plausible choice, stated):

- A call is refused when its cost would take the counter over the maximum (15 calls
  of cost 1 from zero pass, the 16th is refused).
- The counter decays continuously at the documented rate.
- A refused call still adds its cost (``refused_calls_count``), which is how calls made
  while limited make the restriction last "possibly longer".
- The nonce is checked and spent before the rate limit, so a refused call still uses
  its nonce; a call with a bad nonce still costs its counter units.
- A call with an unknown key or a bad signature is not charged to any counter.

``allowed_capacity(start, end, key=KEY, bucket="rest")``: counter units an ideal
client could have spent in [start, end): the headroom at ``start`` (max minus the
counter then, replayed from the ledger) plus decay times the duration, rounded down.
``bucket="trading:PAIR"`` does the same for the trading counter.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from .common import Clock, Ledger, Stub, mono_clock, serve, work

TIERS = {"starter": (15, 0.33), "intermediate": (20, 0.5), "pro": (20, 1.0)}
TRADING_TIERS = {"starter": (60, 1.0), "intermediate": (125, 2.34), "pro": (180, 3.75)}
HISTORY_CALLS = frozenset({"Ledgers", "QueryLedgers", "TradesHistory", "QueryTrades"})
TRADING_CALLS = frozenset({"AddOrder", "CancelOrder"})
PRIVATE_CALLS = frozenset(
    {
        "Balance",
        "BalanceEx",
        "TradeBalance",
        "OpenOrders",
        "ClosedOrders",
        "QueryOrders",
        "OpenPositions",
        "TradeVolume",
    }
    | HISTORY_CALLS
    | TRADING_CALLS
)
CANCEL_PENALTY = ((5, 8), (10, 6), (15, 5), (45, 4), (90, 2), (300, 1))


def kraken_sign(path: str, nonce: str, postdata: str, secret_b64: str) -> str:
    """API-Sign as documented: HMAC-SHA512(b64decode(secret), path + SHA256(nonce + postdata)), base64."""
    message = path.encode() + hashlib.sha256((nonce + postdata).encode()).digest()
    return base64.b64encode(hmac.new(base64.b64decode(secret_b64), message, hashlib.sha512).digest()).decode()


class DecayCounter:
    """A decaying counter; ``charges`` keeps every (time, cost) so any past value can be replayed."""

    def __init__(self, maximum: float, decay: float, start: float) -> None:
        self.maximum, self.decay = maximum, decay
        self.value, self.at = 0.0, start
        self.charges: list[tuple[float, float]] = []
        self.origin = start

    def read(self, now: float) -> float:
        return max(0.0, self.value - self.decay * max(0.0, now - self.at))

    def add(self, now: float, cost: float) -> None:
        self.value, self.at = self.read(now) + cost, max(now, self.at)
        self.charges.append((now, cost))

    def value_at(self, t: float) -> float:
        v, at = 0.0, self.origin
        for when, cost in self.charges:
            if when > t:
                break
            v = max(0.0, v - self.decay * (when - at)) + cost
            at = when
        return max(0.0, v - self.decay * max(0.0, t - at))


def errors(*messages: str) -> web.Response:
    return web.json_response({"error": list(messages)})


@dataclass
class _Call:
    """One private call on its way through the checks: who sent it, what it asked, what it costs."""

    ledger: Ledger
    now: float
    name: str
    method: str
    path: str
    key: str
    body: str
    params: dict[str, str]
    trading: bool = False
    bucket: str = "rest"
    counter: DecayCounter | None = None
    cost: int = 0
    backoff: bool = False

    def charge(self) -> None:
        if self.counter is not None and self.cost:
            self.counter.add(self.now, self.cost)

    def record(
        self, outcome: str, bucket: str = "rest", cost: float = 0, backoff: bool = False, detail: str = ""
    ) -> None:
        self.ledger.add(
            at=self.now,
            key=self.key,
            method=self.method,
            path=self.path,
            status=200,
            outcome=outcome,
            bucket=bucket,
            cost=cost,
            during_backoff=backoff,
            detail=detail,
        )


class KrakenState:
    def __init__(
        self,
        *,
        keys: dict[str, str] | None = None,
        clock: Clock = mono_clock,
        tier: str = "starter",
        max_counter: float | None = None,
        decay: float | None = None,
        trading_threshold: float | None = None,
        trading_decay: float | None = None,
        refused_calls_count: bool = True,
        pairs: tuple[str, ...] = ("XBTUSD", "ETHUSD", "XBTEUR"),
        latency: float = 0.0,
        hold: asyncio.Event | None = None,
    ) -> None:
        self.keys = dict(
            keys if keys is not None else {"stub-key": base64.b64encode(b"stub-secret" * 4).decode()}
        )
        self.clock = clock
        tmax, tdecay = TIERS[tier]
        self.max_counter = tmax if max_counter is None else max_counter
        self.decay = tdecay if decay is None else decay
        xmax, xdecay = TRADING_TIERS[tier]
        self.trading_threshold = xmax if trading_threshold is None else trading_threshold
        self.trading_decay = xdecay if trading_decay is None else trading_decay
        self.refused_calls_count = refused_calls_count
        self.pairs = set(pairs)
        self.latency, self.hold = latency, hold
        self.ledger = Ledger()
        self.started = clock()
        self.counters: dict[str, DecayCounter] = {}
        self.trading: dict[tuple[str, str], DecayCounter] = {}
        self.nonces: dict[str, int] = {}
        self.streak: dict[str, bool] = defaultdict(bool)
        self.orders: dict[str, tuple[str, str, float]] = {}  # txid -> (key, pair, placed at)
        self.order_seq = 0

    def counter(self, key: str) -> DecayCounter:
        if key not in self.counters:
            self.counters[key] = DecayCounter(self.max_counter, self.decay, self.started)
        return self.counters[key]

    def trading_counter(self, key: str, pair: str) -> DecayCounter:
        if (key, pair) not in self.trading:
            self.trading[(key, pair)] = DecayCounter(self.trading_threshold, self.trading_decay, self.started)
        return self.trading[(key, pair)]

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = None, bucket: str | None = None
    ) -> float:
        if end <= start:
            return 0
        if key is None:
            if len(self.keys) != 1:
                raise ValueError("several keys: say which (key=...)")
            key = next(iter(self.keys))
        bucket = bucket or "rest"
        if bucket == "rest":
            c = self.counters.get(key) or DecayCounter(self.max_counter, self.decay, self.started)
        else:
            pair = bucket.split(":", 1)[1]
            c = self.trading.get((key, pair)) or DecayCounter(
                self.trading_threshold, self.trading_decay, self.started
            )
        headroom = max(0.0, c.maximum - c.value_at(start - 1e-9))
        return math.floor(headroom + c.decay * (end - start) + 1e-9)

    # -- the request path -----------------------------------------------------------

    async def public(self, request: web.Request) -> web.Response:
        now = self.clock()
        name = request.match_info["name"]
        self.ledger.add(
            at=now,
            key=f"ip:{request.remote}",
            method=request.method,
            path=request.path,
            status=200,
            outcome="ok",
            bucket="public",
        )
        await work(self.latency, self.hold)
        if name == "Time":
            t = int(time.time())
            rfc1123 = time.strftime("%a, %d %b %y %H:%M:%S +0000", time.gmtime(t))
            return web.json_response({"error": [], "result": {"unixtime": t, "rfc1123": rfc1123}})
        if name == "SystemStatus":
            return web.json_response(
                {"error": [], "result": {"status": "online", "timestamp": "2024-01-01T00:00:00Z"}}
            )
        return web.json_response({"error": ["EGeneral:Unknown method"]}, status=404)

    async def private(self, request: web.Request) -> web.Response:
        now = self.clock()
        body = await request.text()
        call = _Call(
            ledger=self.ledger,
            now=now,
            name=request.match_info["name"],
            method=request.method,
            path=request.path,
            key=request.headers.get("API-Key", ""),
            body=body,
            params=dict(parse_qsl(body, keep_blank_values=True)),
        )
        refused = self.authenticate(call, request.headers.get("API-Sign", ""))
        if refused is not None:
            return refused
        self.price(call)
        refused = self.check_nonce(call)
        if refused is None:
            refused = self.check_counter(call)
        if refused is not None:
            return refused
        await work(self.latency, self.hold)
        result, problem = self.execute(call.name, call.params, call.key, now)
        if problem:
            call.record("invalid_request", bucket=call.bucket, cost=call.cost, detail=problem)
            return errors(problem)
        call.record("ok", bucket=call.bucket, cost=call.cost)
        return web.json_response({"error": [], "result": result})

    def authenticate(self, call: _Call, sign: str) -> web.Response | None:
        """A POST to a known call, with a known key and a valid signature."""
        if call.method != "POST":
            call.record("invalid_request", detail="method")
            return errors("EGeneral:Invalid arguments")
        if call.name not in PRIVATE_CALLS:
            call.record("not_found")
            return web.json_response({"error": ["EGeneral:Unknown method"]}, status=404)
        if call.key not in self.keys:
            call.record("unauthorized")
            return errors("EAPI:Invalid key")
        try:
            expected = kraken_sign(call.path, call.params.get("nonce", ""), call.body, self.keys[call.key])
            valid = hmac.compare_digest(expected.encode(), sign.encode())
        except (binascii.Error, ValueError):
            valid = False
        if not valid:
            call.record("bad_signature")
            return errors("EAPI:Invalid signature")
        return None

    def price(self, call: _Call) -> None:
        """The counter this call is charged to, and its cost there."""
        name, params, key = call.name, call.params, call.key
        trading = name in TRADING_CALLS
        pair = params.get("pair", "")
        if trading and name == "CancelOrder":
            placed = self.orders.get(params.get("txid", ""))
            pair = placed[1] if placed and placed[0] == key else ""
        cost = 2 if name in HISTORY_CALLS else 1
        if trading:
            cost = 1 if name == "AddOrder" else 0
            if name == "CancelOrder" and pair:
                age = call.now - self.orders[params["txid"]][2]
                cost = next((p for limit, p in CANCEL_PENALTY if age < limit), 0)
        call.trading, call.cost = trading, cost
        call.bucket = f"trading:{pair}" if trading else "rest"
        call.counter = (self.trading_counter(key, pair) if pair else None) if trading else self.counter(key)
        call.backoff = self.streak[call.bucket + key]

    def check_nonce(self, call: _Call) -> web.Response | None:
        nonce = call.params.get("nonce", "")
        if not nonce.isdigit() or int(nonce) >= 2**64 or int(nonce) <= self.nonces.get(call.key, -1):
            call.charge()
            call.record(
                "invalid_nonce", bucket=call.bucket, cost=call.cost, backoff=call.backoff, detail=nonce
            )
            return errors("EAPI:Invalid nonce")
        self.nonces[call.key] = int(nonce)
        return None

    def check_counter(self, call: _Call) -> web.Response | None:
        counter, cost, streak = call.counter, call.cost, call.bucket + call.key
        if counter is not None and counter.read(call.now) + cost > counter.maximum:
            self.streak[streak] = True
            if self.refused_calls_count:
                call.charge()
            message = "EOrder:Rate limit exceeded" if call.trading else "EAPI:Rate limit exceeded"
            outcome = "order_limited" if call.trading else "rate_limited"
            charged = cost if self.refused_calls_count else 0
            call.record(outcome, bucket=call.bucket, cost=charged, backoff=call.backoff)
            return errors(message)
        self.streak[streak] = False
        call.charge()
        return None

    def execute(self, name: str, params: dict[str, str], key: str, now: float) -> tuple[Any, str | None]:
        if name == "Balance":
            return {"ZUSD": "1000.0000", "XXBT": "0.5000000000"}, None
        if name == "BalanceEx":
            return {"ZUSD": {"balance": "1000.0000", "hold_trade": "0.0000"}}, None
        if name == "TradeBalance":
            return {"eb": "1000.0000", "tb": "1000.0000", "m": "0.0000", "n": "0.0000"}, None
        if name == "OpenOrders":
            mine = {
                t: {"status": "open", "descr": {"pair": p}}
                for t, (k, p, _) in self.orders.items()
                if k == key
            }
            return {"open": mine}, None
        if name in ("ClosedOrders",):
            return {"closed": {}, "count": 0}, None
        if name == "QueryOrders":
            return {}, None
        if name == "Ledgers":
            return {"ledger": {}, "count": 0}, None
        if name == "TradesHistory":
            return {"trades": {}, "count": 0}, None
        if name in ("QueryLedgers", "QueryTrades", "OpenPositions"):
            return {}, None
        if name == "TradeVolume":
            return {"currency": "ZUSD", "volume": "0.0000"}, None
        if name == "AddOrder":
            for field in ("ordertype", "type", "volume", "pair"):
                if not params.get(field):
                    return None, f"EGeneral:Invalid arguments:{field}"
            if params["pair"] not in self.pairs:
                return None, "EQuery:Unknown asset pair"
            self.order_seq += 1
            txid = f"OSTUB{self.order_seq:06d}-AAAAA-BBBBBB"
            self.orders[txid] = (key, params["pair"], now)
            price = (
                f" @ {params['ordertype']} {params['price']}"
                if params.get("price")
                else f" @ {params['ordertype']}"
            )
            return {
                "descr": {"order": f"{params['type']} {params['volume']} {params['pair']}{price}"},
                "txid": [txid],
            }, None
        if name == "CancelOrder":
            txid = params.get("txid", "")
            placed = self.orders.get(txid)
            if placed is None or placed[0] != key:
                return None, "EOrder:Unknown order"
            del self.orders[txid]
            return {"count": 1}, None
        return None, "EGeneral:Unknown method"


async def start_kraken(*, clock: Clock = mono_clock, **options: Any) -> Stub:
    """Start the Kraken stub; options are `KrakenState`'s (keys, tier or counter numbers, ...)."""
    state = KrakenState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/0/public/{name}", state.public)
    app.router.add_route("*", "/0/private/{name}", state.private)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
