"""The gateway's tokens: where a client may put one, which client it names (each compared in
constant time), never forwarded."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

#: Headers a client may carry the gateway token in (besides the preset's own key header).
TOKEN_HEADERS = ("authorization", "x-api-key")


class GatewayToken:
    """The secrets clients present, one per client (`[[gateway.clients]]`, or `--gateway-token`
    alone: one client). None or empty: every client is let in as the first client, which the
    service allows on loopback only."""

    def __init__(self, secrets: str | Sequence[str] | None, key_header: str | None = None):
        if isinstance(secrets, str):
            secrets = [secrets]
        self._secrets = tuple(s.encode() for s in secrets or () if s)
        names = [*TOKEN_HEADERS]
        if key_header and key_header.lower() not in names:
            names.append(key_header.lower())
        self.headers = tuple(names)  # every header that may carry it: none of them is forwarded

    @property
    def required(self) -> bool:
        return bool(self._secrets)

    def admits(self, headers: Mapping[str, str]) -> bool:
        """Whether `headers` carry a client's token."""
        return self.client(headers) is not None

    def client(self, headers: Mapping[str, str]) -> int | None:
        """The index of the client whose token `headers` carry (a `Bearer` value or bare, in any of
        the accepted headers); 0 when no token is required; None when none matches.

        Every candidate is compared with every token, each in constant time, with no early exit:
        the time taken says nothing of which token, or how much of one, matched."""
        secrets = self._secrets
        if not secrets:
            return 0
        found = -1
        for name in self.headers:
            value = headers.get(name)
            if value is None:
                continue
            scheme, _, rest = value.partition(" ")
            given = (rest.strip() if scheme.lower() == "bearer" and rest else value.strip()).encode()
            for i, secret in enumerate(secrets):
                if hmac.compare_digest(given, secret) and found < 0:
                    found = i
        return found if found >= 0 else None
