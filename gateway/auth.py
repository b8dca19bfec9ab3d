"""The gateway's token: where a client may put it, checked in constant time, never forwarded."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

#: Headers a client may carry the gateway token in (besides the preset's own key header).
TOKEN_HEADERS = ("authorization", "x-api-key")


class GatewayToken:
    """The secret clients present. `None` (no token): every client is let in, which the
    service allows on loopback only."""

    def __init__(self, secret: str | None, key_header: str | None = None):
        self._secret = secret.encode() if secret else None
        names = [*TOKEN_HEADERS]
        if key_header and key_header.lower() not in names:
            names.append(key_header.lower())
        self.headers = tuple(names)  # every header that may carry it: none of them is forwarded

    @property
    def required(self) -> bool:
        return self._secret is not None

    def admits(self, headers: Mapping[str, str]) -> bool:
        """Whether `headers` carry the token in any of the accepted headers (a `Bearer` value or bare)."""
        secret = self._secret
        if secret is None:
            return True
        ok = False
        for name in self.headers:
            value = headers.get(name)
            if value is None:
                continue
            scheme, _, rest = value.partition(" ")
            given = rest.strip() if scheme.lower() == "bearer" and rest else value.strip()
            # Every candidate is compared (no early exit), each in constant time.
            ok |= hmac.compare_digest(given.encode(), secret)
        return ok
