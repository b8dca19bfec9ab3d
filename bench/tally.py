"""What a bench client counts, and how an answer is classified."""

from __future__ import annotations

from dataclasses import dataclass, field

OK = "ok"
RATE_LIMITED = "429"
NONCE = "nonce"
FAILED = "failed"  # other statuses, timeouts, connection errors


def classify(status: int, body: str) -> str:
    """Map an HTTP answer to one of OK, RATE_LIMITED, NONCE, FAILED."""
    if status == 200:
        return OK
    if status == 429:
        return RATE_LIMITED
    if status == 400 and "nonce" in body:
        return NONCE
    return FAILED


@dataclass
class Tally:
    """Counters of one client run. Requests end as ok, expired or graveyard
    (or stay queued / in flight at the end); attempts are sent and answered.

    `latencies_ms` holds the round trip of every successful attempt (send to
    answer), the same definition ratedeck's engine reports.
    """

    generated: int = 0
    sent: int = 0
    ok: int = 0
    rejected_429: int = 0
    rejected_nonce: int = 0
    failed: int = 0
    expired: int = 0
    graveyard: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def answer(self, kind: str, rtt_ms: float) -> None:
        if kind == OK:
            self.ok += 1
            self.latencies_ms.append(rtt_ms)
        elif kind == RATE_LIMITED:
            self.rejected_429 += 1
        elif kind == NONCE:
            self.rejected_nonce += 1
        else:
            self.failed += 1

    def merge(self, other: Tally) -> None:
        for name in (
            "generated",
            "sent",
            "ok",
            "rejected_429",
            "rejected_nonce",
            "failed",
            "expired",
            "graveyard",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.latencies_ms.extend(other.latencies_ms)

    def summary(self) -> dict:
        """Counters and p50/p99 latency, JSON-ready."""
        lat = sorted(self.latencies_ms)
        return {
            "generated": self.generated,
            "sent": self.sent,
            "succeeded": self.ok,
            "rejected_429": self.rejected_429,
            "rejected_nonce": self.rejected_nonce,
            "failed": self.failed,
            "expired": self.expired,
            "graveyard": self.graveyard,
            "p50_ms": percentile(lat, 0.50),
            "p99_ms": percentile(lat, 0.99),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list; 0 for an empty one."""
    if not sorted_values:
        return 0.0
    rank = max(1, int(q * len(sorted_values) + 0.999999))
    return sorted_values[min(rank, len(sorted_values)) - 1]
