"""Which of an upstream answer's headers may go on to a live client (the gateway's).

The client talks to the gateway, not to the API: what describes the gateway's own
connection to the API (hop-by-hop headers, the framing of a body aiohttp already
decoded, cookies for that connection) means nothing on the client's connection, and
what names the account behind a key (organisation, project) or echoes a key's secret
must not leave the gateway, which holds the keys so that clients never see them.
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
        "transfer-encoding",
        "upgrade",
    }
)
#: Headers that name the account a key belongs to.
ACCOUNT = frozenset({"openai-organization", "openai-project", "anthropic-organization-id"})
#: The upstream's cookies are for the gateway's connection to it, not for its clients.
COOKIES = frozenset({"set-cookie", "set-cookie2"})


def answer_headers(
    headers: Iterable[tuple[str, str]],
    mask: Callable[[str], str],
    *,
    streamed: bool = False,
    decoded: bool = True,
) -> tuple[tuple[str, str], ...]:
    """`headers` as a live client may see them, in their order.

    Dropped: hop-by-hop headers and any the `Connection` header names; the account
    headers (`ACCOUNT`); cookies; every header whose value holds a key's secret in any
    form (`mask` is the transport's `Redactor`: a value it changes holds one);
    `content-length` of a streamed answer (the client's framing is the gateway's);
    `content-encoding` and `content-length` when the body was decoded (`decoded`:
    aiohttp decompresses, so the bytes passed on are no longer the encoded ones).
    """
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    encoded = any(name.lower() == "content-encoding" for name, _ in pairs)
    out = []
    for name, value in pairs:
        low = name.lower()
        if low in HOP_BY_HOP or low in named or low in ACCOUNT or low in COOKIES:
            continue
        if low == "content-length" and (streamed or (decoded and encoded)):
            continue
        if low == "content-encoding" and decoded:
            continue
        if mask(value) != value:
            continue
        out.append((name, value))
    return tuple(out)
