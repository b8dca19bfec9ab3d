"""Which headers pass between a live client (the gateway's) and the API: one filter each way.

The client talks to the gateway, not to the API: what describes the gateway's own
connection to the API (hop-by-hop headers, the framing of a body the gateway frames
again, cookies for that connection, the server's date and name) means nothing on the
client's connection; what names the account behind a key (organisation, project) or
echoes a key's secret must not leave the gateway, which holds the keys so that clients
never see them; and the API's rate-limit headers describe one of the gateway's keys,
not the client's share (a client that paced itself by them would pace wrongly).

`answer_headers` is the one filter of an answer's headers: the transport applies it to
a streamed answer before its sink sees them, the gateway to an answer sent whole.
`HOP_BY_HOP` is the one set of connection headers, which the gateway's filter of a
client's request headers (gateway/headers.py) also drops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: Hop-by-hop headers (RFC 9110 7.6.1, RFC 9112 9.6): they describe one connection only.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
#: A body's framing: the gateway sends the body again (decoded, or streamed) and frames it itself.
FRAMING = frozenset({"content-length", "content-encoding"})
#: What the serving side sets of its own: the gateway's server sets its own.
SERVER_OWN = frozenset({"date", "server"})
#: Headers that name the account a key belongs to.
ACCOUNT = frozenset({"openai-organization", "openai-project", "anthropic-organization-id"})
#: The upstream's cookies are for the gateway's connection to it, not for its clients.
COOKIES = frozenset({"set-cookie", "set-cookie2"})
#: What the API tells of one of our keys' limits: not the client's share.
RATE_LIMITS = frozenset({"retry-after"})
RATE_LIMIT_PREFIXES = ("x-ratelimit", "ratelimit", "x-rate-limit", "anthropic-ratelimit")

_DROPPED = HOP_BY_HOP | FRAMING | SERVER_OWN | ACCOUNT | COOKIES | RATE_LIMITS


def answer_headers(
    headers: Iterable[tuple[str, str]], mask: Callable[[str], str]
) -> tuple[tuple[str, str], ...]:
    """`headers` as a live client may see them, in their order.

    Dropped: hop-by-hop headers and any the `Connection` header names; the body's
    framing (length, encoding) and the server's own (date, server); the account
    headers; cookies; the rate-limit headers and Retry-After; every header whose value
    holds a key's secret in any form (`mask` is the transport's `Redactor`: a value it
    changes holds one).
    """
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return tuple(
        (name, value)
        for name, value in pairs
        if (low := name.lower()) not in _DROPPED
        and low not in named
        and not low.startswith(RATE_LIMIT_PREFIXES)
        and mask(value) == value
    )
