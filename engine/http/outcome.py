"""What came back from one attempt, and what kind of answer it is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratedeck.core.vocab import OutcomeKind

if TYPE_CHECKING:
    from .delays import Quota

# Short names for the kinds, as transports and tests use them.
OK = OutcomeKind.OK
RATE_LIMITED = OutcomeKind.RATE_LIMITED
BANNED = OutcomeKind.BANNED
BLOCKED = OutcomeKind.BLOCKED
NONCE = OutcomeKind.NONCE
CLIENT_ERROR = OutcomeKind.CLIENT_ERROR
SERVER_ERROR = OutcomeKind.SERVER_ERROR
TIMEOUT = OutcomeKind.TIMEOUT
CONNECTION = OutcomeKind.CONNECTION


class _Unread:
    """`UNREAD`'s type: one value, the same after a copy or a pickle."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "UNREAD"

    def __repr__(self) -> str:
        return "UNREAD"


#: `Outcome.doc` before the body was parsed (None: parsed, and not JSON).
UNREAD: Any = _Unread()


class Outcome:
    """One attempt's result. `status` is None when no HTTP answer arrived."""

    __slots__ = (
        "kind",
        "status",
        "retry_after_s",
        "latency_s",
        "error",
        "policy_header",
        "response",
        "server_time_s",
        "remaining",
        "quotas",
        "key",
        "request_id",
        "write",
        "keyed",
        "maybe_sent",
        "replayed",
        "headers",
        "body",
        "streamed",
        "head_s",
        "doc",
    )

    def __init__(
        self,
        kind: OutcomeKind,
        status: int | None = None,
        retry_after_s: float | None = None,
        latency_s: float = 0.0,
        error: str | None = None,
        policy_header: str | None = None,
        response: Any = None,
        server_time_s: float | None = None,
        remaining: int | None = None,
    ):
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s  # the delay the server asked for, from any source
        self.latency_s = latency_s
        self.error = error  # a short, already redacted description
        self.policy_header = policy_header  # RateLimit-Policy as sent, when present
        self.response = response  # what a library caller gets back (transport-specific)
        # Hints, as sent and unjudged: server time (seconds) and the server's remaining count.
        self.server_time_s = server_time_s
        self.remaining = remaining
        self.quotas: tuple[Quota, ...] = ()  # the server's own counts (delays.read_quotas)
        self.key: str | None = None  # the label of the key that sent it (set by the engine)
        # Set by the HTTP transport (settle.decide reads them for the uncertain ending):
        self.request_id: str | None = None  # the server's id of this request (Request-Id, X-Request-Id)
        self.write = False  # sent with a method that is not idempotent (POST, PATCH)
        self.keyed = False  # carried an Idempotency-Key
        self.maybe_sent = True  # False when it surely never left (the connection was refused)
        self.replayed = False  # the server says it replayed a saved answer (Idempotent-Replayed)
        # The raw answer, kept only for a request with a live client (`Request.answer`), so the
        # gateway can pass a non-streamed answer on as it came: the headers as received (filter
        # them with `answer_headers.answer_headers` before showing them) and the body's bytes
        # (None once streamed: those bytes went to the client as they arrived).
        self.headers: tuple[tuple[str, str], ...] | None = None
        self.body: bytes | None = None
        # The answer began at the live client (its status and headers went to `AnswerSink.begin`):
        # the client holds part of an answer, so the attempt is never sent again (settle.decide).
        self.streamed = False
        # A streamed answer's exchange until its head came: its round trip (`latency_s` runs to
        # the stream's end, which says nothing of when the request reached the server).
        self.head_s: float | None = None
        # The answer's JSON body, parsed once on the first ask (engine/llm/usage.py's `answer_doc`).
        self.doc: Any = UNREAD

    def __repr__(self) -> str:
        return f"Outcome({self.kind}, {self.status}, retry_after={self.retry_after_s})"


def classify(status: int, body: str, uses_nonce: bool = False) -> OutcomeKind:
    """Map an HTTP status and body to an outcome kind.

    The body matters for the study's server: its permanent block is a 429 that
    says "blocked", and a nonce rejection is a plain 400 that says "nonce".
    A 400 is read as a nonce rejection (and retried) only when the target
    uses a nonce; elsewhere the word in a body means nothing.
    """
    if 200 <= status < 300:
        return OK
    if status == 429:
        return BLOCKED if "blocked" in body else RATE_LIMITED
    if status in (401, 403):
        return BLOCKED
    if uses_nonce and status == 400 and "nonce" in body:
        return NONCE
    if 400 <= status < 500:
        return CLIENT_ERROR
    return SERVER_ERROR
