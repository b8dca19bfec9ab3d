"""Closed vocabularies, one definition each.

`StrEnum` members equal their string values, so a report, a TOML file or a
test may still say "succeeded" or "shared" and mean the member.
"""

from __future__ import annotations

from enum import StrEnum


class Ending(StrEnum):
    """The one place a request ends."""

    SUCCEEDED = "succeeded"
    EXPIRED = "expired"  # its time-to-live passed before it could succeed
    GRAVEYARD = "graveyard"  # used up its attempts, or an error retrying cannot fix
    SHED = "shed"  # refused or cancelled before it was sent
    # a write that may or may not have happened (a 5xx or a timeout after sending, on a request
    # with an Idempotency-Key or a non-idempotent method): reported, never sent on another key
    UNCERTAIN = "uncertain"


class OutcomeKind(StrEnum):
    """What one attempt's answer means; the settle decision goes by this alone."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"  # too fast: retry behind the gate, widen headroom
    BANNED = "banned"  # refused for a while for not slowing down (Binance's 418): the host waits
    BLOCKED = "blocked"  # the key is refused for good (401/403, the study's "blocked")
    NONCE = "nonce"  # out-of-order nonce: the server wasted our slot; retry
    CLIENT_ERROR = "client_error"  # other 4xx: retrying will not help
    SERVER_ERROR = "server_error"  # 5xx (503 may carry Retry-After)
    TIMEOUT = "timeout"
    CONNECTION = "connection"


class Phase(StrEnum):
    """Where a run is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class KeyState(StrEnum):
    """What a key can do now."""

    ACTIVE = "active"
    PAUSED = "paused"  # by the operator
    COOLING = "cooling"  # a cooldown gate it sends through is closed
    BLOCKED = "blocked"  # the server refused the key for good


class EventKind(StrEnum):
    """The kinds of line in the event log."""

    INFO = "info"
    SETTING = "setting"
    PAUSE = "pause"
    COOLDOWN = "cooldown"
    GRAVEYARD = "graveyard"
    ERROR = "error"


class Pacing(StrEnum):
    """How a key's limiter spends its window."""

    EVEN = "even"  # spread sends evenly across the window
    BURST = "burst"  # send as soon as the window has room
    AUTO = "auto"  # burst for a job fed as fast as the limits allow, else even (engine/engine.py)


class ApiStyle(StrEnum):
    """How a request's path reaches an API (`target.api_style`, engine/http/endpoints.py)."""

    PLAIN = "plain"  # the path as the line or the client gave it
    AZURE = "azure"  # OpenAI's /v1/... as Azure OpenAI's /openai/v1/... or deployments path


class Priority(StrEnum):
    """A gateway client's priority (`[[gateway.clients]] priority`): a waiting request of a
    higher one goes first when capacity frees (engine/flows.py)."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 first: interactive 0, standard 1, batch 2."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.INTERACTIVE: 0, Priority.STANDARD: 1, Priority.BATCH: 2}


class HttpClient(StrEnum):
    """The HTTP client a run's requests go through (engine/http)."""

    REQWEST = "reqwest"  # pyreqwest: Rust's reqwest and hyper, a third of aiohttp's CPU per request
    AIOHTTP = "aiohttp"  # aiohttp's client, tuned


class HeadroomMode(StrEnum):
    """Where the headroom comes from when it is not a fixed number of milliseconds."""

    ADAPTIVE = "adaptive"  # learned from the answers (engine/limits/headroom.py)


class Arrival(StrEnum):
    """How generated requests are spaced."""

    CONSTANT = "constant"
    POISSON = "poisson"


class AccessLogForm(StrEnum):
    """The gateway's access log: none, a text line or a JSON line per answered request."""

    OFF = "off"
    TEXT = "text"
    JSON = "json"


class MessagePattern(StrEnum):
    """How a message's calls are made."""

    PARALLEL = "parallel"  # all at once
    SEQUENTIAL = "sequential"  # each after the previous one succeeded


class Excess(StrEnum):
    """What the entry throttle does with messages it cannot admit now."""

    QUEUE = "queue"
    SHED = "shed"
    SAMPLE = "sample"


class PolicyKind(StrEnum):
    """How a server counts a limit N per W."""

    SLIDING = "sliding"  # at most N in any window of W (the default)
    FIXED = "fixed"  # at most N per window of W, windows aligned to the clock or to the server's reset
    BUCKET = "bucket"  # a leaky bucket (GCRA): a counter of at most N that drains N/W per second
