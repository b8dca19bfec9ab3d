"""Which of a client's request headers go upstream (the answer's way back: `engine.http.answer_headers`).

What belongs to the gateway does not pass: its token, the client's connection (the
hop-by-hop headers of `engine.http.answer_headers.HOP_BY_HOP`), what the transport sets
itself (the key header, user agent, length) and the gateway's own controls.
"""

from __future__ import annotations

from collections.abc import Iterable

from ratedeck.engine.http.answer_headers import FRAMING, HOP_BY_HOP

#: Client request headers that never go upstream: ours (the token), the connection's, the ones the
#: transport sets itself (the key header, user agent, length) and the gateway's own controls.
_NOT_FORWARDED = (
    HOP_BY_HOP
    | FRAMING
    | frozenset(
        {
            "host",
            "authorization",
            "x-api-key",
            "cookie",
            "user-agent",
            "accept-encoding",
            "idempotency-key",
            "date",
            "server",
            "set-cookie",
            "retry-after",
        }
    )
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
