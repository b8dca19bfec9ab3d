"""What the transport needs of an HTTP client: the `Wire` protocol.

The transport (`transport.py`) has one exchange for every client: it opens a
request on the wire, awaits its answer's head, follows a same-origin redirect
or passes a stream on, reads the body up to a cap, and ends the answer. Each
client does those steps its own way, behind this protocol: pyreqwest's
(`reqwest_client.ReqwestWire`, the default) hands its own request and answer
back untouched, its awaitables straight to the loop, so an attempt costs no
wrapper object and no coroutine of ours unless a body is read up to its cap;
aiohttp's (`client.AioWire`) is its tuned `ClientSession`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from yarl import URL


class Answer(Protocol):
    """A client's own answer, once its status line and headers are in."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Any: ...  # case-insensitive `get`, and `items`


class Opening(Protocol):
    """One request, put on the wire when its `__aenter__` is awaited, which gives its `Answer`."""

    def __aenter__(self) -> Awaitable[Any]: ...


class Wire(Protocol):
    """One client for a run's attempts (see the module doc)."""

    @property
    def proxy(self) -> URL | None: ...

    @property
    def retried(self) -> int:
        """Sends the client repeated by itself on a new connection (a kept-alive one found closed)."""
        ...

    def open(self, method: str, url: Any, data: Any, headers: Any, live: bool = False) -> Opening:
        """The request; with `live` (a client waits for the answer as it arrives) its head comes
        back as soon as it is in."""
        ...

    def read(self, resp: Any, cap: int, stop: bool = False) -> Awaitable[Any]:
        """The body (bytes-like), decompressed, up to `cap` bytes. Past it: `client.BodyTooLarge`,
        or with `stop` the first `cap` bytes."""
        ...

    def end(self, opening: Any, resp: Any) -> Awaitable[None]:
        """Done with an answer: a body read to its end leaves the connection for the next request,
        one not read drops it. Called once per answer."""
        ...

    def length(self, resp: Any) -> int | None:
        """The answer's Content-Length, if it says one."""
        ...

    def pieces(self, resp: Any) -> AsyncIterator[bytes]:
        """The body as it arrives, a piece at a time."""
        ...

    async def close(self) -> None: ...
