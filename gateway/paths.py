"""Where a client's request goes upstream: the target's base and a normalised path, nothing else.

The client's Host header and any absolute URL in its request line are ignored; a path
that climbs (`..`), carries a scheme or authority, or escapes with encoded separators
is refused, so no request reaches any host but the target.
"""

from __future__ import annotations

from urllib.parse import unquote

from yarl import URL


class PathRefused(ValueError):
    """A path the gateway will not send (the text says why, one line)."""


def target_base(url: str) -> str:
    """The path the target URL starts with, without a trailing slash ("" for the root)."""
    return URL(url).path.rstrip("/")


def upstream_path(raw_path: str, raw_query: str, base: str) -> str:
    """`base` + the client's path, checked, with its query string as sent."""
    if not raw_path.startswith("/") or raw_path.startswith("//"):
        raise PathRefused("the path must start with a single /")
    if any(c in raw_path for c in "\\\r\n\t ") or "\x00" in raw_path:
        raise PathRefused("the path holds characters no API path holds")
    decoded = unquote(raw_path)
    if any(c in decoded for c in "\\\x00\r\n"):
        raise PathRefused("the path holds encoded control characters or backslashes")
    for segment in decoded.split("/"):
        if segment in (".", ".."):
            raise PathRefused("the path climbs out of the API ('.' or '..')")
    if "%2f" in raw_path.lower():
        raise PathRefused("the path holds an encoded '/'")
    if "://" in decoded:
        raise PathRefused("the path holds a URL")
    if any(c in raw_query for c in "\r\n #"):
        raise PathRefused("the query string holds characters a URL cannot")
    path = base + raw_path
    return f"{path}?{raw_query}" if raw_query else path
