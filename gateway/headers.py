"""Which headers pass the gateway: what a client relies on passes, what belongs to us does not.

Upstream to client: the body's type, the upstream's request id and the API's own headers
pass; the upstream's rate-limit headers are dropped (they describe one of our keys, not
the client's share: a client that paced itself by them would pace wrongly), and so are
hop-by-hop headers and whatever aiohttp re-encodes (length, encoding).
"""

from __future__ import annotations

from collections.abc import Iterable

_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "date",
        "server",
        "set-cookie",
        "retry-after",
    }
)
_RATE_PREFIXES = ("x-ratelimit", "ratelimit", "x-rate-limit", "anthropic-ratelimit")


def answer_headers(upstream: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream answer's headers a client may see (after the engine's own filter,
    `engine.http.answer_headers`, which drops account headers and any that holds a key)."""
    out = []
    for name, value in upstream:
        low = name.lower()
        if low in _HOP or low.startswith(_RATE_PREFIXES):
            continue
        out.append((name, value))
    return out


#: Client request headers that never go upstream: ours (the token), the connection's, the ones the
#: transport sets itself (the key header, user agent, length) and the gateway's own controls.
_NOT_FORWARDED = _HOP | frozenset(
    {"host", "authorization", "x-api-key", "cookie", "user-agent", "accept-encoding", "idempotency-key"}
)


def forwarded_headers(
    headers: Iterable[tuple[str, str]], credentials: Iterable[str]
) -> tuple[tuple[str, str], ...]:
    """The client's request headers that go upstream (an API's version or beta headers, the
    body's type); never `credentials` (the headers that may carry the gateway token)."""
    skip = _NOT_FORWARDED | {name.lower() for name in credentials}
    return tuple(
        (name, value)
        for name, value in headers
        if name.lower() not in skip and not name.lower().startswith("ratedeck-")
    )
