"""Sending one attempt. The engine talks to a `Transport`; HTTP is one of them."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from multidict import CIMultiDict
from yarl import URL

from ratedeck.core.secrets import Redactor, safe_url
from ratedeck.core.version import version
from ratedeck.engine.api_rules import PathRule, PathTable, first_match
from ratedeck.engine.http.delays import (
    DelayHook,
    answer_hints,
    hint_names,
    json_field_hook,
    read_quotas,
    response_delay,
)
from ratedeck.engine.http.outcome import (
    CLIENT_ERROR,
    CONNECTION,
    OK,
    SERVER_ERROR,
    TIMEOUT,
    Outcome,
    classify,
)
from ratedeck.engine.ports import ProbeGet, Transport  # noqa: F401  (the protocol lives with the ports)
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.settings import EngineSettings, KeySpec, TargetConfig

from .client import AioWire, BodyTooLarge, describe, open_client, probe_get
from .reqwest_client import RqUrl, describe_reqwest, native_headers, open_reqwest
from .signing import SigningError, SignInput, encode, signer_for
from .wire import Wire

USER_AGENT = f"ratedeck/{version()}"
_FORM = "application/x-www-form-urlencoded"
ERROR_TEXT_CHARS = 200  # an error body is kept this long, after masking every key
ERROR_BODY_BYTES = 64 * 1024  # read of an error body; enough to classify it, bounded against a flood
MAX_REDIRECTS = 5  # with target.follow_redirects, same-origin hops per attempt
MIB = 1024 * 1024
_DISTINCT = 20  # error descriptions counted by name; the rest as "other"


class Response:
    """An HTTP answer as a library caller receives it."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Response({self.status}, {len(self.body)} bytes)"


class TransportBase:
    """The defaults of a `Transport`'s optional parts: nothing counted, no probe of its own."""

    def stats(self) -> dict[str, Any]:
        return {}

    def prober(self) -> ProbeGet | None:
        return None


#: A key's plain GET, prebuilt (`_Building.lean_get`): the query's head, the key's own headers, the URL.
_Lean = tuple[str, Any, URL | RqUrl | None]


class _Building:
    """The request-building part of `HttpTransport`: the target's URL in pieces, the headers and
    lean URLs of each key (built once per key), the path rules and the signer."""

    __slots__ = (
        "target",
        "credentials",
        "post_url",
        "origin",
        "base",
        "base_query",
        "base_parts",
        "static",
        "origin_url",
        "path",
        "paths",
        "signer",
        "headers_by_key",
        "lean_by_key",
        "native",
        "wire_base",
    )

    def __init__(
        self,
        target: TargetConfig,
        given: URL,
        paths: tuple[PathRule, ...],
        native: Callable[[Mapping[str, str]], Any] = CIMultiDict,
        wire_url: Callable[[str], Any] | None = None,
    ):
        self.target = target
        # The client's own header type, for headers built once per key: a client converts a
        # plain mapping on every request (pyreqwest: 12 µs of its 60).
        self.native = native
        # Credentials in the URL go as HTTP Basic (`key_headers`); the URLs we send carry
        # none (aiohttp would refuse them beside an Authorization header).
        self.credentials = (given.user, given.password) if given.user is not None else None
        parsed = self.post_url = given.with_user(None) if given.user is not None else given
        self.origin = (parsed.scheme, parsed.host, parsed.port)
        # Our parameters go after the URL's own query string, in one query.
        self.base = str(parsed.with_query(None).with_fragment(None))
        # A lean GET's URL in the client's own type (pyreqwest's `Url`), built on this one
        # parsed base by setting its query: 0.3 µs, where parsing the text costs 1.1.
        self.wire_base = _wire_base(wire_url, self.base)
        self.base_query = parsed.raw_query_string
        self.base_parts = (parsed.scheme, parsed.raw_authority, parsed.raw_path)
        self.static = "&".join(f"{quote(str(k))}={quote(str(v))}" for k, v in target.params.items())
        self.origin_url = str(parsed.origin()) if parsed.is_absolute() else self.base
        self.path = parsed.path or "/"
        self.paths = PathTable(paths)
        self.signer = signer_for(target.signing) if target.signing else None
        self.headers_by_key: dict[str, dict[str, str]] = {}
        self.lean_by_key: dict[str, _Lean | bool] = {}  # False: not lean

    def fields(self, key: KeySpec, req: Request, nonce: int | None) -> list[tuple[str, str]]:
        t = self.target
        fields: list[tuple[str, str]] = []
        if t.key_param and not t.key_header:
            fields.append((t.key_param, key.secret))
        if t.nonce_param and nonce is not None:
            fields.append((t.nonce_param, str(nonce)))
        if t.id_param:
            fields.append((t.id_param, str(req.id)))
        if req.params:
            fields.extend((str(k), str(v)) for k, v in req.params.items())
        return fields

    def get_url(self, fields: list[tuple[str, str]]) -> URL:
        parts = [self.base_query, "&".join(f"{k}={quote(v, safe='')}" for k, v in fields), self.static]
        query = "&".join(p for p in parts if p)
        # Pre-encoded: skips yarl's quoting, a measurable cost at 5,000/s.
        return URL(f"{self.base}?{query}" if query else self.base, encoded=True)

    def same_origin(self, current: URL, location: str) -> URL | None:
        """Where a redirect leads, if that is this target's own origin; else None."""
        try:
            nxt = current.join(URL(location))
        except (ValueError, TypeError):
            return None
        return nxt if (nxt.scheme, nxt.host, nxt.port) == self.origin else None

    def common_headers(self) -> dict[str, str]:
        """The headers every request carries whatever its key: the session's defaults."""
        t = self.target
        headers = {"User-Agent": t.user_agent or USER_AGENT, "Accept": "*/*"}
        if self.credentials is not None:  # credentials in the URL: HTTP Basic, as curl does
            user, password = self.credentials
            pair = f"{user}:{password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        for name, value in t.headers.items():  # the config's own headers
            _put(headers, name, value)
        return headers

    def key_headers(self, key: KeySpec) -> dict[str, str]:
        """The headers every request of this key carries (built once per key)."""
        headers = self.headers_by_key.get(key.label)
        if headers is None:
            t = self.target
            headers = self.common_headers()
            if t.key_header:  # and the key's, over any of the same name
                fmt = t.key_format or ("Bearer {key}" if t.key_header.lower() == "authorization" else "{key}")
                _put(headers, t.key_header, fmt.replace("{key}", key.secret))
            self.headers_by_key[key.label] = headers
        return headers

    def own_headers(self, key: KeySpec) -> Any:
        """What the key's headers add to the session's defaults (`common_headers`): its key
        header, or None. aiohttp merges a request's headers into the defaults one by one;
        passing none skips that."""
        common = self.common_headers()
        own = {name: value for name, value in self.key_headers(key).items() if common.get(name) != value}
        return self.native(own) if own else None

    def lean_get(self, key: KeySpec) -> _Lean | None:
        """For a plain GET (no shape, signing or path rule): the URL up to the varying fields,
        what the key's headers add to the session's (`own_headers`) and, when nothing varies per request (no nonce, id or parameters),
        the whole URL as a prebuilt `yarl.URL`; built once per key. None when this target
        needs more."""
        lean = self.lean_by_key.get(key.label)
        if lean is False:
            return None
        if lean is None:
            t = self.target
            rule = self.paths.lookup(self.path)
            if self.signer is not None or rule is not None or t.method != "GET":
                self.lean_by_key[key.label] = False
                return None
            key_field = (
                f"{t.key_param}={quote(key.secret, safe='')}" if t.key_param and not t.key_header else ""
            )
            head = "&".join(p for p in (self.base_query, key_field) if p)
            fixed: URL | RqUrl | None = None
            if not t.nonce_param and not t.id_param:
                query = "&".join(p for p in (head, self.static) if p)
                scheme, authority, path = self.base_parts
                if self.wire_base is not None:
                    fixed = self.wire_base.with_query_string(query or None)
                elif query:
                    fixed = URL.build(
                        scheme=scheme, authority=authority, path=path, query_string=query, encoded=True
                    )
                else:
                    fixed = URL(self.base, encoded=True)
            lean = self.lean_by_key[key.label] = (head, self.own_headers(key), fixed)
        assert isinstance(lean, tuple)
        return lean

    def lean_url(self, head: str, req: Request, nonce: int | None) -> URL | RqUrl:
        """The same query `get_url` builds, from the key's prebuilt head."""
        t = self.target
        parts = [head] if head else []
        if t.nonce_param and nonce is not None:
            parts.append(f"{t.nonce_param}={nonce}")
        if t.id_param:
            parts.append(f"{t.id_param}={req.id}")
        if req.params:
            parts.extend(f"{k}={quote(str(v), safe='')}" for k, v in req.params.items())
        if self.static:
            parts.append(self.static)
        query = "&".join(parts)
        if self.wire_base is not None:
            return self.wire_base.with_query_string(query) if query else self.wire_base
        if not query:
            return URL(self.base, encoded=True)
        # From parts, not from text: parsing a whole URL string costs several times more.
        scheme, authority, path = self.base_parts
        return URL.build(scheme=scheme, authority=authority, path=path, query_string=query, encoded=True)

    def prepare(self, key: KeySpec, req: Request, nonce: int | None) -> tuple[str, URL | RqUrl, Any, Any]:
        """(method, URL, body, headers) for one attempt: shaped, signed, keyed."""
        t = self.target
        if req.shape is None and (lean := self.lean_get(key)) is not None:
            if lean[2] is not None and not req.params:
                return "GET", lean[2], None, lean[1]
            return "GET", self.lean_url(lean[0], req, nonce), None, lean[1]
        shape = req.shape
        if shape is not None and shape.payload is not None:
            return self.verbatim(key, req, shape, shape.payload)
        fields = self.fields(key, req, nonce)
        headers = self.key_headers(key)
        rule = self.paths.lookup(shape.path if shape is not None and shape.path else self.path)
        method = (shape.method if shape is not None else None) or (rule.method if rule else None) or t.method
        if shape is None and self.signer is None and (rule is None or not rule.signed):
            if method == "GET":  # the common case, kept lean
                return "GET", self.get_url(fields), None, headers
            if not req.idempotency_key:
                return method, self.post_url, dict(fields) | dict(t.params), headers
        base, base_query = self.base, self.base_query
        if shape is not None and shape.path:
            base, base_query = self.origin_url + shape.path, ""
            path = shape.path
        else:
            path = self.path
        fields.extend(t.params.items())
        signed = self.signer is not None and (rule is None or rule.signed is not False)
        signature: dict[str, str] | None = None
        if signed:
            assert self.signer is not None
            signature = self.signer(SignInput(method, path, fields, key.secret, key.api_secret or "", nonce))
            headers = {**headers, **signature}
        if req.idempotency_key and method != "GET":
            headers = {**headers, "Idempotency-Key": req.idempotency_key}
        data: str | None = None
        if method == "GET":
            query = "&".join(q for q in (base_query, encode(fields)) if q)
            url = URL(f"{base}?{query}" if query else base, encoded=True)
        else:
            url = URL(f"{base}?{base_query}" if base_query else base, encoded=True)
            if shape is not None and shape.body == "json":
                data, headers = json.dumps(dict(fields)), {**headers, "Content-Type": "application/json"}
            else:
                data, headers = encode(fields), {**headers, "Content-Type": _FORM}
        if shape is not None and shape.headers:
            headers = self.with_extra(headers, shape.headers, signature)
        return method, url, data, headers

    def with_extra(
        self, headers: dict[str, str], extra: tuple[tuple[str, str], ...], signed: dict[str, str] | None
    ) -> dict[str, str]:
        """`headers` with a shape's `extra` headers (`Shape.headers`) after them: each replaces
        ours of the same name, except the key's, authorization, the signature's (`signed`) and
        the framing aiohttp writes itself."""
        kept = set(_PROTECTED)
        if self.target.key_header:
            kept.add(self.target.key_header.lower())
        if signed:
            kept.update(name.lower() for name in signed)
        out = dict(headers)
        for name, value in extra:
            if name.lower() not in kept:
                _put(out, name, value)
        return out

    def verbatim(self, key: KeySpec, req: Request, shape: Shape, payload: bytes) -> tuple[str, URL, Any, Any]:
        """A line's object `_body`, sent as it is: its JSON bytes (encoded once, `take_shape`), the
        key's headers (the key header, the config's headers) and nothing else: no parameters, nonce,
        id or key field, no target params, no signature (a signing target refuses such lines)."""
        if self.signer is not None:  # read_jsonl and the store's workload refuse it before this
            raise SigningError("an object _body is sent as it is and cannot be signed")
        headers = {**self.key_headers(key), "Content-Type": "application/json"}
        if req.idempotency_key:
            headers["Idempotency-Key"] = req.idempotency_key
        if shape.path:
            url = URL(self.origin_url + shape.path, encoded=True)
        else:
            url = URL(f"{self.base}?{self.base_query}" if self.base_query else self.base, encoded=True)
        if shape.headers:
            headers = self.with_extra(headers, shape.headers, None)
        return shape.method or "POST", url, payload, headers


class _Reading:
    """The answer-reading part of `HttpTransport`: the body cap, the API's rules, the delay
    hook, and the mask every text from the target goes through."""

    __slots__ = ("mask", "delay_hook", "rules", "rules_read_body", "body_cap")

    def __init__(self, target: TargetConfig, delay_hook: DelayHook | None, mask: Redactor):
        self.mask = mask
        self.delay_hook = delay_hook or (json_field_hook(target.delay_field) if target.delay_field else None)
        self.rules = target.rules
        self.rules_read_body = any(rule.reads_body for rule in target.rules)
        self.body_cap = target.max_body_mb * MIB


class _Connection:
    """The connection part of `HttpTransport`: the session (opened on the first send), its
    deadlines, the probe's own session, and the counts of sends."""

    __slots__ = ("wire", "max_connections", "attempts", "deadlines", "probe_close")

    def __init__(self, max_connections: int):
        self.wire: Wire | None = None
        self.max_connections = max_connections
        self.attempts = [0]  # aiohttp's sends, its own resends included (its request class counts)
        self.deadlines: AttemptDeadlines | None = None
        self.probe_close: Any = None


class HttpTransport(TransportBase):
    """HTTP through pyreqwest (Rust's reqwest, `reqwest_client.py`) by default, or aiohttp's
    client, tuned (`client.py`), with `target.http_client = "aiohttp"`; keep-alive, the key in
    a parameter or a header.

    Hostile targets in mind:
    - error texts are built from the exception type, never from its message
      (which may quote the URL, and the URL may carry the key); an error
      body is masked with `redact` for every key (and URL credentials)
      before it is cut to `ERROR_TEXT_CHARS`;
    - redirects are not followed (a 3xx is a failure naming the status and
      the Location, shown without query or credentials); with
      `target.follow_redirects`, only to the same origin, so the key never
      travels to another host;
    - a target URL with its own query string keeps it: our parameters are
      added to it.

    - a body is read up to `target.max_body_mb` once decompressed (a 2xx past
      it fails, unretried: a gzip bomb is not read twice); an error body up to
      `ERROR_BODY_BYTES`.

    A request with a live client (`Request.answer`, the gateway's) gets a
    streamed answer (an event stream, or a chunked body it asked to stream) as
    it arrives (`_stream`): its headers as received (the sink shows its client what
    `answer_headers` lets through), then one whole SSE event per write; its usage is
    read on the way. Any other answer to such a request keeps its raw headers and body
    on the outcome. A request without
    one pays one look (`Request.live_answer`) for this, no more.

    `answers` (and `statuses`), `no_answer` and `redirects` count what came
    back, so a run can say "connection refused x57" instead of a bare 0 req/s;
    `retried` counts sends repeated once on a new connection after a kept-alive
    one turned out closed (an idempotent request only).
    """

    def __init__(
        self,
        target: TargetConfig,
        url: str,
        max_connections: int,
        delay_hook: DelayHook | None = None,
        secrets: tuple[str, ...] | list[str] = (),
        paths: tuple[PathRule, ...] = (),
    ):
        self.target = target
        self.url = url
        given = URL(url)
        reqwest = target.http_client == "reqwest"
        self._building = _Building(
            target,
            given,
            paths,
            native_headers if reqwest else CIMultiDict,
            wire_url=RqUrl if reqwest else None,
        )
        # Credentials in the URL are secrets too: masked wherever text is shown.
        self._reading = _Reading(
            target, delay_hook, Redactor((*secrets, given.password or "", given.user or ""))
        )
        self._conn = _Connection(max_connections)
        self.answers = 0  # HTTP answers read whole, of any status
        self.statuses: Counter[int] = Counter()  # the same, by status
        self.no_answer: Counter[str] = Counter()  # attempts with no answer, by cause
        self.redirects: Counter[str] = Counter()  # 3xx answers not followed, by status and place
        self.consecutive_no_answer = 0

    def stats(self) -> dict[str, Any]:
        """What came back, for the run's summary: plain data, safe to print."""
        return {
            "answers": self.answers,
            "statuses": dict(sorted(self.statuses.items())),
            "no_answer": dict(self.no_answer.most_common()),
            "redirects": dict(self.redirects.most_common()),
            "consecutive_no_answer": self.consecutive_no_answer,
            "retried": self.retried,
        }

    @property
    def retried(self) -> int:
        """Sends the client repeated on a new connection after a kept-alive one was found closed
        (aiohttp does, for an idempotent request; pyreqwest leaves it to the engine)."""
        wire = self._conn.wire
        return wire.retried if wire is not None else 0

    @property
    def delay_hook(self) -> DelayHook | None:
        return self._reading.delay_hook

    def _open(self) -> Wire:
        # One session for the run (client.py), and no timer per request: `AttemptDeadlines`
        # times every attempt out with one timer for all.
        conn = self._conn
        building = self._building
        target, url, limit, headers = (
            self.target,
            building.post_url,
            conn.max_connections,
            building.common_headers(),
        )
        wire: Wire
        if target.http_client == "aiohttp":
            wire = AioWire(open_client(target, url, limit, conn.attempts, headers))
        else:
            wire = open_reqwest(target, url, limit, headers)
        conn.wire = wire
        conn.deadlines = AttemptDeadlines(self.target.timeout_s)
        return wire

    def prober(self) -> ProbeGet | None:
        """`target.probe_url` timed on a session of its own, set up as the traffic's (proxy, TLS)."""
        if not self.target.probe_url:
            return None
        get, self._conn.probe_close = probe_get(self.target, self.target.probe_url, self.target.timeout_s)
        return get

    def _show_location(self, current: URL, location: str | None) -> str:
        if not location:
            return "no Location"
        try:
            shown = safe_url(str(current.join(URL(location))))
        except (ValueError, TypeError):
            shown = "an unreadable Location"
        return _cut(self._reading.mask(_printable(shown)), 120)

    def _note(self, counter: Counter[str], text: str) -> None:
        counter[text if text in counter or len(counter) < _DISTINCT else "other"] += 1

    async def send(self, key: KeySpec, req: Request, nonce: int | None) -> Outcome:
        wire = self._conn.wire or self._open()
        t = self.target
        mask = self._reading.mask
        mask.add(key.secret)
        if key.api_secret:
            mask.add(key.api_secret)
        try:
            method, url, data, headers = self._building.prepare(key, req, nonce)
        except SigningError as exc:
            return Outcome(CLIENT_ERROR, error=f"not signed: {exc}")
        except (
            Exception
        ) as exc:  # a signing hook's own bug: named, never with its message (it may hold the secret)
            return Outcome(CLIENT_ERROR, error=f"not signed: {t.signing} raised {type(exc).__name__}")
        if req.live_answer() is None:
            if method in _IDEMPOTENT_METHODS or t.safe_writes:  # safe_writes: repeating does nothing twice
                return await self._exchange(wire, method, url, data, headers)
            out = await self._exchange(wire, method, url, data, headers)
        else:  # a live client waits: a streamed answer goes to it as it arrives
            out = await self._exchange(wire, method, url, data, headers, req)
            _keep_raw(out)
            if method in _IDEMPOTENT_METHODS or t.safe_writes:
                return out
        # A write: what settle.decide needs to tell a failed write from an uncertain one.
        out.write = True
        out.keyed = bool(req.idempotency_key)
        response = out.response
        if isinstance(response, Response):
            answer_headers = response.headers
            for name in t.request_id_headers:
                rid = answer_headers.get(name)
                if rid:
                    out.request_id = _printable(rid)[:200]
                    break
            if t.replayed_header:
                out.replayed = str(answer_headers.get(t.replayed_header, "")).lower() == "true"
        elif out.kind is CONNECTION and out.error is not None and out.error.startswith(_NOT_SENT):
            out.maybe_sent = False
        return out

    async def _exchange(
        self,
        wire: Wire,
        method: str,
        url: URL | RqUrl,
        data: Any,
        headers: Any,
        live: Request | None = None,
    ) -> Outcome:
        """The one exchange of an attempt, on any `Wire`: sent (a same-origin redirect followed,
        `_hop`), the answer's body read up to its cap, the answer ended, then classified
        (`_answered`), or why there was none. With `live` (a request whose client waits,
        `Request.answer`), a streamed answer goes to that client as it arrives (`_stream`).
        On pyreqwest (`ReqwestWire`) each step is pyreqwest's own call on its own request and
        answer: no wrapper, no coroutine of ours for a body its Content-Length bounds."""
        start, watch = self._begin()
        hops = 0
        opening: Any = None
        resp: Any = None
        status = 0
        try:
            while True:
                opening = wire.open(method, url, data, headers, live is not None)
                resp = await opening.__aenter__()
                status = resp.status
                if 300 <= status < 400 and hops < MAX_REDIRECTS and self.target.follow_redirects:
                    nxt = self._hop(url, resp)
                    if nxt is not None:
                        left, resp = resp, None
                        await wire.end(opening, left)
                        hops += 1
                        url = nxt
                        if status == 303 or (status in (301, 302) and method == "POST"):
                            method, data = "GET", None
                        continue
                if status < 300:
                    if live is not None and _streams(wire, resp, live):
                        return await self._stream(_Passing(live, resp, start), watch)
                    raw = bytes(await wire.read(resp, self._reading.body_cap))
                else:
                    raw = bytes(await wire.read(resp, ERROR_BODY_BYTES, True))
                break
        except BaseException as exc:
            return self._unanswered(exc, watch, status, wire, start)
        finally:
            watch.task = None  # answered (or not): the deadline no longer applies
            if resp is not None:
                await wire.end(opening, resp)
        return self._answered(status, resp.headers, raw, url, start)

    def _begin(self) -> tuple[float, _Watch]:
        """An attempt starts: its clock (precise even where the loop's is coarse) and its deadline."""
        deadlines = self._conn.deadlines
        assert deadlines is not None
        return time.monotonic(), deadlines.watch()

    def _unanswered(
        self, exc: BaseException, watch: _Watch, status: int, wire: Wire, start: float
    ) -> Outcome:
        """An attempt that raised `exc` (called while it is handled): a timeout when its
        deadline cancelled it, a body over the cap, or whatever the target did (an attempt with
        no answer). Anything else goes on as it is: a cancellation from outside (the engine's
        drain), an interrupt."""
        if isinstance(exc, asyncio.CancelledError):
            if not watch.fired:
                raise  # the exception being handled, re-raised as it is
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the deadline's cancellation, and only it, ends here
            return self._no_answer(TIMEOUT, "timed out", start)
        if isinstance(exc, BodyTooLarge):
            return self._too_large(status, start)
        if isinstance(exc, Exception):
            return self._no_answer(*_why(exc, wire), start)
        raise

    def _hop(self, url: URL | RqUrl, resp: Any) -> URL | None:
        """Where a 3xx leads, when it is to be followed: to this target's own origin (its body is
        then not wanted); else None."""
        location = resp.headers.get("Location")
        if location is None:
            return None
        return self._building.same_origin(_url(url), location)

    def _answered(
        self, status: int, resp_headers: Any, raw: bytes, url: URL | RqUrl, start: float
    ) -> Outcome:
        """An answer read whole, counted and classified: the API's own rules first, then its status."""
        latency = time.monotonic() - start
        self.answers += 1
        self.statuses[status] += 1
        self.consecutive_no_answer = 0
        reading = self._reading
        # One look at the names first: most answers carry no hint, and then no
        # RateLimit-Policy either (a "ratelimit" name), so it is not asked for.
        hints = hint_names(resp_headers)
        policy = (
            resp_headers.get("RateLimit-Policy") if hints is None or "ratelimit-policy" in hints else None
        )
        response = Response(status, resp_headers, raw)
        if reading.rules:
            # The API's own rules first: a 200 that carries an error, a 403 that is a rate limit.
            body = raw.decode("utf-8", "replace") if reading.rules_read_body or status >= 300 else ""
            rule = first_match(reading.rules, status, resp_headers, body)
            if rule is not None:
                if rule.kind is OK:
                    return _hinted(
                        Outcome(OK, status, None, latency, None, policy, response), resp_headers, hints
                    )
                delay = _delay_of(status, resp_headers, body, reading.delay_hook, any_status=True)
                if delay is None:
                    delay = rule.delay_s
                text = self.error_text(body) or f"HTTP {status}"
                return _hinted(
                    Outcome(rule.kind, status, delay, latency, text, policy, response), resp_headers, hints
                )
        if 200 <= status < 300:
            return _hinted(Outcome(OK, status, None, latency, None, policy, response), resp_headers, hints)
        t = self.target
        if 300 <= status < 400:
            # Never a success: the answer is somewhere we did not (or may not) go.
            location = resp_headers.get("Location")
            why = "not followed" if not t.follow_redirects else "to another origin or too many, not followed"
            error = f"HTTP {status} redirect to {self._show_location(_url(url), location)} ({why})"
            self._note(self.redirects, error)
            return Outcome(CLIENT_ERROR, status, None, latency, error, policy, response)
        body = raw.decode("utf-8", "replace")
        delay = _delay_of(status, resp_headers, body, reading.delay_hook)
        outcome = Outcome(
            classify(status, body, uses_nonce=bool(t.nonce_param)),
            status,
            delay,
            latency,
            self.error_text(body),
            policy,
            response,
        )
        return _hinted(outcome, resp_headers, hints)

    def _too_large(self, status: int, start: float) -> Outcome:
        """A 2xx whose body outgrew `target.max_body_mb` once decompressed: an answer, not read."""
        self.answers += 1
        self.statuses[status] += 1
        self.consecutive_no_answer = 0
        error = f"HTTP {status} with a body over {self.target.max_body_mb} MiB once decompressed (target.max_body_mb); not read"
        return Outcome(CLIENT_ERROR, status, None, time.monotonic() - start, error)

    async def _stream(self, passing: _Passing, watch: _Watch) -> Outcome:
        """A streamed answer passed to its live client (`_pass_on`); the upstream failing after
        the answer began (its deadline, a read timeout, a broken connection) is an outcome that
        says so (`_Passing.broken`), and the connection never stays half-read."""
        try:
            out = await self._pass_on(passing)
            if out.error is not None:  # it may quote the upstream's words: every key masked
                out.error = self.error_text(out.error)
            return out
        except asyncio.CancelledError:
            if not watch.fired:
                raise  # stopped from outside (the engine's drain), not timed out
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the deadline's cancellation, and only it, ends here
            return passing.broken(TIMEOUT, "timed out")
        except Exception as exc:
            assert self._conn.wire is not None
            return passing.broken(*_why(exc, self._conn.wire))

    async def _pass_on(self, passing: _Passing) -> Outcome:
        """Pass a streamed answer to its live client as it arrives: `begin` once, then `write`
        for each whole SSE event (each piece as it came, for a stream that is not SSE), reading
        the usage the stream reports on the way. A client gone closes the upstream at once
        and cancels the request."""
        resp, sink = passing.resp, passing.sink
        wire = self._conn.wire
        assert wire is not None
        status = resp.status
        self.answers += 1
        self.statuses[status] += 1
        self.consecutive_no_answer = 0
        shown = tuple(resp.headers.items())
        passing.sent = True  # the status and headers are the answer's first bytes: no retry after them
        if not await passing.call(sink.begin(status, shown)):
            return passing.gone()
        if not passing.events:
            async for piece in wire.pieces(resp):
                passing.sent = True
                if not await passing.call(sink.write(piece)):
                    return passing.gone()
            return passing.finished()
        pending = bytearray()
        scan = 0  # where the search for the blank line resumes: no byte is searched twice
        cap = self._reading.body_cap
        async for piece in wire.pieces(resp):
            pending += piece
            while True:
                end = _event_end(pending, scan)
                if end < 0:
                    scan = max(0, len(pending) - 3)  # a separator may straddle the next piece
                    break
                event = bytes(pending[:end])
                del pending[:end]
                scan = 0
                passing.read(event)
                passing.sent = True
                if not await passing.call(sink.write(event)):
                    return passing.gone()
            if len(pending) > cap:
                return passing.broken(CLIENT_ERROR, f"an event over {self.target.max_body_mb} MiB")
        if pending:  # the last event, with no blank line after it: still the client's
            passing.read(bytes(pending))
            passing.sent = True
            if not await passing.call(sink.write(bytes(pending))):
                return passing.gone()
        return passing.finished()

    def error_text(self, text: str) -> str:
        """`text` from the target fit to show: every key masked first, then one line, then cut.

        A long body is masked on a window first: when what is left of it is
        still longer than the cut plus the longest form of a key, a form cut
        at the window's end cannot reach the part kept.
        """
        mask, limit = self._reading.mask, ERROR_TEXT_CHARS
        window = 2 * (limit + mask.longest)
        if len(text) > window:
            head = _printable(mask(text[:window]))
            if len(head) >= limit + mask.longest:
                return head[:limit] + "…"
        return _cut(_printable(mask(text)), limit)

    def _no_answer(self, kind, description: str, start: float) -> Outcome:
        self._note(self.no_answer, description)
        self.consecutive_no_answer += 1
        return Outcome(kind, latency_s=time.monotonic() - start, error=description)

    async def close(self) -> None:
        conn = self._conn
        if conn.probe_close is not None:
            await conn.probe_close()
        if conn.wire is not None:
            await conn.wire.close()
            conn.wire = None


#: Request headers a shape's extra headers never replace (lower case): credentials, and the
#: framing aiohttp writes from the body it sends.
_PROTECTED = frozenset(
    {"authorization", "proxy-authorization", "host", "content-length", "transfer-encoding", "connection"}
)
#: Idempotent methods (RFC 9110 9.2.2): sending one again changes nothing, on any key.
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
#: A connection that failed this way never carried the request (engine/client.describe names them).
_NOT_SENT = ("connection refused", "cannot connect")


def _put(headers: dict[str, str], name: str, value: str) -> None:
    """Set header `name`, replacing one of the same name in any case."""
    for ours in [n for n in headers if n.lower() == name.lower()]:
        del headers[ours]
    headers[name] = value


def _keep_raw(out: Outcome) -> None:
    """Keep the answer's raw headers and body on `out`, for a live client (`Request.answer`);
    a streamed answer's body went to the client already."""
    response = out.response
    if isinstance(response, Response):
        out.headers = tuple(response.headers.items())
        if not out.streamed:
            out.body = response.body


def _streams(wire: Wire, resp: Any, req: Request) -> bool:
    """Whether a 2xx answer is a stream to pass on as it arrives: an event stream, or a chunked
    body with no length to a request whose JSON body asked for `"stream": true`."""
    headers = resp.headers
    if headers.get("Content-Type", "").lower().startswith("text/event-stream"):
        return True
    if wire.length(resp) is not None or "chunked" not in headers.get("Transfer-Encoding", "").lower():
        return False
    shape = req.shape
    return shape is not None and isinstance(shape.body, dict) and shape.body.get("stream") is True


def _event_end(buf: bytearray, start: int) -> int:
    """The end of the first whole SSE event in `buf` (just past its blank line), searching from
    `start`; -1 if none is whole yet. Lines end in LF, CRLF or CR (the SSE spec's three)."""
    best = -1
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = buf.find(sep, start)
        if at >= 0 and (best < 0 or at + len(sep) < best):
            best = at + len(sep)
        if sep == b"\n\n" and b"\r" not in buf:
            break  # the common case: LF only
    return best


class _Passing:
    """One streamed answer on its way to a live client: what went out, the usage read so far."""

    __slots__ = ("req", "sink", "resp", "start", "head_s", "events", "sent", "usage", "said_error")

    def __init__(self, req: Request, resp: Any, start: float):
        self.req = req
        self.sink = req.answer
        self.resp = resp
        self.start = start
        self.head_s = time.monotonic() - start  # the answer's head is in
        req.head_in()  # and a stream may run long: its slots are not held for it
        self.events = resp.headers.get("Content-Type", "").lower().startswith("text/event-stream")
        self.sent = False  # the client has the answer's start (its status and headers, `begin`)
        self.usage: dict[str, Any] = {}
        self.said_error: str | None = None  # an error event's type (Anthropic's overloaded_error)

    async def call(self, step: Any) -> bool:
        """The sink's answer to one step; a sink that raises is a client gone (its connection
        failed), never the upstream's fault."""
        try:
            return bool(await step)
        except Exception:
            return False

    def read(self, event: bytes) -> None:
        """Note the usage an event reports (OpenAI's last chunk; Anthropic's message_start and
        message_delta, merged) and an error event. Most events carry neither: one look skips them."""
        if b"error" not in event and (b'"usage"' not in event or b'"usage":null' in event):
            return  # OpenAI's chunks with include_usage say "usage":null until the last
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            try:
                data = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            usage = data.get("usage")
            message = data.get("message")
            if not isinstance(usage, dict) and isinstance(message, dict):
                usage = message.get("usage")  # message_start
            if isinstance(usage, dict):
                self.usage.update(usage)
            error = data.get("error")  # Anthropic's `error` event, OpenAI's {"error": {...}} chunk
            if isinstance(error, dict):
                self.said_error = _printable(str(error.get("type") or "error"))[:80]

    def _outcome(self, kind: Any, error: str | None) -> Outcome:
        resp = self.resp
        body = json.dumps({"usage": self.usage}).encode() if self.usage else b""
        headers = resp.headers
        out = Outcome(
            kind,
            resp.status,
            None,
            time.monotonic() - self.start,
            error,
            headers.get("RateLimit-Policy"),
            Response(resp.status, headers, body),
        )
        out.streamed = self.sent
        out.head_s = self.head_s
        return _hinted(out, headers, hint_names(headers))

    def finished(self) -> Outcome:
        """The stream ended whole: a success, its usage in `response` as a JSON body's would be
        (so `settle` budgets work as for an answer sent whole); unless it said an error."""
        if self.said_error is not None:
            return self._outcome(
                SERVER_ERROR, f"the stream broke after the answer began: an error event ({self.said_error})"
            )
        return self._outcome(OK, None)

    def broken(self, kind: Any, why: str) -> Outcome:
        """The upstream failed after the answer began (the connection is dropped: `_exchange`
        ends every answer, and one not read to its end is not kept)."""
        return self._outcome(kind, f"the stream broke after the answer began ({why})")

    def gone(self) -> Outcome:
        """The client went away: the upstream is closed at once (`_exchange` ends the answer
        unread) and the request ends cancelled."""
        self.req.cancelled = True
        return self._outcome(CONNECTION, "its client went away during the answer; the upstream was closed")


def _wire_base(wire_url: Callable[[str], Any] | None, base: str) -> Any:
    """`base` in the client's own URL type, if it has one and takes it (else URLs go as text)."""
    if wire_url is None:
        return None
    try:
        return wire_url(base)
    except ValueError:  # not absolute (a test's stand-in): sent as text, the client says why
        return None


def _url(url: Any) -> URL:
    """A URL sent in the client's own type (a lean GET to pyreqwest) as a `URL`, to resolve a
    Location against."""
    return url if isinstance(url, URL) else URL(str(url), encoded=True)


def _why(exc: Exception, wire: Wire) -> tuple[Any, str]:
    """An attempt with no answer: a timeout or a connection failure, and the phase that failed,
    from the error's kind (`describe`, `describe_reqwest`), never its message."""
    why = describe_reqwest(exc, wire.proxy is not None)
    if why is not None:
        return (TIMEOUT if why.endswith("timed out") else CONNECTION), why
    if isinstance(exc, TimeoutError):  # aiohttp's own phase timeouts (connect, read) name the phase
        return TIMEOUT, describe(exc) if exc.__class__ is not TimeoutError else "timed out"
    return CONNECTION, describe(exc)


def _hinted(outcome: Outcome, headers, names: frozenset[str] | None) -> Outcome:
    """`outcome` with what the answer says besides its status: timing hints (server time,
    remaining count; see delays.answer_hints) and the server's own counts (delays.read_quotas).

    `names` are the answer's hint names (`delays.hint_names`): most answers carry none, and
    then neither reader runs; else each looks up only the names the answer holds."""
    if names is not None and not names:
        return outcome
    outcome.server_time_s, outcome.remaining = answer_hints(headers, names)
    outcome.quotas = read_quotas(headers, None, names)
    return outcome


_current_task = asyncio.current_task  # the C version where there is one (no module lookup per call)


class _Watch:
    """One attempt under a deadline: its task until it is answered, and whether it timed out."""

    __slots__ = ("deadline", "task", "fired")

    def __init__(self, deadline: float, task: asyncio.Task | None):
        self.deadline = deadline
        self.task = task
        self.fired = False


class AttemptDeadlines:
    """Times attempts out with one timer for all of them, not one per request.

    Every attempt gets the same timeout, so deadlines arrive in send order: a
    FIFO holds them and one `call_at` timer waits for the oldest still in
    flight. When it fires it cancels the attempts past their deadline (marked
    `fired`, so `send` turns the cancellation into a timeout) and re-arms for
    the next. Answered attempts are dropped from the front as new ones come.
    """

    __slots__ = ("timeout_s", "_fifo", "_timer", "_loop")

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fifo: deque[_Watch] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self) -> _Watch:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fifo = self._fifo
        while fifo and fifo[0].task is None:  # answered ones at the front: forget them
            fifo.popleft()
        w = _Watch(loop.time() + self.timeout_s, _current_task(loop))
        fifo.append(w)
        if self._timer is None:
            self._timer = loop.call_at(w.deadline, self._fire)
        return w

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        fifo = self._fifo
        while fifo:
            w = fifo[0]
            if w.task is None:
                fifo.popleft()
            elif w.deadline <= now:
                fifo.popleft()
                w.fired = True
                w.task.cancel()
                w.task = None
            else:
                self._timer = loop.call_at(w.deadline, self._fire)
                return

    def __len__(self) -> int:
        return sum(1 for w in self._fifo if w.task is not None)


def _delay_of(
    status: int, headers, body: str, hook: DelayHook | None, any_status: bool = False
) -> float | None:
    """The wait an answer asks for; a header no parser understands asks for none."""
    try:
        return response_delay(429 if any_status else status, headers, body, hook)
    except Exception:
        return None


def http_transport(cfg: EngineSettings, url: str) -> HttpTransport:
    """The HTTP transport for a run at one target: enough connections for every key's
    in-flight requests, every key's secrets masked, the config's path rules (a pool of
    endpoints: `endpoints.run_transport`)."""
    secrets = [k.secret for k in cfg.keys] + [k.api_secret for k in cfg.keys if k.api_secret]
    max_conn = max(1, len(cfg.keys) * cfg.in_flight_ceiling)
    return HttpTransport(cfg.target, url, max_conn, secrets=secrets, paths=cfg.paths)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _printable(text: str) -> str:
    """One line of printable characters: no newlines, escapes or terminal control codes."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
