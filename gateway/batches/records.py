"""What the gateway's Batch APIs keep: uploaded files, batches and each line's output record.

One `Batch` serves both APIs (`api`: "openai" for `/v1/batches`, "anthropic" for
`/v1/messages/batches`); each API's own shape of it is made where that API is served
(openai_api.py, anthropic_api.py). Times are wall-clock Unix seconds, as the APIs give them.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

#: A batch's statuses, OpenAI's names (Anthropic's `processing_status` is made from them).
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, CANCELLING, CANCELLED = "failed", "cancelling", "cancelled"
#: Statuses a batch never leaves.
FINAL = (COMPLETED, FAILED, CANCELLED)
#: Statuses whose work a started gateway takes up again.
UNFINISHED = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)

#: What the batch object says of where its answers come from (the docs say it too).
HONEST = (
    "answered by ratedeck at the keys' own rate limits and prices, in minutes: not the Batch API's "
    "24-hour window, nor its discount"
)


def new_id(prefix: str) -> str:
    """An id like the APIs' own (`file-...`, `batch_...`, `msgbatch_...`)."""
    return prefix + secrets.token_hex(12)


@dataclass
class StoredFile:
    """An uploaded file (OpenAI's `/v1/files`), or one the gateway wrote (a batch's output)."""

    id: str
    filename: str
    purpose: str
    created_at: int
    content: bytes = field(repr=False)
    client: str = ""  # the client that uploaded it (or whose batch wrote it)

    @property
    def bytes(self) -> int:
        return len(self.content)

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass
class Batch:
    """One batch: its API, status, input, counts, output files and the times it moved."""

    id: str
    api: str  # "openai" or "anthropic"
    status: str
    input_file_id: str
    endpoint: str = "/v1/chat/completions"
    completion_window: str = "24h"
    metadata: dict[str, Any] | None = None
    client: str = ""  # the gateway client that made it (its priority and quotas hold)
    created_at: int = 0
    times: dict[str, int] = field(default_factory=dict)  # status name -> when it got there
    total: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)  # why a batch failed (a line each)
    output_file_id: str | None = None
    error_file_id: str | None = None

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Batch:
        return cls(**doc)


@dataclass(frozen=True)
class Counts:
    """A batch's lines by how they ended (`failed`: an answer not 2xx, or none)."""

    done: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def succeeded(self) -> int:
        return self.done - self.failed - self.cancelled - self.expired
