"""What came back from one attempt, and what it means for the request."""

from __future__ import annotations

# Kinds of outcome. The engine decides what to do by kind alone.
OK = "ok"
RATE_LIMITED = "rate_limited"  # 429: too fast (retry, widen headroom)
BLOCKED = "blocked"  # the key is refused for good (401/403, seed's "blocked")
NONCE = "nonce"  # out-of-order nonce: the server wasted our slot; retry
CLIENT_ERROR = "client_error"  # other 4xx: retrying will not help
SERVER_ERROR = "server_error"  # 5xx (503 may carry Retry-After)
TIMEOUT = "timeout"
CONNECTION = "connection"


class Outcome:
    """One attempt's result. `status` is None when no HTTP answer arrived."""

    __slots__ = ("kind", "status", "retry_after_s", "latency_s", "error", "policy_header", "response")

    def __init__(
        self,
        kind: str,
        status: int | None = None,
        retry_after_s: float | None = None,
        latency_s: float = 0.0,
        error: str | None = None,
        policy_header: str | None = None,
        response=None,
    ):
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s  # the delay the server asked for, from any source
        self.latency_s = latency_s
        self.error = error
        self.policy_header = policy_header  # RateLimit-Policy as sent, when present
        self.response = response  # what a library caller gets back (transport-specific)

    def __repr__(self) -> str:
        return f"Outcome({self.kind}, {self.status}, retry_after={self.retry_after_s})"


def classify(status: int, body: str) -> str:
    """Map an HTTP status and body to an outcome kind.

    The body matters for the seed server: its permanent block is a 429 that
    says "blocked", and a nonce rejection is a plain 400.
    """
    if 200 <= status < 300:
        return OK
    if status == 429:
        return BLOCKED if "blocked" in body else RATE_LIMITED
    if status in (401, 403):
        return BLOCKED
    if status == 400 and "nonce" in body:
        return NONCE
    if 400 <= status < 500:
        return CLIENT_ERROR
    return SERVER_ERROR
