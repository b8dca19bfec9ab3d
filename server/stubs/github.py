"""GitHub REST API stub: primary limits per token and resource, secondary limits, headers on every answer.

What the public docs say, and what this stub does with it
(docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api,
.../troubleshooting-the-rest-api, .../getting-started-with-the-rest-api):

- Primary limit: 5,000 requests per hour per authenticated user (``core_limit``,
  ``core_window``); 60 per hour for unauthenticated requests, counted per IP
  (``unauth_limit``). The search endpoints have their own, smaller limit: the
  ``search`` resource, 30 per minute authenticated, 10 unauthenticated
  (``search_limit``, ``search_window``, ``unauth_search_limit``). Defaults are the
  documented numbers; tests pass small ones (e.g. 60 per 10 s).
- Headers on every answer: ``x-ratelimit-limit``, ``-remaining``, ``-used``,
  ``-reset`` (UTC epoch seconds), ``-resource``. ``GET /rate_limit`` does not count
  against the primary limit.
- Over the primary limit: 403 or 429 (``primary_status``, default 403) with
  ``x-ratelimit-remaining: 0`` and "API rate limit exceeded"; do not retry before
  ``x-ratelimit-reset``.
- Secondary limits: no more than 100 concurrent requests (``concurrency_limit``); no
  more than 900 points per minute (GET/HEAD/OPTIONS 1 point, POST/PATCH/PUT/DELETE 5;
  ``points_limit``, ``points_window``); about 80 content-creating requests per minute
  (``content_limit``, ``content_window``). Answer: 403 or 429 (``secondary_status``)
  with a message naming the secondary rate limit; ``retry-after`` when present
  (``secondary_retry_after``; None sends none, and the docs then say wait a minute).
- Requests without a ``User-Agent`` header are rejected (403).
- "Continuing to make requests while you are rate limited may result in the banning
  of your integration": every request that arrives before the announced reset or
  retry-after is flagged ``during_backoff`` in the ledger.

Where the docs are silent (the stricter plausible choice, stated):

- The window: it opens at the first counted request after the previous one ended and
  closes at ``ceil(start + window)`` (whole epoch seconds, as the header is); the reset
  header is exactly when fresh budget appears.
- A refused request uses no budget and leaves ``x-ratelimit-used`` at the limit.
- After a secondary refusal the token is held off until the retry-after it was told
  (or ``secondary_hold`` seconds when no header is sent); requests in that time are
  refused again as secondary.
- Points and content creation are counted in a sliding window (never more than the
  limit in any ``window``-long interval), which is stricter than a fixed minute.
- 404s and other answers from the API count against the primary limit, as requests.
- Primary exhaustion is checked before the secondary limits.

``allowed_capacity(start, end, key=TOKEN, bucket="core")``: the requests an ideal
client could have been served in [start, end): what remained at ``start`` in the
window then open (initial usage included), plus a full ``limit`` for every window it
could have opened from the next reset on (secondary limits not included; see the
report notes). ``stub.share(start, end, key=TOKEN, bucket="core")`` divides the
requests served ok by it.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .common import Clock, Ledger, Stub, serve, wall_clock, work

DOCS = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
PRIMARY_MESSAGE = "API rate limit exceeded for user."
SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID."
)
WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})


@dataclass
class Window:
    start: float
    reset: int  # epoch seconds; the window is [start, reset)
    initial: int = 0  # used before the stub started (a token that starts part-used)
    used: int = 0  # including initial


@dataclass
class _Call:
    """One request on its way through the checks: the key it is charged to, and how to answer."""

    state: GitHubState
    now: float
    method: str
    path: str
    resource: str
    key: str

    def record(
        self, status: int, outcome: str, cost: float = 0, backoff: bool = False, detail: str = ""
    ) -> None:
        self.state.ledger.add(
            at=self.now,
            key=self.key,
            method=self.method,
            path=self.path,
            status=status,
            outcome=outcome,
            bucket=self.resource,
            cost=cost,
            during_backoff=backoff,
            detail=detail,
        )

    def answer(self, status: int, body: Any, extra: dict[str, str] | None = None) -> web.Response:
        headers = self.state.headers(self.key, self.resource, self.now)
        headers.update(extra or {})
        return web.json_response(body, status=status, headers=headers)


class GitHubState:
    def __init__(
        self,
        *,
        tokens: dict[str, int] | list[str] | tuple[str, ...] = ("ghp_test",),
        clock: Clock = wall_clock,
        core_limit: int = 5000,
        core_window: float = 3600.0,
        search_limit: int = 30,
        search_window: float = 60.0,
        unauth_limit: int = 60,
        unauth_search_limit: int = 10,
        initial_used: dict[str, int] | None = None,
        initial_reset_in: dict[str, float] | float | None = None,
        primary_status: int = 403,
        concurrency_limit: int | None = 100,
        points_limit: int | None = 900,
        points_window: float = 60.0,
        content_limit: int | None = 80,
        content_window: float = 60.0,
        secondary_status: int = 403,
        secondary_retry_after: int | None = 60,
        secondary_hold: float = 60.0,
        latency: float = 0.0,
        hold: asyncio.Event | None = None,
    ) -> None:
        if isinstance(tokens, dict):
            self.token_limits = dict(tokens)
        else:
            self.token_limits = {t: core_limit for t in tokens}
        self.clock = clock
        self.windows_len = {"core": core_window, "search": search_window}
        self.search_limit = search_limit
        self.unauth = {"core": unauth_limit, "search": unauth_search_limit}
        self.primary_status = primary_status
        self.concurrency_limit = concurrency_limit
        self.points_limit, self.points_window = points_limit, points_window
        self.content_limit, self.content_window = content_limit, content_window
        self.secondary_status = secondary_status
        self.secondary_retry_after = secondary_retry_after
        self.secondary_hold = secondary_hold
        self.latency, self.hold = latency, hold
        self.ledger = Ledger()
        self.started = clock()
        self.windows: dict[tuple[str, str], list[Window]] = defaultdict(list)
        self.told_until: dict[tuple[str, str], float] = {}
        self.blocked_until: dict[str, float] = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self.points: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self.content: dict[str, deque[float]] = defaultdict(deque)
        self.issues: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for token, used in (initial_used or {}).items():
            if isinstance(initial_reset_in, dict):
                reset_in = initial_reset_in.get(token, core_window)
            else:
                reset_in = core_window if initial_reset_in is None else initial_reset_in
            w = Window(self.started, math.ceil(self.started + reset_in), initial=used, used=used)
            self.windows[(token, "core")].append(w)

    # -- limits -----------------------------------------------------------------

    def limit(self, key: str, resource: str) -> int:
        if key.startswith("ip:"):
            return self.unauth[resource]
        return self.token_limits[key] if resource == "core" else self.search_limit

    def window_at(self, key: str, resource: str, t: float) -> Window | None:
        for w in reversed(self.windows.get((key, resource), [])):
            if w.start <= t < w.reset:
                return w
        return None

    def open_window(self, key: str, resource: str, now: float) -> Window:
        w = self.window_at(key, resource, now)
        if w is None:
            w = Window(now, math.ceil(now + self.windows_len[resource]))
            self.windows[(key, resource)].append(w)
        return w

    def headers(self, key: str, resource: str, now: float) -> dict[str, str]:
        limit = self.limit(key, resource)
        w = self.window_at(key, resource, now)
        used = min(w.used, limit) if w else 0
        reset = w.reset if w else math.ceil(now + self.windows_len[resource])
        return {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(max(0, limit - used)),
            "x-ratelimit-used": str(used),
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": resource,
        }

    def allowed_capacity(
        self, start: float, end: float, *, key: str | None = None, bucket: str | None = None
    ) -> float:
        if end <= start:
            return 0
        if key is None:
            if len(self.token_limits) != 1:
                raise ValueError("several tokens: say which (key=...)")
            key = next(iter(self.token_limits))
        resource = bucket or "core"
        limit = self.limit(key, resource)
        w = self.window_at(key, resource, start)
        if w is not None:
            used_before = w.initial + int(
                self.ledger.charged(key=key, bucket=resource, start=w.start, end=start)
            )
            cap, nxt = max(0, limit - used_before), float(w.reset)
        else:
            cap, nxt = 0, start
        while nxt < end:
            cap += limit
            nxt = math.ceil(nxt + self.windows_len[resource])
        return cap

    # -- the request path -----------------------------------------------------------

    def secondary_check(self, key: str, method: str, now: float) -> str | None:
        if self.concurrency_limit is not None and self.in_flight[key] >= self.concurrency_limit:
            return "concurrency"
        if self.points_limit is not None:
            q = self.points[key]
            while q and q[0][0] <= now - self.points_window:
                q.popleft()
            cost = 5 if method in WRITE_METHODS else 1
            if sum(p for _, p in q) + cost > self.points_limit:
                return "points"
        if self.content_limit is not None and method in WRITE_METHODS:
            c = self.content[key]
            while c and c[0] <= now - self.content_window:
                c.popleft()
            if len(c) + 1 > self.content_limit:
                return "content"
        return None

    async def handle(self, request: web.Request) -> web.Response:
        now = self.clock()
        method, path = request.method, request.path
        resource = "search" if path.startswith("/search/") else "core"
        call = _Call(self, now, method, path, resource, key=f"ip:{request.remote}")
        refused = self.authenticate(call, request)
        if refused is not None:
            return refused
        if path == "/rate_limit":  # does not count against the primary limit
            call.record(200, "ok", detail="rate_limit")
            return call.answer(200, self.rate_limit_body(call.key, now))
        w = self.open_window(call.key, resource, now)
        refused = self.check_limits(call, w)
        if refused is not None:
            return refused
        return await self.accept(call, request, w)

    def authenticate(self, call: _Call, request: web.Request) -> web.Response | None:
        """A User-Agent is required; a token, when sent, must be known (else the IP is the key)."""
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if not request.headers.get("User-Agent"):
            call.record(403, "no_user_agent")
            return call.answer(
                403,
                {
                    "message": "Request forbidden by administrative rules. Please make sure your request has a User-Agent header.",
                    "documentation_url": "https://docs.github.com/rest/overview/resources-in-the-rest-api#user-agent-required",
                },
            )
        if auth:
            if scheme.lower() not in ("bearer", "token") or token.strip() not in self.token_limits:
                call.record(401, "unauthorized")
                return call.answer(
                    401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}
                )
            call.key = token.strip()
        return None

    def check_limits(self, call: _Call, w: Window) -> web.Response | None:
        """The primary limit first, then the secondary ones (a hold already given, or a new one)."""
        key, resource, now = call.key, call.resource, call.now
        told = self.told_until.get((key, resource), -math.inf)
        blocked = self.blocked_until.get(key, -math.inf)
        if w.used >= self.limit(key, resource):
            self.told_until[(key, resource)] = w.reset
            call.record(self.primary_status, "rate_limited", backoff=now < told or now < blocked)
            return call.answer(
                self.primary_status,
                {"message": f"{PRIMARY_MESSAGE} (see rate limits)", "documentation_url": DOCS},
            )
        reason = "held" if now < blocked else self.secondary_check(key, call.method, now)
        if reason is None:
            return None
        extra = {}
        if reason != "held":
            hold_for = (
                self.secondary_retry_after if self.secondary_retry_after is not None else self.secondary_hold
            )
            self.blocked_until[key] = now + hold_for
        if self.secondary_retry_after is not None:
            left = self.blocked_until[key] - now
            extra["retry-after"] = str(max(1, math.ceil(left)))
        call.record(
            self.secondary_status, "secondary_limited", backoff=now < blocked or now < told, detail=reason
        )
        return call.answer(
            self.secondary_status,
            {"message": SECONDARY_MESSAGE, "documentation_url": DOCS + "#about-secondary-rate-limits"},
            extra,
        )

    async def accept(self, call: _Call, request: web.Request, w: Window) -> web.Response:
        """Accepted: it uses budget now, whatever the endpoint answers."""
        key, method, now = call.key, call.method, call.now
        w.used += 1
        self.points[key].append((now, 5 if method in WRITE_METHODS else 1))
        if method in WRITE_METHODS:
            self.content[key].append(now)
        self.in_flight[key] += 1
        try:
            await work(self.latency, self.hold)
            status, body = await self.route(request, key, now)
        finally:
            self.in_flight[key] -= 1
        call.record(
            status, "ok" if status < 400 else "not_found" if status == 404 else "invalid_request", cost=1
        )
        return call.answer(status, body)

    def rate_limit_body(self, key: str, now: float) -> dict[str, Any]:
        res = {}
        for resource in ("core", "search"):
            h = self.headers(key, resource, now)
            res[resource] = {
                "limit": int(h["x-ratelimit-limit"]),
                "remaining": int(h["x-ratelimit-remaining"]),
                "reset": int(h["x-ratelimit-reset"]),
                "used": int(h["x-ratelimit-used"]),
                "resource": resource,
            }
        return {"resources": res, "rate": {k: v for k, v in res["core"].items() if k != "resource"}}

    async def route(self, request: web.Request, key: str, now: float) -> tuple[int, Any]:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if parts[:1] == ["search"] and len(parts) == 2 and method == "GET":
            q = request.query.get("q")
            if not q:
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"resource": "Search", "field": "q", "code": "missing"}],
                }
            return 200, {"total_count": 0, "incomplete_results": False, "items": []}
        if parts == ["user"] and method == "GET":
            return 200, {"login": key if not key.startswith("ip:") else "anonymous", "id": 1, "type": "User"}
        if len(parts) >= 3 and parts[0] == "repos":
            owner, repo = parts[1], parts[2]
            rest = parts[3:]
            if not rest and method == "GET":
                return 200, {"id": 1, "name": repo, "full_name": f"{owner}/{repo}", "private": False}
            if rest == ["issues"] and method == "GET":
                page = int(request.query.get("page", "1") or 1)
                per_page = min(100, int(request.query.get("per_page", "30") or 30))
                items = self.issues[(owner, repo)][(page - 1) * per_page : page * per_page]
                return 200, items
            if rest == ["issues"] and method == "POST":
                try:
                    body = json.loads(await request.text() or "{}")
                except ValueError:
                    return 400, {"message": "Problems parsing JSON"}
                if not isinstance(body, dict) or not body.get("title"):
                    return 422, {"message": "Validation Failed"}
                issues = self.issues[(owner, repo)]
                issue = {
                    "number": len(issues) + 1,
                    "title": body["title"],
                    "state": "open",
                    "created_at": int(now),
                }
                issues.append(issue)
                return 201, issue
            if len(rest) == 2 and rest[0] == "issues" and rest[1].isdigit() and method == "GET":
                n = int(rest[1])
                issues = self.issues[(owner, repo)]
                if 1 <= n <= len(issues):
                    return 200, issues[n - 1]
                return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
            if rest in (["pulls"], ["commits"], ["contributors"]) and method == "GET":
                return 200, []
        return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}


async def start_github(*, clock: Clock = wall_clock, **options: Any) -> Stub:
    """Start the GitHub stub; options are `GitHubState`'s (tokens, limits, initial usage, ...)."""
    state = GitHubState(clock=clock, **options)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return await serve(app, ledger=state.ledger, clock=clock, state=state)
