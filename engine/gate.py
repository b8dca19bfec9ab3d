"""Cooldown gates: when a server says "slow down", everyone who shares that budget waits."""

from __future__ import annotations


class CooldownGate:
    """Closed until `open_at` (engine clock seconds); the longest delay wins.

    A gate belongs to a budget (one key, or a whole host). Every sender of
    that budget checks it before sending, so one rejection pauses them all.
    """

    __slots__ = ("name", "open_at", "reason", "closures", "escalations", "_last_delay", "_held")

    def __init__(self, name: str):
        self.name = name
        self.open_at = 0.0
        self.reason = ""
        self.closures = 0
        self.escalations = 0  # closings asking for a longer wait than the previous one
        self._last_delay = 0.0
        self._held = False

    def close(self, until: float, reason: str, now: float | None = None) -> bool:
        """Close until `until` unless already closed longer; True if it moved."""
        if until <= self.open_at:
            return False
        if now is not None:
            delay = until - now
            if self.closures and delay > self._last_delay * 1.5:
                self.escalations += 1
            self._last_delay = delay
        self.open_at = until
        self.reason = reason
        self.closures += 1
        return True

    def hold(self, until: float, reason: str) -> None:
        """Closed while a condition lasts (the shared store unreachable), until `until` or `release`.

        Holding again extends it; a spell counts as one closure.
        """
        if not self._held:
            self._held = True
            self.closures += 1
        if until > self.open_at:
            self.open_at = until
        self.reason = reason

    def release(self, now: float) -> None:
        """End a `hold` at `now` (use a gate of its own for a hold: a cooldown in it would end too)."""
        if self._held:
            self._held = False
            self.open_at = now

    def left(self, now: float) -> float:
        return max(0.0, self.open_at - now)
