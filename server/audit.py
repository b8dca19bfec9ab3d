"""An independent check of the limiter: the most accepts ever seen in one window."""

from __future__ import annotations

from collections import deque

from ratedeck.core.policy import Policy


class WindowAudit:
    """Tracks the maximum number of stamps inside any closed interval of one window.

    Kept apart from `SlotRing` on purpose: it shares no state with the limiter,
    so a limiter bug shows up as `max_in_window > limit`.

    Attributes:
        policy: the window policy audited.
        window_ms: the window length in milliseconds.
        recent: stamps within one window of the newest stamp.
        max_in_window: the largest count of stamps in any [t - window, t] so far.
    """

    __slots__ = ("policy", "window_ms", "recent", "max_in_window")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.window_ms = policy.window_s * 1000.0
        self.recent: deque[float] = deque()
        self.max_in_window = 0

    def record(self, stamp_ms: float) -> None:
        """Count one accept at `stamp_ms` (stamps must not go back in time)."""
        recent = self.recent
        recent.append(stamp_ms)
        # The busiest closed window always ends on a stamp: [stamp - W, stamp].
        oldest_allowed = stamp_ms - self.window_ms
        while recent[0] < oldest_allowed:
            recent.popleft()
        if len(recent) > self.max_in_window:
            self.max_in_window = len(recent)

    @property
    def ok(self) -> bool:
        """True while no window ever held more than the policy allows."""
        return self.max_in_window <= self.policy.limit
