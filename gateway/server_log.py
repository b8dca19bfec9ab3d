"""What the gateway's HTTP server logs: one line per bad request (repeats summed up), a stack
only for a fault of ratedeck's own code, and the access log when asked.

aiohttp answers a malformed request head (a header too long, too many headers,
Content-Length with Transfer-Encoding, a CR in a header, a NUL in the path, a TLS hello on
plain HTTP, ...) with a 400 by itself, and logs it as "Error handling request" with the
parser's exception, whose stack says nothing but "a client sent garbage". Its request
handler takes a `logger` (documented among the web protocol's keyword arguments, which
`AppRunner(**kwargs)` passes on; default `aiohttp.log.server_logger`): the gateway gives it
a `ServerLog`, which sorts what aiohttp logs by the exception it carries:

- a client's fault (`HttpProcessingError`, `RequestPayloadError`): one line, "bad request
  from ADDRESS: STATUS why", through `BadRequests`, which says the first of a kind at once
  and sums up the rest of an interval in one line ("N more like it");
- anything else (an exception out of the gateway's handler: a 500): logged with its stack,
  as it is a fault of ratedeck's own code.

A logger of our own for this one server, rather than a filter on the global
`aiohttp.server` logger: nothing global changes, two gateways in one process keep their
counts apart, and the sorting needs the exception, not the formatted record.

The access log is aiohttp's documented hook too (`access_log_class`, an
`AbstractAccessLogger`), off unless asked: one line per answered request, as text or JSON,
with no query string, and with every form of every key and of the gateway token masked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

#: The gateway's own log: bad requests (warnings) and faults of its own code (errors, with a stack).
LOGGER = logging.getLogger("ratedeck.gateway")
#: The access log, one line per answered request (`--access-log`).
ACCESS_LOGGER = logging.getLogger("ratedeck.gateway.access")
#: The access log's forms (`gateway.access_log`).
ACCESS_LOG_FORMS = ("off", "text", "json")
#: A kind of bad request is said at most once per this many seconds; the rest are summed up.
SUMMARY_S = 60.0
#: Kinds kept apart at most; beyond, a status's new kinds share one ("other").
MAX_KINDS = 64
_WHY_CHARS = 100
_STATUS_LINE = re.compile(r"^\d{3}, message:$")
#: Where aiohttp starts quoting the client's bytes (" b'...", ": '...'"), not an apostrophe ("can't").
_QUOTED = re.compile(r"(?::\s*|\s+)(?:b?['\"]|bytearray\()")


def client_fault(exc: BaseException | None) -> bool:
    """Whether `exc` says a client sent something malformed (a head, a body), not that the
    gateway failed."""
    return isinstance(exc, HttpProcessingError | web.RequestPayloadError)


def status_of(exc: BaseException) -> int:
    """The 4xx a client's fault is answered with (aiohttp answers a bad head 400)."""
    code = getattr(exc, "code", 400)
    return code if isinstance(code, int) and 400 <= code < 500 else 400


def why_of(exc: BaseException) -> str:
    """What was wrong, one short line with none of the client's bytes: "Duplicate
    Content-Length", "Got more than 8190 bytes when reading"."""
    text = str(getattr(exc, "message", "") or exc)
    lines = [s.strip() for s in text.splitlines()]
    lines = [s for s in lines if s and not _STATUS_LINE.match(s)]
    first = _QUOTED.split(lines[0], maxsplit=1)[0] if lines else ""
    first = "".join(c if c.isprintable() else "?" for c in first).rstrip(" :.")[:_WHY_CHARS]
    return first or type(exc).__name__


@dataclass(slots=True)
class _Kind:
    until: float  # the end of this kind's interval
    more: int = 0  # seen since it was said, not said
    last: str = "?"  # the last one's client address
    timer: Any = None


class BadRequests:
    """Bad requests, said without flooding: the first of a kind (status and why) at once, one
    line per kind at the end of each interval that saw more ("N more like it"), none once an
    interval passes quiet (the next one is said at once again). `flush` sums up what is
    pending now (the gateway's stop).

    `say` takes each line; `clock` and `call_at(when, callback)` default to the running
    loop's (tests pass their own)."""

    def __init__(
        self,
        say: Callable[[str], None],
        interval_s: float = SUMMARY_S,
        *,
        clock: Callable[[], float] | None = None,
        call_at: Callable[[float, Callable[[], None]], Any] | None = None,
    ):
        if clock is None or call_at is None:
            import asyncio

            loop = asyncio.get_running_loop()
            clock, call_at = clock or loop.time, call_at or loop.call_at
        self.say = say
        self.interval_s = interval_s
        self._clock = clock
        self._call_at = call_at
        self._kinds: dict[tuple[int, str], _Kind] = {}
        self.count = 0  # every bad request noted

    def note(self, remote: str | None, status: int, why: str) -> None:
        """A client at `remote` was answered `status` because of `why` (one short line)."""
        self.count += 1
        where = remote or "?"
        key = (status, why)
        if key not in self._kinds and len(self._kinds) >= MAX_KINDS:
            key = (status, "other")
        kind = self._kinds.get(key)
        if kind is not None:
            kind.more += 1
            kind.last = where
            return
        kind = self._kinds[key] = _Kind(until=self._clock() + self.interval_s, last=where)
        kind.timer = self._call_at(kind.until, lambda: self._interval_ended(key))
        self.say(f"bad request from {where}: {key[0]} {key[1]}")

    def _interval_ended(self, key: tuple[int, str]) -> None:
        kind = self._kinds.get(key)
        if kind is None:
            return
        if not kind.more:
            del self._kinds[key]  # a quiet interval: the next one is said at once
            return
        self._summary(key, kind, f" in {self.interval_s:g} s")
        kind.more = 0
        kind.until += self.interval_s
        kind.timer = self._call_at(kind.until, lambda: self._interval_ended(key))

    def _summary(self, key: tuple[int, str], kind: _Kind, during: str = "") -> None:
        status, why = key
        self.say(
            f"bad requests: {kind.more:,} more like it ({status} {why}){during}, the last from {kind.last}"
        )

    def flush(self) -> None:
        """Say what is counted and not said yet, and forget every kind (no timer left)."""
        for key, kind in list(self._kinds.items()):
            if kind.timer is not None:
                kind.timer.cancel()
            if kind.more:
                self._summary(key, kind)
        self._kinds.clear()


class ServerLog(logging.LoggerAdapter):
    """The `logger` aiohttp's request handler gets (see the module doc): a client's fault
    becomes a `BadRequests` line, anything else goes to `LOGGER` as logged, stack and all."""

    def __init__(self, bad: BadRequests, logger: logging.Logger = LOGGER):
        super().__init__(logger, {})
        self.bad = bad

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc_info is True or isinstance(exc_info, tuple):
            exc = sys.exc_info()[1] if exc_info is True else exc_info[1]
        if client_fault(exc):
            assert exc is not None
            if str(msg).startswith("Error handling request"):  # aiohttp answers it (400) and says so
                remote = args[0] if args and isinstance(args[0], str) else None
                self.bad.note(remote, status_of(exc), why_of(exc))
            # Anything else aiohttp says of a client's fault comes after its request was
            # answered (reading what is left of a bad body): the connection closes, nothing to add.
            return
        if self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *args, **kwargs)


class AccessLog(AbstractAccessLogger):
    """One line per answered request (aiohttp's `access_log_class`): its `log_format` is the
    form, "text" or "json"; `redact` masks every key and the gateway token (`bound`)."""

    redact: Callable[[str], str] = staticmethod(lambda text: text)

    @classmethod
    def bound(cls, redact: Callable[[str], str]) -> type[AccessLog]:
        """This class with its masking set (aiohttp makes one per connection from the class)."""
        return type("BoundAccessLog", (cls,), {"redact": staticmethod(redact)})

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        fields = access_fields(request, response, time, type(self).redact)
        self.logger.info(access_line(fields, self.log_format))


def access_fields(
    request: web.BaseRequest, response: web.StreamResponse, time: float, redact: Callable[[str], str]
) -> dict[str, Any]:
    """What an access line holds: when, who, what (the path, never its query), the answer."""
    try:
        path = request.rel_url.raw_path
    except Exception:  # a head aiohttp could not parse has no path to speak of
        path = ""
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "remote": request.remote or "?",
        "method": request.method or "-",
        "path": redact(path) or "-",
        "status": response.status,
        "bytes": response.body_length,
        "ms": round(time * 1000.0, 1),
    }


def access_line(fields: dict[str, Any], form: str) -> str:
    """The line in its form: JSON, or text ("TIME ADDRESS METHOD PATH STATUS N B T ms")."""
    if form == "json":
        return json.dumps(fields, separators=(",", ":"))
    f = fields
    return f"{f['time']} {f['remote']} {f['method']} {f['path']} {f['status']} {f['bytes']} B {f['ms']:g} ms"


@contextlib.contextmanager
def logging_to(stream: TextIO, access_log: str = "off") -> Iterator[None]:
    """While inside: the gateway's lines on `stream` (bad requests, faults with their stack,
    the access log when `access_log` is not "off"), each as it is, nowhere else."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    before = (LOGGER.level, LOGGER.propagate, ACCESS_LOGGER.level)
    LOGGER.addHandler(handler)
    LOGGER.propagate = False
    LOGGER.setLevel(logging.WARNING)
    ACCESS_LOGGER.setLevel(logging.INFO if access_log != "off" else logging.WARNING)
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(before[0])
        LOGGER.propagate = before[1]
        ACCESS_LOGGER.setLevel(before[2])
