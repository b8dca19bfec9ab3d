"""What the two LLM stubs (openai, anthropic) share: a continuously refilled bucket, token estimates.

Both OpenAI and Anthropic describe their per-minute limits as buckets that refill
continuously (a limit of N per minute refills N/60 per second up to N), not as fixed
windows. ``minute_s`` scales the "minute" so tests and benchmarks run fast.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

# a clock near 1.7e9 s has a 2.4e-7 s resolution: at thousands of tokens a second that is ~1e-3
# token of noise, which must not turn "full" into "one short"
EPS = 1e-3


@dataclass
class Bucket:
    """``capacity`` units, refilled at ``capacity / period`` per second, starting full."""

    capacity: float
    period: float
    level: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = self.capacity

    @property
    def rate(self) -> float:
        return self.capacity / self.period if self.period > 0 else math.inf

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are available (0 if they are now)."""
        self.refill(now)
        missing = amount - self.level
        return 0.0 if missing <= EPS else missing / self.rate

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)

    def full_in(self, now: float) -> float:
        """Seconds until the bucket is full again: the documented "reset"."""
        self.refill(now)
        return max(0.0, (self.capacity - self.level) / self.rate)

    def remaining(self, now: float) -> int:
        self.refill(now)
        return max(0, math.floor(self.level + EPS))


def estimate_tokens(text: str) -> int:
    """The stubs' prompt-token estimate: characters / 4, rounded up."""
    return math.ceil(len(text) / 4)


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_identity(payload: Any) -> str:
    """A stable hash of a prompt (the messages, and the system prompt where there is one)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class PromptBook:
    """Per key: how many times each prompt was accepted, and refusals by code."""

    prompts: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    refusals: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def duplicates(self, key: str | None = None) -> int:
        """Accepted requests whose prompt had already been accepted on the same key (or any key)."""
        if key is None:
            merged: Counter[str] = Counter()
            for c in self.prompts.values():
                merged.update(c)
            return sum(n - 1 for n in merged.values() if n > 1)
        return sum(n - 1 for n in self.prompts[key].values() if n > 1)


def mask(key: str) -> str:
    return f"{key[:4]}...{key[-2:]}" if len(key) > 8 else "****"
