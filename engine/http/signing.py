"""Signing a request at send time, after the limiter granted its slot.

Exchanges sign each private request with a secret that goes with the key, over
a nonce or timestamp that must increase: so the signature is made in the
transport, when the request leaves, never earlier. Recipes:

- `binance`: HMAC-SHA256 (hex) with the secret over the total parameters
  (query string, or form body), after a `timestamp` (ms) is added; the key
  travels in `X-MBX-APIKEY` (the preset's key header). Binance Spot API,
  "SIGNED (TRADE and USER_DATA) Endpoint security".
- `kraken`: `API-Sign` = base64(HMAC-SHA512(base64-decoded secret, URI path +
  SHA256(nonce + POST data))), `API-Key` = the key; the nonce (strictly
  increasing per key) goes in the form body. Kraken REST API, "Authentication".
- a hook, `module:function`: called as `function(SignInput) -> dict[str, str]`
  of headers to add; it may also add to `SignInput.params` (kept in order,
  sent exactly as encoded then).

Signing never raises into the engine: a hook that fails makes the attempt a
client error naming the hook and the exception type, with no secret in it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote_plus

from ratedeck.core.hooks import load_callable


@dataclass(slots=True)
class SignInput:
    """What a signing hook sees: the request as it will leave, and the key's secret."""

    method: str
    path: str  # the URL's path, as sent
    params: list[tuple[str, str]]  # query (GET) or form (POST) fields, in order; a hook may append
    key: str
    secret: str
    nonce: int | None
    now_ms: int = field(default_factory=lambda: int(time.time() * 1000))


Signer = Callable[[SignInput], dict[str, str]]


def encode(params: list[tuple[str, str]]) -> str:
    """Form/query encoding exactly as signed and sent (spaces as +, like urlencode)."""
    return "&".join(f"{quote_plus(k)}={quote_plus(v)}" for k, v in params)


def sign_binance(s: SignInput) -> dict[str, str]:
    if not any(k == "timestamp" for k, _ in s.params):
        s.params.append(("timestamp", str(s.now_ms)))
    digest = hmac.new(s.secret.encode(), encode(s.params).encode(), hashlib.sha256).hexdigest()
    s.params.append(("signature", digest))
    return {"X-MBX-APIKEY": s.key}


def sign_kraken(s: SignInput) -> dict[str, str]:
    nonce = next((v for k, v in s.params if k == "nonce"), None)
    if nonce is None:
        nonce = str(s.nonce if s.nonce is not None else s.now_ms)
        s.params.insert(0, ("nonce", nonce))
    postdata = encode(s.params)
    inner = hashlib.sha256((nonce + postdata).encode()).digest()
    try:
        secret = base64.b64decode(s.secret, validate=True)
    except ValueError:
        raise SigningError("the Kraken secret is not base64") from None
    mac = hmac.new(secret, s.path.encode() + inner, hashlib.sha512)
    return {"API-Key": s.key, "API-Sign": base64.b64encode(mac.digest()).decode()}


class SigningError(Exception):
    """A request could not be signed; the message names no secret."""


def signer_for(name: str) -> Signer:
    """The recipe for "binance", "kraken", or a hook "module:function" (imported now)."""
    if name == "binance":
        return sign_binance
    if name == "kraken":
        return sign_kraken
    try:
        return load_callable(name, "signing hook")
    except ValueError as exc:
        raise SigningError(str(exc)) from None
