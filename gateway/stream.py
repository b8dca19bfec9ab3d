"""A streamed answer on its way to the client: the gateway's `AnswerSink`.

The transport calls `begin` once with the upstream's status and headers, then `write`
for each piece (one whole SSE event each, for an event stream). Each goes straight to
an aiohttp `StreamResponse`; either returns False once the client is gone, and the
transport then closes the upstream.

Where the target's streams carry usage only when asked (`target.stream_usage`, as
OpenAI's do), a client that asks `stream: true` without `stream_options.include_usage`
gets it added (`with_usage`) so the token budget settles on the real count; the
usage-only event that this adds at the end is dropped before the client sees it
(`UsageEventFilter`), so the client sees the stream it asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from ratedeck.engine.http.answer_headers import answer_headers


def with_usage(body: Any) -> Any | None:
    """An OpenAI chat body that streams without usage, with `stream_options.include_usage` added;
    None when nothing is to be added (not streamed, or usage already asked, either way)."""
    if not isinstance(body, dict) or body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return None  # the API will answer what it makes of that; not ours to mend
    if options is not None and "include_usage" in options:
        return None
    return {**body, "stream_options": {**(options or {}), "include_usage": True}}


def usage_only(event: bytes) -> bool:
    """Whether an SSE event is OpenAI's usage-only chunk (`choices` empty, `usage` set)."""
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data.startswith(b"{"):
            return False
        try:
            doc = json.loads(data)
        except ValueError:
            return False
        return isinstance(doc, dict) and doc.get("choices") == [] and doc.get("usage") is not None
    return False


class ClientStream:
    """`ports.AnswerSink` over the client's aiohttp request (see the module doc)."""

    def __init__(self, request: web.Request, mask: Callable[[str], str], *, drop_usage: bool = False):
        self.request = request
        self.mask = mask
        self.drop_usage = drop_usage  # we asked for the usage event: the client did not
        self.response: web.StreamResponse | None = None
        self.gone = False

    @property
    def started(self) -> bool:
        return self.response is not None

    async def begin(self, status: int, headers: Sequence[tuple[str, str]]) -> bool:
        if self.gone or self.request.transport is None or self.request.transport.is_closing():
            self.gone = True
            return False
        response = web.StreamResponse(status=status)
        for name, value in answer_headers(headers, self.mask):
            response.headers.add(name, value)
        try:
            await response.prepare(self.request)
        except (ConnectionError, RuntimeError):
            self.gone = True
            return False
        self.response = response
        return True

    async def write(self, chunk: bytes) -> bool:
        response = self.response
        if self.gone or response is None:
            return False
        if self.drop_usage and usage_only(chunk):
            return True
        try:
            await response.write(chunk)
        except (ConnectionError, RuntimeError):
            self.gone = True
            return False
        return True

    async def end(self) -> web.StreamResponse | None:
        """Finish the streamed answer (None if it never began)."""
        response = self.response
        if response is not None and not self.gone:
            try:
                await response.write_eof()
            except (ConnectionError, RuntimeError):
                self.gone = True
        return response
