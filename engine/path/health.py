"""Failover in a pool of endpoints: an endpoint that stops answering leaves the pool for a while.

Each endpoint of a pool (`[[endpoints]]`, two or more) has an `EndpointHealth`, shared by its
keys, with a cooldown gate every one of its keys obeys. A run of attempts with no answer or
a 5xx (connection refused, reset, timed out, 500-599: `DOWN_AFTER` in a row, with no answer
between) closes the gate: the endpoint is out of the pool for `FIRST_DOWN_S`, and its work
waits in the one shared queue, so the other endpoints' keys take it at once (a request that
failed there is retried elsewhere, as any failed attempt is; a write that may have happened
stays pinned to its key by the usual rules, never sent to another endpoint).

When the time is up, one request goes as a probe (the gate is held while it is out). An
answer brings the endpoint back; another failure takes it out again for twice as long, up
to `MAX_DOWN_S`. A key the endpoint refuses (401/403) or whose quota is gone is blocked by
the usual rules; that is the key's state, not the endpoint's health.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ratedeck.core.vocab import EventKind, OutcomeKind
from ratedeck.engine.gate import CooldownGate

if TYPE_CHECKING:
    from collections.abc import Callable

    from ratedeck.engine.http.outcome import Outcome
    from ratedeck.engine.ports import EventSink

#: Failed attempts in a row (no answer between) that take an endpoint out of the pool.
DOWN_AFTER = 3
#: How long an endpoint is out the first time, and at most after failed probes (doubling).
FIRST_DOWN_S = 5.0
MAX_DOWN_S = 60.0

_FAILED = (OutcomeKind.CONNECTION, OutcomeKind.TIMEOUT, OutcomeKind.SERVER_ERROR)


class EndpointHealth:
    """One endpoint's health (see the module): failures in a row, out of the pool or probing."""

    __slots__ = (
        "name",
        "gate",
        "events",
        "wake",
        "failures",
        "down_s",
        "probing",
        "probe_out",
        "reason",
        "downs",
    )

    def __init__(self, name: str, events: EventSink, wake: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.gate = CooldownGate(f"endpoint {name}")
        self.events = events
        self.wake = wake  # pokes the endpoint's keys when it comes back
        self.failures = 0  # failed attempts since the last answer
        self.down_s = 0.0  # how long it was out the last time (0: never, or back since)
        self.probing = False  # out and its time is up: the next request is a probe
        self.probe_out = False  # that probe is in flight: the others wait for it
        self.reason = ""  # why it is out (empty: in the pool)
        self.downs = 0  # times it left the pool

    @property
    def state(self) -> str:
        """ "up", "down" (out of the pool) or "probing" (one request out to see)."""
        if not self.reason:
            return "up"
        return "probing" if self.probe_out else "down"

    def sent(self, now: float) -> None:
        """A key of this endpoint sent: while probing, that was the probe, and nothing else goes."""
        if self.probing and not self.probe_out:
            self.probe_out = True
            self.gate.hold(math.inf, f"{self.reason}; probing")

    def answered(self, outcome: Outcome, now: float) -> None:
        """An attempt at this endpoint ended: an answer (not a 5xx) keeps it in or brings it
        back; a failure counts toward taking it out."""
        if outcome.kind not in _FAILED:
            self.failures = 0
            if self.reason:
                self._back(now)
            return
        self.failures += 1
        what = f"HTTP {outcome.status}" if outcome.status is not None else str(outcome.kind)
        if self.probe_out:
            self._out(now, f"the probe failed ({what})")
        elif not self.reason and self.failures >= DOWN_AFTER:
            self._out(now, f"{self.failures} attempts in a row failed (the last: {what})")

    def _out(self, now: float, why: str) -> None:
        self.down_s = FIRST_DOWN_S if self.down_s == 0 else min(MAX_DOWN_S, self.down_s * 2)
        self.reason = f"out of the pool: {why}"
        self.probing, self.probe_out = True, False
        self.downs += 1
        gate = self.gate
        gate.release(now)  # a probe's hold ends here
        gate.close(now + self.down_s, self.reason, now)
        self.events.event(
            EventKind.COOLDOWN,
            f"endpoint {self.name}: {self.reason}; its work goes to the others, a probe in {self.down_s:g} s",
        )
        self.wake()  # keys held for a probe look at the new time

    def _back(self, now: float) -> None:
        self.events.event(EventKind.INFO, f"endpoint {self.name}: answers again, back in the pool")
        self.reason, self.probing, self.probe_out, self.down_s = "", False, False, 0.0
        self.gate.release(now)
        self.gate.open_at = min(self.gate.open_at, now)
        self.wake()
