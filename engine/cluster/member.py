"""A member of a cluster: key budgets, cooldown gates and snapshots shared through a store.

Several processes (members) that use the same API keys must not each think
they own the whole budget. With a shared store (Redis, `ratedeck.store.redis_shared`)
a key's budget is granted by the store, not by the member's own limiter:

- **Leases.** A worker sends only at a time the store granted it. The store
  grants a few future send times at once (`SharedState.lease`), on its own
  clock, all of a key's policies together, and records them as spent before
  it answers; the member keeps them in a `LeasedSlots` and sends at exactly
  those times (its own limiter is still checked too, and never binds). An
  unused lease simply expires: it stays counted, which wastes a slot but never
  overruns one. How that stays exact is told where the grants are made
  (`ratedeck.store.redis_shared`).
- **Names.** Budgets and gates are named by fingerprints (`budget_name`); a
  key none of whose grants touches a host-wide budget has its names in one
  of `KEY_GROUPS` groups of the host's keys, each its own slot (`spread`,
  `store_name`), so a Redis Cluster spreads a host's keys over its masters.
- **Gates.** A cooldown one member closes (a Retry-After) is written to the
  store; every member reads the gates at each poll (`poll_s`, 0.1 s) and closes
  its own: a gate reaches the others within a poll plus a round trip.
- **The store unreachable.** No lease can be had, so nothing is sent; the
  member closes its `store` gate (shown in the snapshot's gates and the keys'
  state), logs one event, drops the leases it holds, asks again every
  `retry_s` and opens the gate when the store answers.
- **Snapshots.** Each member publishes a small summary of itself every
  `publish_s` (with an expiry), and reads everyone's back (the cluster view,
  `SharedState.read_cluster`) at most every `read_s` in the same poll loop,
  off the workers' path; the engine's `Snapshot.cluster` carries the last one.

The engine never awaits the store on a worker's path: fetches run in their
own tasks and poke the worker when a grant arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import os
import secrets
import socket
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ratedeck.core.policy import Policy
from ratedeck.core.vocab import EventKind, Pacing, PolicyKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.limits.leases import LeasedSlots
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.path.key import KeyLimits
from ratedeck.engine.path.keys import KeyRing
from ratedeck.engine.path.worker import KeyWorker
from ratedeck.engine.ports import (
    Ask,
    Depths,
    EventSink,
    Grant,
    Pace,
    Poll,
    ProblemSink,
    RunClock,
    RunCounts,
    SharedState,
    StoreUnavailable,
)
from ratedeck.engine.snapshot import ClusterView

__all__ = [
    "KEY_GROUPS",
    "ClusterMember",
    "Grant",
    "MemberParts",
    "LeasedSlots",
    "Poll",
    "SharedState",
    "StoreUnavailable",
    "budget_name",
    "gate_names",
    "host_fingerprint",
    "key_group",
    "member_id",
]


def _target_host(url: str | None) -> str:
    from urllib.parse import urlsplit

    try:
        return (urlsplit(url or "").netloc or "embedded").lower().rsplit("@", 1)[-1]
    except ValueError:
        return "embedded"


def host_fingerprint(target_url: str | None) -> str:
    """16 hex digits of SHA-256 of the target's host: the part of every store name members of one host share."""
    return hashlib.sha256(f"ratedeck-host\0{_target_host(target_url)}".encode()).hexdigest()[:16]


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def budget_name(target_url: str | None, secret: str | None, budget: str = "") -> str:
    """A budget as the store names it, `<host>/<budget>`: fingerprints of the target's host,
    and of the host, the key and the budget's name together, never the key. Every budget's
    store name is made here.

    `secret` and no `budget`: a key's own limits, `<host>/<key>`; `secret` and `budget`: the
    key's share of a key-scope `[[budgets]]` (or a model's, per key), `<host>/<key>.<budget>`;
    no `secret`: a host-wide budget (`budget` is its name, or `host_limits` for
    `keys.host_limits`), `<host>/<budget>`. Members that use the same key at the same host
    share one budget; 16 hex digits of SHA-256 say nothing usable about a key. The host's
    part comes first: a store on a Redis Cluster keeps every name of one host in one slot
    (`store/redis_shared.py`), so one grant may touch a key's and the host's budgets together;
    the key's part comes next, so a member can move a key's names out of the host's slot
    (`<host>.s<group>/...`, `ClusterMember.store_name`) when no grant of the key touches the host's.
    """
    host = _target_host(target_url)
    if secret is None:
        return f"{host_fingerprint(target_url)}/" + _fingerprint(f"ratedeck-host-budget\0{host}\0{budget}")
    key = _fingerprint(f"ratedeck-budget\0{host}\0{secret}")
    if budget:
        key += "." + _fingerprint(f"ratedeck-budget\0{host}\0{secret}\0{budget}")
    return f"{host_fingerprint(target_url)}/{key}"


#: How many groups a host's keys that leave its slot fall in (`ClusterMember.store_name`). A Redis
#: Cluster spreads the groups over its masters; a member's poll reads each group's epoch and
#: gates every 0.1 s (a command each), so a host of many keys costs at most this many more per
#: poll, not one per key. Members that share a host must use the same number (it names budgets).
KEY_GROUPS = 8


def key_group(key: str) -> int:
    """The group of a key's fingerprint (`<key>` of `<host>/<key>`), 0 to KEY_GROUPS - 1."""
    return zlib.crc32(key.encode()) % KEY_GROUPS


def gate_names(target_url: str | None, secrets_by_label: dict[str, str]) -> dict[str, str]:
    """Store names of the gates members share: each key's (its budget's) and the target host's (`<host>/host`)."""
    names = {label: budget_name(target_url, secret) for label, secret in secrets_by_label.items()}
    names["host"] = f"{host_fingerprint(target_url)}/host"
    return names


def _store_names(key: KeyLimits) -> dict[WindowLimiter, str]:
    return key.leases.store_names if key.leases is not None else {}


def member_id() -> str:
    """This process's name in the cluster: host, pid and a few random digits (no secret)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


@dataclass(frozen=True, slots=True)
class MemberParts:
    """What a cluster member reads and steers of its run: the run's clock and state, the keys,
    the gates it shares, the headroom, the counts it publishes, and whom it tells."""

    run: RunClock
    keys: KeyRing
    gates: Mapping[str, CooldownGate]
    store_gate: CooldownGate  # closed while the store is unreachable
    headroom: Pace
    counts: RunCounts
    queues: Depths
    events: EventSink
    problems: ProblemSink
    redact: Callable[[str, int | None], str]


class ClusterMember:
    """The engine's side of a shared store: fetches leases, shares gates, publishes, watches the store.

    Attributes:
        lease_ahead_s: how far ahead a fetch leases at a key's rate (0.25 s of
            20/s: 5 slots), so the store is asked a few times a second per key;
            never more than the work waiting less what the key holds: the store
            counts an unused lease until it expires, so a lease nobody sends on
            is a slot lost to every member (3 members each offered their share:
            0.90 of capacity, against 0.92 for one process, until this). Keys
            may still lease for the same waiting request; holding a key back
            while another key's leases cover the work made members erratic
            (0.87-0.93), since those leases may be later than its own.
        horizon_s: the store grants no slot further ahead than this.
        slack_s: how late a lease may still be used (timers fire late), beyond
            the clock uncertainty, which the store adds itself. It costs
            only until the send is told (`_sends`, with each poll): the store
            then counts the send from when it was made.
        confirm_s: leases are used only while the store's epoch was confirmed
            within this long (a key's by its own grant, every key's by a poll,
            which reads every hash tag's). A Redis restarted empty
            has a new epoch: every member drops what it holds within
            `confirm_s`, and a budget's first grant after it waits that out
            too (`_hold_s`), so old leases and new grants never meet.
    """

    def __init__(
        self,
        parts: MemberParts,
        shared: SharedState,
        budget_ids: dict[str, str],
        gate_ids: dict[str, str],
        *,
        member: str | None = None,
        lease_ahead_s: float = 0.25,
        horizon_s: float = 1.0,
        slack_s: float = 0.015,
        poll_s: float = 0.1,
        confirm_s: float = 0.3,
        publish_s: float = 1.0,
        read_s: float = 1.0,
        retry_s: float = 0.25,
    ):
        self.parts = parts
        self.shared = shared
        self.budget_ids = budget_ids  # key label -> budget name in the store (a fingerprint)
        self.gate_ids = gate_ids  # gate name -> its name in the store
        self.member = member or member_id()
        self.lease_ahead_s = lease_ahead_s
        self.horizon_s = horizon_s
        self.slack_s = slack_s
        self.poll_s = poll_s
        self.confirm_s = confirm_s
        self.epochs: dict[str, str] = {}  # the store's epoch by host (`_epoch`)
        self.publish_s = publish_s
        self.read_s = read_s  # the cluster view is read at most this often
        self.view: ClusterView | None = None  # the last one read (kept while the store is away)
        self.retry_s = retry_s
        self.down_since: float | None = None
        self.outages = 0
        self.last_problem = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self.own_slot: set[str] = set()  # keys (`<host>/<key>`) whose names leave the host's slot

    # -- names in the store
    def spread(self) -> set[str]:
        """The keys whose every budget is the key's own (its limits, its key-scope budgets, its
        models'): none of its grants touches a host-wide budget, so its names may leave the
        host's slot for a group of keys of their own (`store_name`). A key that spends a
        host-wide budget (`keys.host_limits`, a host-scope `[[budgets]]`) keeps the host's slot,
        where one grant spends both atomically.

        Decided from this member's configuration, the same for every member of one config (members
        sharing a host must agree on its host-wide budgets anyway: one that does not know one
        spends none of it)."""
        out = set()
        for w in self.parts.keys.workers:
            own = self.budget_ids.get(w.label)
            names = _store_names(w.limits).values()
            if own is not None and all(n == own or n.startswith(own + ".") for n in names):
                out.add(own)
        return out

    def store_name(self, name: str) -> str:
        """`name` as the store is asked it: a key's budget or gate `<host>/<key>[.<budget>]` moves
        to `<host>.s<n>/<key>[.<budget>]` (the store's hash tag is the part before `/`) when the
        key may leave the host's slot (`spread`), `n` the key's group (`key_group`); every other
        name is unchanged."""
        host, sep, leaf = name.partition("/")
        key = leaf.partition(".")[0]
        if sep and self.own_slot and f"{host}/{key}" in self.own_slot:
            return f"{host}.s{key_group(key)}/{leaf}"
        return name

    # -- the workers' side
    def want(self, worker: KeyWorker, now: float, leases: LeasedSlots | None = None) -> None:
        """`worker` has work and too few leases (for `leases`' plan): fetch more, unless a fetch
        runs or the budget is full."""
        held = worker.limits.leases
        leases = leases if leases is not None else (held.default if held is not None else None)
        if held is None or leases is None:
            return
        if leases.fetching or self.down_since is not None or now < leases.retry_at:
            return
        leases.fetching = True
        held.fetching += 1
        self._spawn(self._fetch(worker, leases))

    def plan_of(self, worker: KeyWorker, leases: LeasedSlots) -> list[tuple[WindowLimiter, int]]:
        """The limiters a lease of `leases` spends from, and the cost in each."""
        if leases.plan is not None:
            return leases.plan
        return [(lim, 1) for lim in worker.limits.limiters]

    def asks(self, worker: KeyWorker, plan: list[tuple[WindowLimiter, int]]) -> list[Ask]:
        """The plan as the store is asked it: each budget's store name, policies as enforced now, cost."""
        out: list[Ask] = []
        names = _store_names(worker.limits)
        for lim, cost in plan:
            name = names.get(lim)
            if name is not None:
                out.append(Ask(self.store_name(name), lim.current_policies(), cost))
        return out

    async def _fetch(self, worker: KeyWorker, leases: LeasedSlots) -> None:
        parts = self.parts
        plan = self.plan_of(worker, leases)
        try:
            # sends a second the plan's budgets allow, each at its cost
            rate = min(min(p.rate for p in lim.current_policies()) / max(1, cost) for lim, cost in plan)
            count = (
                1
                if leases.single or leases.plan is not None
                else max(1, min(16, math.ceil(rate * self.lease_ahead_s), len(worker.queues) - len(leases)))
            )
            h = parts.headroom.seconds()
            grant = await self.shared.lease(
                self.asks(worker, plan),
                count,
                h,
                self.slack_s,
                parts.headroom.pace_seconds(),
                # even pacing spaces the cluster's sends as the limiter would one member's
                worker.limiter.spacing() if worker.limiter.pacing is Pacing.EVEN else 0.0,
                self.horizon_s,
                self._hold_s(plan, h),
            )
        except StoreUnavailable as exc:
            self._went_down(str(exc))
            return
        finally:
            leases.fetching = False
            if worker.limits.leases is not None:
                worker.limits.leases.fetching -= 1
            worker.poke()  # whatever happened, the worker looks again (it waits for this)
        if self._epoch(grant.epoch, parts.run.clock(), worker):
            leases.add(grant)
        if grant.retry_at is not None:
            leases.retry_at = grant.retry_at
        if grant.fresh and parts.run.loop is not None and worker.stats.sent:
            parts.events.event(
                EventKind.INFO, f"{worker.label}: the store had no record of its budget; started afresh"
            )

    def _hold_s(self, plan: list[tuple[WindowLimiter, int]], h: float) -> float:
        """How long a budget the store has no record of must stay shut, told by a member that sent on it.

        The store's state may have been lost (a restart without persistence):
        sends made before it, by anyone, are not in it. This member's own
        recent sends show that the budget was in use; it then asks that the
        budget's first grant wait out the longest window (and the leases
        anyone may still hold), so no window sees old and new sends together.
        A member that has not sent within that time asks for no wait. Old
        leases cannot outlive `confirm_s` after the restart (see `confirm_s`).
        """
        longest = 0.0
        for lim, _cost in plan:
            for p in lim.policies:
                if p.kind is not PolicyKind.BUCKET:  # a sliding or a fixed window
                    longest = max(longest, p.window_s)
                elif p.kind is PolicyKind.BUCKET:
                    longest = max(longest, p.limit / p.rate)
        hold = longest + h + self.slack_s + self.confirm_s
        since = self.parts.run.clock() - hold
        if any(lim.spent_since(since) > 0 for lim, _cost in plan):
            return hold
        return 0.0

    # -- what the server said, and what it did not charge
    def gave_back(self, key: KeyLimits, limiter: WindowLimiter, ticket: Any, units: int) -> None:
        """A send on a lease (`ticket`) was charged `units` less in `limiter`'s budget: free them
        in the store too (fire and forget: a lost give-back wastes units, never overruns)."""
        name = _store_names(key).get(limiter)
        if ticket is None or name is None or units <= 0 or self.down_since is not None:
            return
        self._spawn(self._call_quietly(self.shared.give_back(ticket, self.store_name(name), units)))

    def synced(
        self,
        key: KeyLimits,
        limiter: WindowLimiter,
        policy: Policy,
        counted: int,
        at: float,
        until: float | None,
    ) -> None:
        """The server counted `counted` of `limiter`'s budget (`policy`): raise the shared count."""
        name = _store_names(key).get(limiter)
        if name is None or counted <= 0 or self.down_since is not None:
            return
        self._spawn(self._call_quietly(self.shared.sync(self.store_name(name), policy, counted, at, until)))

    async def _call_quietly(self, call: Any) -> None:
        try:
            await call
        except StoreUnavailable as exc:
            self._went_down(str(exc))

    # -- gates
    def gate_closed(self, gate: CooldownGate, reason: str) -> None:
        """A gate of ours moved: tell the others (fire and forget; a lost write only delays them)."""
        store_name = self.gate_ids.get(gate.name)
        if store_name is None or self.down_since is not None:
            return
        self._spawn(self._share_gate(self.store_name(store_name), gate.open_at, reason))

    async def _share_gate(self, store_name: str, until: float, reason: str) -> None:
        try:
            await self.shared.close_gate(store_name, until, self.parts.redact(reason, 120))
        except StoreUnavailable as exc:
            self._went_down(str(exc))

    @property
    def epoch(self) -> str | None:
        """The store's epochs as last read, for people (None: none read)."""
        return "|".join(f"{h}={e}" for h, e in sorted(self.epochs.items())) if self.epochs else None

    def _epoch(self, epoch: str | None, now: float, worker: KeyWorker | None = None) -> bool:
        """Note the store's epochs as just read (a grant's: its hash tag's, for `worker`; a poll's:
        every tag's, as `tag=epoch|...`, `tag=` for one with none yet): leases stay usable
        `confirm_s` more (a grant's: `worker`'s only, the tag it confirmed) if each tag's is the
        one we knew; a new or missing one where we knew one (Redis, or one master, lost its
        state) drops every lease held. False when none was read."""
        found = _epochs(epoch)
        known = self.epochs
        changed = (
            any(known.get(host, e) != e for host, e in found.items() if host in known)
            if found
            else bool(known)
        )
        if changed:
            for w in self.parts.keys.workers:
                for slots in w.all_leases():
                    slots.clear()
            self.parts.events.event(
                EventKind.INFO, f"store {self.shared.shown} started afresh (state lost): leases dropped"
            )
        if found is None:
            self.epochs = {}
        else:
            for host, e in found.items():
                if e:
                    known[host] = e
                else:
                    known.pop(host, None)
        until = now + self.confirm_s if found is not None else -math.inf
        for w in self.parts.keys.workers if worker is None else (worker,):
            for slots in w.all_leases():
                slots.valid_until = until
        return found is not None

    def _apply_gates(self, found: dict[str, tuple[float, str]], now: float, by_store: dict[str, str]) -> None:
        """Close our gates the store says are closed longer; `by_store`: gate names by their
        names in the store."""
        for store_name, (until, reason) in found.items():
            gate = self.parts.gates.get(by_store.get(store_name, ""))
            # Our own closing comes back a hair later (clock conversion): only a real extension counts.
            if gate is None or until <= gate.open_at + 0.05 or until <= now:
                continue
            if gate.close(until, f"shared: {reason}"):
                self.parts.events.event(
                    EventKind.COOLDOWN,
                    f"{gate.name} cooling down {until - now:.1f}s (another member): {reason}",
                )

    # -- the store's health
    def _went_down(self, problem: str) -> None:
        parts = self.parts
        now = parts.run.clock()
        for w in parts.keys.workers:
            for slots in w.all_leases():
                slots.clear()  # held leases may predate a lost state: not used after an outage
        parts.store_gate.hold(now + 3600.0, "store unreachable")
        self.last_problem = problem
        if self.down_since is None:
            self.down_since = now
            self.outages += 1
            parts.events.event(
                EventKind.ERROR,
                f"store {self.shared.shown} unreachable ({problem}): not sending until it is back",
            )

    def _came_back(self) -> None:
        parts = self.parts
        now = parts.run.clock()
        since = self.down_since if self.down_since is not None else now
        self.down_since = None
        parts.store_gate.release(now)
        parts.events.event(
            EventKind.INFO, f"store {self.shared.shown} reachable again after {now - since:.1f}s"
        )
        for w in parts.keys.workers:
            for slots in w.all_leases():
                slots.retry_at = 0.0
            w.poke()

    # -- running
    def start(self) -> None:
        self.own_slot = self.spread()
        self.shared.bind(self.parts.run.clock)
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="cluster")
        self._runner.add_done_callback(self._runner_ended)

    def _runner_ended(self, task: asyncio.Task[None]) -> None:
        # A bug here must not pass silently: without polls, leases stop after `confirm_s`, and a
        # member down would never come back. So it is told (once) and the polls start again.
        self._task_ended(task)
        if not self._closing and not task.cancelled() and task.exception() is not None:
            asyncio.get_running_loop().call_later(self.retry_s, self._restart)

    def _restart(self) -> None:
        if not self._closing:
            self.start()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.parts.problems.problem(f"cluster: {type(exc).__name__}: {self.parts.redact(str(exc), 200)}")

    async def _run(self) -> None:
        parts = self.parts
        next_publish = next_read = 0.0
        by_store = {self.store_name(v): k for k, v in self.gate_ids.items()}  # fixed from `start`
        gates = list(by_store)
        # Not `while True`: a client's timeout that races a cancel can turn the CancelledError
        # into a timeout (redis-py's can), and this loop would then outlive the stop.
        while not self._closing:
            now = parts.run.clock()
            if self.down_since is not None:
                try:
                    await self.shared.ping()
                except StoreUnavailable as exc:
                    self.last_problem = str(exc)
                    await asyncio.sleep(self.retry_s)
                    continue
                self._came_back()
                continue
            try:
                sends = self._sends()
                if sends:
                    await self.shared.sent(sends)
                polled = await self.shared.poll(gates)
                now = parts.run.clock()
                self._epoch(polled.epoch, now)
                self._apply_gates(polled.gates, now, by_store)
            except StoreUnavailable as exc:
                self._went_down(str(exc))
                continue
            # The snapshots may live elsewhere (another master of a cluster): without them the
            # view goes stale, and the budgets, which the poll just reached, are still granted.
            try:
                if now >= next_publish:
                    next_publish = now + self.publish_s
                    await self.shared.publish(self.member, self.summary(), ttl_s=max(3.0, 3 * self.publish_s))
                if now >= next_read:
                    next_read = now + self.read_s
                    view = await self.shared.read_cluster()
                    at = round(parts.run.clock() - parts.run.started_at, 1)
                    self.view = dataclasses.replace(view, read_at_s=at)
                    self.adopt_learned(parts.run.clock())
            except StoreUnavailable as exc:
                self.last_problem = str(exc)
            await asyncio.sleep(self.poll_s)

    def _sends(self) -> list[tuple[Any, float]]:
        """The sends made on leases since the last call (each lease's ticket and send time)."""
        out: list[tuple[Any, float]] = []
        for w in self.parts.keys.workers:
            for slots in w.all_leases():
                if slots.sent:
                    out += slots.sent
                    slots.sent = []
        return out

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_ended)

    def _spawned_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._task_ended(task)

    async def close(self) -> None:
        """Stop polling, publish a last summary (best effort), close the connection."""
        self._closing = True
        tasks = [t for t in (self._runner, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)  # bounded: a client's cleanup never holds up a stop
        if self.down_since is None:
            try:
                last = self.shared.publish(self.member, self.summary(), ttl_s=max(3.0, 3 * self.publish_s))
                await asyncio.wait_for(last, 2.0)
            except (StoreUnavailable, TimeoutError):
                pass
        await self.shared.close()

    # -- reading
    def summary(self) -> dict[str, Any]:
        """This member as the cluster view shows it: counters, rates, queue depths, its keys (masked)."""
        parts = self.parts
        m = parts.counts
        now = parts.run.clock()
        elapsed = max(1e-9, now - parts.run.started_at)
        return {
            "member": self.member,
            "pid": os.getpid(),
            "phase": str(parts.run.phase),
            "elapsed_s": round(elapsed, 1),
            "sent": m.sent,
            "succeeded": m.succeeded,
            "rejected_429": m.rejected_429,
            "current_tps": m.tps_series[-1] if m.tps_series else 0.0,
            "throughput_tps": round(m.succeeded / elapsed, 2),
            "main_depth": len(parts.queues.main),
            "dlq_depth": len(parts.queues.dlq),
            "in_flight": parts.keys.in_flight(),
            "store": "unreachable" if self.down_since is not None else "ok",
            "store_calls": self.shared.calls,
            "leases": dict(zip(("granted", "used", "dropped"), self.lease_totals(), strict=True)),
            "keys": [
                {
                    "label": w.label,
                    "key": w.masked,
                    "budget": self.budget_ids.get(w.label, ""),
                    "sent": w.stats.sent,
                    "state": str(w.state(now)),
                    "leases_dropped": sum(s.dropped for s in w.all_leases()),
                    # shared with every member (the store keeps the newest per budget)
                    "learned": self._learned(w, now),
                }
                for w in parts.keys.workers
            ],
        }

    def _learned(self, w: KeyWorker, now: float) -> dict[str, Any]:
        """What this member learned of key `w` (estimate, server counts, headroom), stamped with
        the wall time it last changed, for the store's hash of the key."""
        limits = w.limits
        est = limits.estimate
        out: dict[str, Any] = {"headroom_ms": round(self.parts.headroom.seconds() * 1000, 1)}
        if est is not None and est.moved_at is not None:
            out.update(
                estimate=est.value,
                window_s=est.window_s,
                reason=est.reason,
                moved_at=self.parts.run.wall_time(est.moved_at),
            )
        if limits.server.remaining is not None:
            out["remaining"] = limits.server.remaining
        if limits.server.limit is not None:
            out["limit"] = limits.server.limit
        return out

    def adopt_learned(self, now: float) -> None:
        """Adopt another member's estimate of a key we share when it moved later than ours
        (last writer wins: the grants stay exact whatever the estimate; it only paces us)."""
        view = self.view
        if view is None:
            return
        by_budget = {r.budget: r for r in view.keys}
        for w in self.parts.keys.workers:
            row = by_budget.get(self.budget_ids.get(w.label, ""))
            est = w.limits.estimate
            if row is None or row.member == self.member or est is None or row.estimate_limit is None:
                continue
            ours = self.parts.run.wall_time(est.moved_at) if est.moved_at is not None else -math.inf
            if row.estimate_limit != est.value and self._wall(now) - row.age_s > ours:
                if w.limits.adopt_estimate(row.estimate_limit, f"shared by {row.member}: {row.reason}", now):
                    self.parts.events.event(
                        EventKind.SETTING,
                        f"{w.label}: limit estimate {row.estimate} from another member ({row.reason})",
                    )

    def _wall(self, now: float) -> float:
        return self.parts.run.wall_time(now)

    def lease_totals(self) -> tuple[int, int, int]:
        """(granted, used, dropped) leases over all keys."""
        granted = used = dropped = 0
        for w in self.parts.keys.workers:
            for slots in w.all_leases():
                granted += slots.granted
                used += slots.used
                dropped += slots.dropped
        return granted, used, dropped


def _epochs(text: str | None) -> dict[str, str] | None:
    """A store's epoch text as {host: epoch}: `host=epoch` parts joined by `|` (a plain text is
    one epoch for the one host); None when the store said none."""
    if text is None:
        return None
    out = {}
    for part in text.split("|"):
        host, sep, epoch = part.partition("=")
        out[host if sep else ""] = epoch if sep else part
    return out
