"""Secrets never shown: masking a key, scrubbing any text that may echo one.

Every place that prints, logs or stores text that came near a key (error
bodies, URLs, graveyard lines, events, reports, repr) goes through `redact`,
which finds a secret in the forms a server or proxy may echo it in, and
masks it before anything is cut short, so no prefix survives a cut.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

MASK = "…****"


def mask_secret(secret: str) -> str:
    """Hide all but the last four characters ("…JYA6"); short secrets fully."""
    if len(secret) <= 8:
        return MASK
    return "…" + secret[-4:]


def fingerprint(secret: str) -> str:
    """Six hex digits of SHA-256 of the secret ("3f9a1c"), to tell keys apart and find one in a
    list (`printf %s KEY | sha256sum`); "" for a short secret (8 characters or fewer), whose
    few possible values a fingerprint would let anyone try."""
    if len(secret) <= 8:
        return ""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:6]


def _b64_cores(raw: bytes) -> set[str]:
    """The base64 characters that depend on `raw` alone, at each of the three byte alignments.

    A secret inside a longer encoded value ("user:secret" in Basic auth) is not
    encoded on its own: depending on where it starts, its bytes land at one of
    three offsets. At each, the characters fully inside the secret's bits are
    the same whatever surrounds it; masking them leaves at most a few bits.
    """
    cores = set()
    n = len(raw)
    for k in range(3):
        start = -(-8 * k // 6)  # ceil: the first character with no bits of the k filler bytes
        end = 8 * (k + n) // 6  # floor: the last character whose bits are all the secret's
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            core = encode(b"\0" * k + raw).decode()[start:end]
            if core:
                cores.add(core)
    return cores


_ESCAPE = re.compile(r"%[0-9A-F]{2}")


def secret_forms(secret: str) -> set[str]:
    """The forms a secret can travel in: raw, URL- and form-encoded, base64 (alone or inside Basic auth)."""
    if not secret:
        return set()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    raw = secret.encode("utf-8", "surrogatepass")
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(raw).decode()
        forms.add(text)
        forms.add(text.rstrip("="))
    forms |= _b64_cores(raw)
    # Lower-case percent escapes are equally valid (%2f for /); only the escapes change case.
    forms |= {_ESCAPE.sub(lambda m: m.group().lower(), f) for f in list(forms) if "%" in f}
    return {f for f in forms if len(f) >= 4}


class Redactor:
    """`redact` for a set of secrets, their forms computed once (and again only when one is added).

    Deriving every form of every secret costs about 1 ms for 50 keys; error
    answers are masked on the hot path, so long-lived code keeps a Redactor.
    """

    __slots__ = ("_secrets", "_forms", "longest")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._forms: list[str] | None = None
        self.longest = 0  # the longest form of any secret, for cutting text safely
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str) -> None:
        if secret and secret not in self._secrets:
            self._secrets.add(secret)
            self._forms = None
            self.longest = max(self.longest, len(secret), *(len(f) for f in secret_forms(secret)))

    def __call__(self, text: str, limit: int | None = None) -> str:
        """`text` with every form of every secret masked, then cut to `limit` characters."""
        if self._forms is None:
            forms: set[str] = set()
            for secret in self._secrets:
                forms |= secret_forms(secret)
            self._forms = sorted(forms, key=len, reverse=True)  # longest first: a form may contain another
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        if limit is not None and len(text) > limit:
            text = text[:limit] + "…"
        return text


def redact(text: str, secrets: Iterable[str], limit: int | None = None) -> str:
    """`text` with every form of every secret masked, then cut to `limit` characters."""
    return Redactor(secrets)(text, limit)


def safe_url(url: str | None) -> str:
    """A URL fit to print: no user:password@, no query string (keys often travel there)."""
    if not url:
        return ""
    try:
        parts = urlsplit(str(url))
        if "," in parts.netloc or parts.scheme.endswith("+cluster"):  # redis+cluster://h:p,h:p: as written,
            # without user:password@ (several hosts: no single host and port to parse)
            return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
        hostname = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    host = f"[{hostname}]" if ":" in hostname else hostname
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def masked_password(url: str | None) -> str:
    """A URL with its password hidden (`user:***@host`) and the rest as written: for a
    target or proxy URL shown back to its owner, where the path and query matter."""
    if not url:
        return ""
    try:
        parts = urlsplit(str(url))
        password = parts.password
    except ValueError:
        return "<unparseable URL>"
    if password is None:
        return str(url)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
