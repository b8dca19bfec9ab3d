"""The key registry: every key worker of a run, and what they allow together.

The composition root (`engine/build.py`) makes it empty and adds each worker
as it builds it; the parts that read the keys (the intake, the run's end, a
cluster member, the makespan meter, the snapshot) are handed this registry,
never the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .worker import KeyWorker

if TYPE_CHECKING:
    from ratedeck.engine.gate import CooldownGate
    from ratedeck.engine.limits.budgets import Budgets
    from ratedeck.engine.limits.headroom import HeadroomController
    from ratedeck.engine.limits.limiter import WindowLimiter
    from ratedeck.engine.ports import RunClock


class KeyRing:
    """The run's key workers in order (`workers`), by label (`by_label`), with the budgets
    they share: the host-wide limiter and gate, the named budgets."""

    __slots__ = ("workers", "by_label", "budgets", "host_limiter", "host_gate", "headroom", "run")

    def __init__(
        self,
        *,
        run: RunClock,
        budgets: Budgets,
        headroom: HeadroomController,
        host_gate: CooldownGate,
        host_limiter: WindowLimiter | None = None,
    ) -> None:
        self.workers: list[KeyWorker] = []
        self.by_label: dict[str, KeyWorker] = {}
        self.run = run
        self.budgets = budgets
        self.headroom = headroom
        self.host_gate = host_gate
        self.host_limiter = host_limiter

    def add(self, worker: KeyWorker) -> None:
        self.workers.append(worker)
        self.by_label[worker.label] = worker

    def poke_all(self) -> None:
        """Wake every key to look at the queue again (urgent work came: `WorkQueues.urgent`)."""
        for worker in self.workers:
            worker.poke()

    def __iter__(self) -> Iterator[KeyWorker]:
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def resize_in_flight(self, work_waits: bool) -> None:
        """Each key with no number pinned sizes its in flight to its rate and round trip now
        (the engine's ticker, not a request's path; `work_waits`: the queues hold work); a key
        that may send more is woken."""
        h, now = self.headroom.seconds(), self.run.clock()
        for w in self.workers:
            limits = w.limits
            if limits.sizing is not None:
                before = limits.resize(h, work_waits and w.in_flight >= limits.max_in_flight, now)
                if w.in_flight >= before and limits.max_in_flight > w.in_flight:
                    w.poke()  # it was waiting for room in flight, and there is room now

    def in_flight(self) -> int:
        """Attempts in flight over every key (each counts its own from launch to answer)."""
        return sum(w.in_flight for w in self.workers)

    @property
    def all_refused(self) -> bool:
        """Every key was refused by the server for good: nothing more can be sent."""
        return bool(self.workers) and all(w.blocked for w in self.workers)

    @property
    def discovering(self) -> bool:
        """Some key still waits for its server to advertise a limit."""
        return any(w.limits.discovering for w in self.workers)

    def all_limiters(self) -> list[WindowLimiter]:
        limiters = [w.limits.limiter for w in self.workers] + list(self.budgets.host.values())
        limiters += [lim for w in self.workers for lim in w.limits.key_budgets.values()]
        if self.host_limiter is not None:
            limiters.append(self.host_limiter)
        return limiters

    def capacity_tps(self) -> float:
        """Requests per second the keys allow (advertised limits included), host limit applied;
        where a token budget binds, what it lets through at the requests' settled cost so far.

        A key still waiting for its server to advertise a limit counts for nothing: its
        placeholder limit is no capacity (0 in all: not known yet)."""
        total = sum(w.limits.live_rate(0.0) for w in self.workers if not w.limits.discovering)
        if self.host_limiter is not None:
            total = min(total, self.host_limiter.capacity_tps)
        return total

    def live_capacity(self, now: float) -> float:
        """Requests per second the keys that can send now really allow.

        Keys that are paused, blocked or cooling down count for nothing. The
        limiter spaces sends by (window + headroom) / limit, so the headroom
        is part of the rate: the nominal limit would promise a few percent
        more than can be sent. A key whose token budget binds counts what that
        budget lets through at the requests' settled cost so far (`KeyLimits.live_rate`).
        """
        h = self.headroom.seconds()
        total = 0.0
        for w in self.workers:
            if w.can_send(now):
                total += w.limits.live_rate(h)
        if self.host_limiter is not None:
            if self.host_gate.open_at > now:
                return 0.0
            total = min(total, self.host_limiter.live_rate(h))
        return total

    def next_gate_open(self, now: float) -> float | None:
        later = [w.gate_open_at() for w in self.workers if not (w.paused or w.blocked)]
        later = [t for t in later if t > now]
        return min(later) if later else None

    def discovered_rate(self) -> float:
        """What the keys allow now that some adopted an advertised limit: the known ones'
        capacity, and one a second for each key still waiting to learn its own."""
        known = [w.limits.limiter.capacity_tps for w in self.workers if not w.limits.discovering]
        waiting = sum(1 for w in self.workers if w.limits.discovering)
        return sum(known) + waiting

    def recent_sends(self) -> dict[str, list[float]]:
        """Each key's sends in its longest window (at most its limit), as Unix times, by the
        key's fingerprint (its label for a short secret): what a store keeps for a resume."""
        run = self.run
        now = run.clock()
        out: dict[str, list[float]] = {}
        for w in self.workers:
            policies = w.limits.limiter.policies
            span = max(p.window_s for p in policies)
            keep = max(p.limit for p in policies)
            times = w.limits.limiter.sends_since(now - span)[-keep:]
            out[w.fingerprint or w.label] = [run.wall_time(t) for t in times]
        return out

    def seed_sends(self, sends: dict[str, list[float]]) -> int:
        """Start each key's limiter with the sends another run made (Unix times, keyed as
        `recent_sends` keys them): the server still counts them, so the first sends of this
        run keep to the same window. Call before the run starts; returns how many were taken."""
        now, wall = self.run.clock(), time.time()
        taken = 0
        for w in self.workers:
            for t in sorted(sends.get(w.fingerprint or w.label, ())):
                at = now - (wall - t)
                if at <= now:
                    w.limits.limiter.record(at)
                    taken += 1
        return taken
