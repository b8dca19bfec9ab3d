"""Secrets never shown: masking a key, scrubbing any text that may echo one.

Every place that prints, logs or stores text that came near a key (error
bodies, URLs, graveyard lines, events, reports, repr) goes through `redact`,
which finds a secret in the forms a server or proxy may echo it in, and
masks it before anything is cut short, so no prefix survives a cut.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

MASK = "…****"


def mask_secret(secret: str) -> str:
    """Hide all but the last four characters ("…JYA6"); short secrets fully."""
    if len(secret) <= 8:
        return MASK
    return "…" + secret[-4:]


def secret_forms(secret: str) -> set[str]:
    """The forms a secret can travel in: raw, URL- and form-encoded, base64 (also in Basic auth)."""
    if not secret:
        return set()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    raw = secret.encode()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(raw).decode()
        forms.add(text)
        forms.add(text.rstrip("="))
    # Lower-case percent escapes are equally valid (%2f for /).
    forms |= {f.lower() for f in list(forms) if "%" in f}
    return {f for f in forms if len(f) >= 4}


def redact(text: str, secrets: Iterable[str], limit: int | None = None) -> str:
    """`text` with every form of every secret masked, then cut to `limit` characters."""
    forms: set[str] = set()
    for secret in secrets:
        forms |= secret_forms(secret)
    for form in sorted(forms, key=len, reverse=True):  # longest first: a form may contain another
        if form in text:
            text = text.replace(form, MASK)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


def safe_url(url: str | None) -> str:
    """A URL fit to print: no user:password@, no query string (keys often travel there)."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if ":" in (parts.hostname or "") and not host.startswith("["):
        host = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
