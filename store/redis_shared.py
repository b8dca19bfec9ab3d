"""Budgets, cooldown gates and member snapshots shared by many processes through Redis.

`RedisShared` is the engine's `SharedState` (`ratedeck.engine.ports`) on a
Redis server. Every member that uses a key at a host asks Redis, not its own
limiter, for the times it may send.

**A grant** (`redis_scripts.GRANT`, one atomic script per call) takes all of
a key's policies together, on Redis's clock (`TIME`), never the members':
sliding windows keep one sorted-set member per unit, scored by the time the
unit stops counting (`t + W + h`); fixed windows keep a counter per window of
the Unix clock; a bucket keeps its level and when. The member passes its
headroom `h` in, and the same rules as `engine/limits/limiter.py` apply: a sliding
slot frees at `t + W + h`, a send at `t` counts in every fixed window that
`[t - h, t + h]` touches, a bucket keeps `rate * h` free; sends are spaced
`(W + pace) * spacing / N` (even pacing) across all members.

**Leases, and why they stay exact.** To keep Redis off each send, a call
grants up to `count` future send times at once (the script reserves them
before it answers; none further ahead than `horizon_s`):

- no two members ever hold the same slot: a slot is created only inside the
  script, which runs alone, and is handed to exactly one caller; every slot
  is at or after the last one granted (`last`), so the check for a new slot at
  `s` only has to look at `s` (every earlier grant's counting interval starts
  at or before `s`, and counts only less later on);
- the sum of grants in any window stays within the limit: each grant is
  recorded as counting over `[s, s + W + h')` with `h' = h + slack + u`,
  which contains the real send's interval: the member sends at loop time
  `s - lo`, never before `s` on Redis's clock (`lo` is a lower bound of
  Redis time minus loop time, from the round trips of its calls: `TIME` was
  read between the call's start `t0` and end `t1`, so the offset lies in
  `[T - t1, T - t0]`), and at most `slack` late; so the real send lies in
  `[s, s + slack + u]`, `u` the width of the offset's bounds;
- a lease unused by `slack` after its time is dropped, still counted: waste,
  never excess. After the store was unreachable a member drops all it holds;
- a member tells the sends it made (`sent`, with its gate poll, every 0.1 s):
  a sliding window's interval then ends at the send's upper bound on Redis's
  clock (its loop time plus the offset's `hi`) plus `W + h`, which is inside
  the granted one and still contains the real send's. Without it every lease
  counted `slack + u` longer than one process's limiter counts a send (1.4%
  of a key's rate at 15 ms of slack and a window of 1 s); with it, only `u`
  and the time the loop took to send. Every earlier interval still starts at
  or before a new slot, so the check at `s` stays exact. Fixed windows and
  buckets keep what they were granted.

Redis's state may be lost (a restart without persistence). Every grant
sets the store's epoch key (one per hash tag, below) if it is missing; members
read them with each gate poll (0.1 s) and each grant, as `<tag>=<epoch>` (a
poll joins its tags' with `|`, `<tag>=` for one with no epoch yet), and use a
key's leases only while the epoch of its tag was confirmed within `confirm_s`
(0.3 s), dropping them all when one changed or went missing. The first grant
of a budget with no record waits (`hold_s`) the longest window, the headroom,
the slack and `confirm_s` when the asking member sent on it lately, so sends
from before and after the loss never share a window. Redis's clock is the one
clock: if it is stepped (NTP), grants near the step may overlap.

Names in Redis carry a fingerprint of the key (`budget_name`), never the key.

**A Redis Cluster** (`redis+cluster://host:port,...`, `connect`): a script
must touch one slot, so every key carries a hash tag, `{h:<group>}` for a name
`<group>/<leaf>` (`tag`). The engine names a budget or gate `<host>/<name>`
(fingerprints), and a member moves a key's names to `<host>.s<n>/<name>` when
none of that key's grants touches a host-wide budget (`ClusterMember.spread`):
a key's own limits, its key-scope budgets, its models' and its gate then live
in one of a host's `KEY_GROUPS` (8) groups of keys, the key's by its
fingerprint (`engine.cluster.member.key_group`), each group its own slot, so
a host's keys spread over the masters (with one target host, one master
would otherwise hold every budget and the others none). Groups, not a slot
per key: a poll reads every group's epoch and gates, so a host of 50 keys
costs a member 8 more commands a poll, not 50. A host-wide budget
(`keys.host_limits`, a host-scope `[[budgets]]`) and the host's gate stay
under `{h:<host>}`, and so do the keys of a host that has one: a grant that
spends a key's and the host's budgets passes them all in KEYS and stays one
atomic call on one master, so the sum of grants in any window stays within
every limit as on one server. (Spreading such keys too would need a grant
over two masters, which no script can make atomic; reserving on one then the
other would hold slots neither may use while the second call runs.) Members
sharing a host must agree on whether it has host-wide budgets, as they must
for those budgets to hold at all. The learned state of a key (`learned_key`)
stays under its host's tag (no script touches it; a reader finds a host's
keys by the host alone). The work and the member snapshots are under
`{q:<namespace>}` (`work_key`).

Each tag lives on one master, and each master has its own epoch (a master
restarted empty is a new epoch for the tags it holds, not for the others) and
its own clock: the offset bounds `lo`, `hi` and `u` above are kept per tag
(`offset_of`), from the round trips to the master of that tag (`TIME` read
there), and a grant, a `sent` report, a gate or a sync uses its own tag's. A
poll reads every tag's epoch and gates, and the `sent` reports trim every
tag's windows, each in one pipeline (one round trip per master, all at once).
On one server the tags change nothing: its epochs, clocks and polls are per
host, as before keys had tags of their own (`group`), and a poll and a report
are one call each.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ratedeck.core.policy import Policy
from ratedeck.core.secrets import safe_url
from ratedeck.core.vocab import PolicyKind
from ratedeck.engine.ports import Ask, Grant, Poll, StoreUnavailable
from ratedeck.engine.snapshot import ClusterView, MemberRow, SharedKeyRow

from . import redis_scripts
from .base import StoreError

#: Redis keys start with this (a namespace keeps several clusters apart on one server).
NAMESPACE = "ratedeck"
#: The consumer group every member claims work in.
GROUP = "ratedeck"
#: How long a command may take before the store counts as unreachable.
COMMAND_TIMEOUT_S = 1.0


#: Schemes of a Redis Cluster URL: `redis+cluster://host:port,host:port,...` (TLS: `rediss+cluster`).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster(url: str) -> bool:
    return url.strip().split("://", 1)[0].lower() in CLUSTER_SCHEMES


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """A cluster URL's startup nodes (any one reachable is enough), user and password; else `StoreError`."""
    scheme, _, rest = url.strip().partition("://")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0].split("#", 1)[0]
    if path not in ("", "0"):
        raise StoreError("a Redis Cluster has only database 0; write redis+cluster://host:port,host:port")
    userinfo, at, hosts = netloc.rpartition("@")
    user = password = None
    if at:
        u, colon, pw = userinfo.partition(":")
        user, password = (u or None), (pw if colon else None)
    nodes = []
    for part in hosts.split(","):
        if not part.strip():
            continue
        try:
            where = urlsplit(f"redis://{part.strip()}")
            host, port = where.hostname, where.port
        except ValueError as exc:
            raise StoreError(f"not a Redis Cluster URL ({exc})") from None
        if not host:
            raise StoreError("no host; write redis+cluster://host:port,host:port")
        if port is not None and not 0 < port < 65536:
            raise StoreError("port out of range")
        nodes.append((host, port or 6379))
    if not nodes:
        raise StoreError("no host; write redis+cluster://host:port,host:port")
    return nodes, user, password


def budget_prefix(namespace: str, budget: str) -> str:
    """Every Redis key of a budget's grants starts with this: `<ns>:{h:<group>}:b:<key>` for a
    name `<group>/<key>`, one hash tag per group (`tag`: a target host, or a group of keys at it)."""
    return f"{namespace}:{{{tag(budget)}}}:b:{_leaf(budget)}"


def learned_key(namespace: str, budget: str) -> str:
    """A key's learned state: a hash, one field per member (its JSON), the newest read wins. Under
    the host's tag (`host_tag`), whatever the budget's: no script touches it, and a reader finds
    every key of a host by its host alone."""
    return f"{namespace}:{{{host_tag(budget)}}}:b:{_leaf(budget)}:learned"


#: How long a member's learned state of a key outlives its last publish.
LEARNED_TTL_S = 60.0


def check_url(url: str) -> str:
    """`url` if it names a Redis server (redis://host:port/db, rediss://, unix://) or a Redis Cluster
    (redis+cluster://host:port,host:port), else `StoreError`."""
    text = url.strip()
    if is_cluster(text):
        cluster_nodes(text)
        return text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise StoreError(f"not a Redis URL ({exc})") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StoreError("not a Redis URL; write redis://host:port/db or redis+cluster://host:port,host:port")
    if parts.scheme != "unix" and not parts.hostname:
        raise StoreError("no host; write redis://host:port/db")
    if port is not None and not 0 < port < 65536:
        raise StoreError("port out of range")
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        raise StoreError("the database must be a number (redis://host:port/0)")
    return text


def connect(url: str, *, sync: bool = False) -> Any:
    """A redis-py client for `url` with short timeouts: asyncio, with no retries (the caller
    retries); with `sync`, redis-py's blocking client (the gateway's batch store: quick calls).

    A cluster URL gives a `RedisCluster` that learns every node from any one that answers;
    the asyncio one accepts slots no master holds (a master down), so the keys on the other
    masters go on.
    """
    text = check_url(url)
    timeouts: dict[str, Any] = {
        "socket_timeout": COMMAND_TIMEOUT_S,
        "socket_connect_timeout": COMMAND_TIMEOUT_S,
    }
    try:
        if is_cluster(text):
            nodes, user, password = cluster_nodes(text)
            login: dict[str, Any] = {
                "username": user,
                "password": password,
                "ssl": text.lower().startswith("rediss+"),
            }
            if sync:
                from redis.cluster import ClusterNode, RedisCluster

                return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **login, **timeouts)
            from redis.asyncio.cluster import ClusterNode as AsyncNode
            from redis.asyncio.cluster import RedisCluster as AsyncCluster
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            return AsyncCluster(
                startup_nodes=[AsyncNode(h, p) for h, p in nodes],
                **login,
                require_full_coverage=False,
                retry=Retry(NoBackoff(), 1),  # once more: a MOVED after a change of slots
                **timeouts,
            )
        if sync:
            import redis

            return redis.Redis.from_url(text, **timeouts)
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        return aioredis.Redis.from_url(text, retry=Retry(NoBackoff(), 0), **timeouts)
    except ValueError as exc:
        raise StoreError(f"not a Redis URL ({exc})") from None


def failures() -> tuple[type[BaseException], ...]:
    """What a client raises when the store does not answer (a cluster's own errors included)."""
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)


def unavailable(exc: BaseException) -> StoreUnavailable:
    """A redis-py (or socket) failure as one line, no traceback."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return StoreUnavailable(f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__)


def is_store_failure(exc: BaseException) -> bool:
    """Whether `exc` says the store did not answer: a client's error, or a write on a connection
    closed under it. redis-py 8.1 lets the transport's own error through when a connection it
    shares between commands was closed (a peer's reset, or the cluster client closing every
    connection after a `CLUSTERDOWN`): `'NoneType' object has no attribute 'writelines'` or
    `... is not callable` (redis/redis-py#4287). Seen here when a master restarted."""
    if isinstance(exc, failures()):
        return True
    return isinstance(exc, (AttributeError, TypeError)) and "'NoneType' object" in str(exc)


def cancel_lost(exc: BaseException) -> bool:
    """Whether `exc` hides a cancel of the current task.

    A client's read timeout that races a cancel can turn the CancelledError
    into a timeout (redis-py on Python 3.11); reported as a store failure, it
    would keep a stopping loop alive. The task still says it is cancelling.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0 and not isinstance(exc, asyncio.CancelledError)


def tag(name: str) -> str:
    """The hash tag of a name the engine gives the store: `h:<group>` for `<group>/<rest>`, else
    the name itself. The group is the target's host (`<host>`: the host's budgets and gates, and
    its keys' when the host has host-wide budgets) or a group of keys at it (`<host>.s<n>`: their
    budgets and gates), see the module's docstring."""
    group, sep, _rest = name.partition("/")
    return f"h:{group}" if sep else name


def host_tag(name: str) -> str:
    """The hash tag of the target host a name belongs to (`h:<host>`), whatever its group."""
    group, sep, _rest = name.partition("/")
    return f"h:{group.partition('.')[0]}" if sep else name


def _leaf(name: str) -> str:
    return name.partition("/")[2] or name


def work_key(namespace: str, name: str) -> str:
    """A key of the shared work (`main`, `seq`, `sending`, ...) or the members' snapshots: one tag
    per queue (a namespace), so a transaction on the streams touches one slot."""
    return f"{namespace}:{{q:{namespace}}}:{name}"


class _Script:
    """A Lua script called by its SHA, sent whole (`EVAL`) to a node that does not know it yet.

    Unlike redis-py's `Script`, it never loads a script on every master first
    (a master that is down would fail the call for keys it does not hold).
    """

    def __init__(self, client: Any, text: str):
        import hashlib

        self.client = client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        from redis.exceptions import NoScriptError

        try:
            return await self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self.client.eval(self.text, len(keys), *keys, *args)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _kind(policy: Policy) -> str:
    return {PolicyKind.SLIDING: "s", PolicyKind.FIXED: "f", PolicyKind.BUCKET: "b"}[policy.kind]


def _us(seconds: float) -> int:
    return max(0, int(seconds * 1_000_000 + 0.999999))  # whole µs, rounded up


def _policy_args(p: Policy) -> list[Any]:
    return [_kind(p), max(1, int(p.limit)), _us(p.window_s), repr(float(p.drain))]


@dataclass(frozen=True, slots=True)
class _Ticket:
    """A granted slot as `give_back` needs it: its time and headroom on Redis's clock (µs), and
    per budget its sequence number and what was asked (cost, policies)."""

    at_us: int
    h_us: int  # the headroom counted: the member's, its slack and the clocks' uncertainty
    head_us: int  # the member's headroom alone
    seqs: dict[str, tuple[int, Ask]]


@dataclass
class _Offset:
    """Bounds of (Redis time - loop time), seconds, from recent round trips."""

    lo: float = float("-inf")
    hi: float = float("inf")

    @property
    def width(self) -> float:
        return self.hi - self.lo


class RedisShared:
    """The `SharedState` on one Redis server (see the module docstring)."""

    def __init__(self, url: str, *, namespace: str = NAMESPACE, client: Any = None):
        self.url = check_url(url)
        self.shown = safe_url(self.url) or "redis"
        self.ns = namespace
        self.client = client if client is not None else connect(self.url)
        self.cluster = is_cluster(self.url)
        self._grant = _Script(self.client, redis_scripts.GRANT)
        self._close_gate = _Script(self.client, redis_scripts.CLOSE_GATE)
        self._refund = _Script(self.client, redis_scripts.REFUND)
        self._trim = _Script(self.client, redis_scripts.TRIM)
        self._sync = _Script(self.client, redis_scripts.SYNC)
        self._time = _Script(self.client, redis_scripts.TIME)
        self._read = _Script(self.client, redis_scripts.READ)
        self._name = ""  # the last budget or gate asked about: its slot answers pings
        self._clock: Callable[[], float] = time.monotonic
        # per hash tag (a tag is on one master, each master its own clock): (at, lo, hi) samples
        self._samples: dict[str, deque[tuple[float, float, float]]] = {}
        self.offsets: dict[str, _Offset] = {}
        self._tags: dict[str, str] = {}  # a name of each hash tag whose clock was read
        self.calls = 0
        self.last_grant_us: tuple[int, ...] = ()  # the last grant on Redis's clock (for audits)

    def bind(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._samples.clear()
        self.offsets.clear()

    def group(self, name: str) -> str:
        """What shares an epoch and a clock with `name`: its hash tag on a cluster (a tag is on one
        master), its host's on one server (one epoch, one clock, one `MGET` a poll)."""
        return tag(name) if self.cluster else host_tag(name)

    # -- the clocks: one per group (on a cluster the clock of the master that holds it)
    @property
    def offset(self) -> _Offset:
        """The offset's bounds for the last budget or gate asked about (its tag's master)."""
        return self.offset_of(self._name)

    def offset_of(self, name: str) -> _Offset:
        """Bounds of (Redis time - loop time) on the master that holds `name` (none yet: infinite)."""
        return self.offsets.get(self.group(name)) or _Offset()

    def _note(self, name: str, redis_us: int, t0: float, t1: float) -> None:
        at = redis_us / 1_000_000
        sample = (t1, at - t1, at - t0)
        key = self.group(name)
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=32)
        samples.append(sample)
        lo = max(s[1] for s in samples)
        hi = min(s[2] for s in samples)
        if lo > hi:  # a clock stepped: start again from this round trip
            samples.clear()
            samples.append(sample)
            lo, hi = sample[1], sample[2]
        self.offsets[key] = _Offset(lo, hi)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            if cancel_lost(exc):
                raise asyncio.CancelledError from exc
            if is_store_failure(exc):
                raise unavailable(exc) from None
            raise

    async def _ensure_offset(self, name: str) -> _Offset:
        """Bounds of the clocks' offset for `name`'s master, before a first use: a second round
        trip when the first was slow (it connects: to every master of a cluster), so the first
        grants' margin stays small."""
        if self.offset_of(name).width == float("inf"):
            await self._time_sample(name)
            if self.offset_of(name).width > 0.02:
                await self._time_sample(name)
        return self.offset_of(name)

    async def _time_sample(self, name: str) -> None:
        """Redis's time, from the master that holds `name` (the clock its grants use; any node
        before a name is known)."""
        t0 = self._clock()
        if name:
            self._tags.setdefault(self.group(name), name)
            sec, usec = await self._call(self._time, keys=[self.epoch_key(name)])
        else:
            sec, usec = await self._call(self.client.time)
        self._note(name, int(sec) * 1_000_000 + int(usec), t0, self._clock())

    # -- budgets: every Redis key name is made here, from `budget_key`; every key of one group
    # (a target host, or a group of keys at it) carries one hash tag (`tag`), so each script call touches
    # one slot of a Redis Cluster (on one server the tags change nothing).
    def budget_key(self, budget: str) -> str:
        """The prefix of a budget's keys: `<ns>:{h:<group>}:b:<key>` for a name `<group>/<key>`.

        A script that spends several budgets at once (a key's and its host's)
        passes each one's keys in KEYS: the names share the `<group>/` part
        (the member names them so, `ClusterMember.store_name`), so the keys
        share a slot."""
        return budget_prefix(self.ns, budget)

    def meta_key(self, budget: str) -> str:
        """A budget's hash: its last slot granted and its grant sequence."""
        return f"{self.budget_key(budget)}:m"

    def policy_key(self, budget: str, policy: Policy) -> str:
        """One policy's count: named by its kind and window (not its limit, which members learn),
        so members that know different policies of a key share the ones they have in common."""
        return f"{self.budget_key(budget)}:{_kind(policy)}{_us(policy.window_s)}"

    async def lease(
        self,
        asks: Sequence[Ask],
        count: int,
        headroom_s: float,
        slack_s: float,
        pace_s: float,
        spacing: float,
        horizon_s: float,
        hold_s: float,
    ) -> Grant:
        name = self._name = asks[0].budget if asks else self._name
        u = (await self._ensure_offset(name)).width
        h_us = _us(headroom_s + slack_s + u)
        head_us = _us(headroom_s)
        args: list[Any] = [
            count,
            h_us,
            _us(pace_s),
            repr(float(spacing)),
            _us(horizon_s),
            _us(hold_s),
            len(asks),
        ]
        keys = [self.epoch_key(name)]
        for ask in asks:
            keys.append(self.meta_key(ask.budget))
            args += [max(0, int(ask.cost)), len(ask.policies)]
            for p in ask.policies:
                keys.append(self.policy_key(ask.budget, p))
                args += _policy_args(p)
        t0 = self._clock()
        out = await self._call(self._grant, keys=keys, args=args)
        t1 = self._clock()
        now_us, status, fresh, next_us = (int(x) for x in out[:4])
        self._note(name, now_us, t0, t1)
        lo = self.offset_of(name).lo
        if status == 0:
            which = asks[int(out[5]) - 1].budget if len(out) > 5 and 0 < int(out[5]) <= len(asks) else "?"
            # a config bug: loud (the budget named by its fingerprint)
            raise StoreUnavailable(f"a request costs more than budget {which}'s limit allows")
        per = 1 + len(asks)
        rows = [out[i : i + per] for i in range(6, len(out), per)]
        self.last_grant_us = tuple(int(r[0]) for r in rows)
        tickets = tuple(
            _Ticket(
                int(r[0]),
                h_us,
                head_us,
                {a.budget: (int(seq), a) for a, seq in zip(asks, r[1:], strict=True)},
            )
            for r in rows
        )
        # + 1 us: a worker may take a lease up to LEASE_EARLY_S (1 us) before its time
        times = tuple(t / 1_000_000 - lo + 1e-6 for t in self.last_grant_us)
        retry_at = None if times else next_us / 1_000_000 - lo - horizon_s
        return Grant(
            times,
            usable_s=slack_s,
            retry_at=retry_at,
            fresh=bool(fresh),
            epoch=f"{self.group(name)}={_text(out[4])}",
            tickets=tickets,
        )

    async def sent(self, sends: Sequence[tuple[Any, float]]) -> None:
        """Each sliding window counts a granted send from its real time on: the end of its
        counting interval moves back from `at + W + h + slack + u` (the latest send its grant
        allowed) to `T + W + h`, `T` the send's loop time plus the offset's upper bound (on
        Redis's clock the send was no later: the bounds of the master that granted it). One
        script call (on a cluster one per hash tag, in one pipeline); fixed windows and buckets
        keep what they were granted."""
        by_tag: dict[str, list[tuple[str, str, int]]] = {}
        for ticket, at in sends:
            if not isinstance(ticket, _Ticket):
                continue
            for budget, (seq, ask) in ticket.seqs.items():
                hi = self.offset_of(budget).hi
                if hi == float("inf"):
                    continue
                upper = _us(at + hi)
                for p in ask.policies:
                    if p.kind is not PolicyKind.SLIDING:
                        continue
                    window = _us(p.window_s)
                    end = upper + window + ticket.head_us
                    if end >= ticket.at_us + window + ticket.h_us:
                        continue  # sent too late to count less than granted
                    rows = by_tag.setdefault(self.group(budget), [])
                    rows.append((self.policy_key(budget, p), f"{seq}:{max(0, int(ask.cost))}", end))

        calls = []
        for rows in by_tag.values():
            keys: dict[str, int] = {}
            args: list[Any] = []
            for key, member, end in rows:
                args += [keys.setdefault(key, len(keys) + 1), member, end]
            calls.append((list(keys), args))
        await self._scripts(self._trim, calls)

    async def _scripts(self, script: _Script, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """`script` once per (KEYS, ARGV) of `calls` (one hash tag each: a slot), in one pipeline: a
        round trip (on a cluster one per master, all at once). Sent whole (`EVAL`: a cluster's
        client takes no `EVALSHA` in a pipeline; Redis compiles it once), so no master is asked
        for a script it does not know; a short one (`TRIM`)."""
        if len(calls) <= 1:
            return [await self._call(script, keys=k, args=a) for k, a in calls]
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.eval(script.text, len(keys), *keys, *args)
        return list(await self._call(pipe.execute))

    async def give_back(self, ticket: Any, budget: str, units: int) -> None:
        if not isinstance(ticket, _Ticket) or budget not in ticket.seqs or units <= 0:
            return
        seq, ask = ticket.seqs[budget]
        keys = [self.policy_key(budget, p) for p in ask.policies]
        args: list[Any] = [seq, max(0, int(ask.cost)), int(units), ticket.at_us, ticket.h_us]
        for p in ask.policies:
            args += _policy_args(p)
        await self._call(self._refund, keys=keys, args=args)

    async def sync(self, budget: str, policy: Policy, counted: int, at: float, until: float | None) -> None:
        self._name = self._name or budget
        lo = (await self._ensure_offset(budget)).lo
        until_us = _us(until + lo) if until is not None else 0  # the earlier end: never longer
        await self._call(
            self._sync,
            keys=[self.policy_key(budget, policy)],
            args=[*_policy_args(policy), max(0, int(counted)), until_us, _us(at + lo)],
        )

    def epoch_key(self, name: str) -> str:
        """The epoch of the store that holds `name` (each master of a cluster has its own: a master
        restarted empty is a new epoch for the tags it holds, not for the others; one server has
        one per host)."""
        return f"{self.ns}:{{{self.group(name)}}}:epoch"

    # -- gates
    def gate_key(self, gate: str) -> str:
        return f"{self.ns}:{{{tag(gate)}}}:g:{_leaf(gate)}"

    async def close_gate(self, gate: str, until: float, reason: str) -> None:
        self._name = self._name or gate
        hi = (await self._ensure_offset(gate)).hi
        until_us = _us(until + hi)  # the later end of what `until` may be on Redis's clock
        await self._call(self._close_gate, keys=[self.gate_key(gate)], args=[until_us, reason[:120]])

    async def poll(self, gates: Sequence[str]) -> Poll:
        """The gates and the epochs of every group (`group`: on a cluster the host's tag, and each
        key's when the keys have their own), in one round trip (on a cluster one per master, all
        at once), as `<group>=<epoch>` joined by `|`; a group whose epoch is missing (nothing
        granted there yet, or its master lost its state) as `<group>=`."""
        by_tag: dict[str, list[str]] = {}
        for g in gates:
            by_tag.setdefault(self.group(g), []).append(g)
        if not by_tag:
            return Poll({}, None)
        self._name = self._name or gates[0]
        for names in by_tag.values():
            await self._ensure_offset(names[0])
        # per group its epoch, then its gates: one MGET (several groups: a script each, all in one
        # pipeline; a cluster's client takes no MGET in a pipeline)
        keys_of = [[self.epoch_key(names[0]), *map(self.gate_key, names)] for names in by_tag.values()]
        if len(keys_of) == 1:
            answers = [await self._call(self.client.mget, keys_of[0])]
        else:
            answers = await self._scripts(self._read, [(keys, []) for keys in keys_of])
        found = {}
        epochs = []
        for (group, names), values in zip(by_tag.items(), answers, strict=True):
            epochs.append(f"{group}={_text(values[0]) if values[0] is not None else ''}")
            for gate, raw in zip(names, values[1:], strict=True):
                if raw is None:
                    continue
                head, _, reason = _text(raw).partition(" ")
                if head.isdigit():
                    found[gate] = (int(head) / 1_000_000 - self.offset_of(gate).lo, reason)
        return Poll(found, "|".join(epochs))

    # -- members
    def members_key(self) -> str:
        return work_key(self.ns, "members")

    async def publish(self, member: str, summary: dict[str, Any], ttl_s: float) -> None:
        body = json.dumps(summary, separators=(",", ":"))
        expires_ms = int((time.time() + ttl_s) * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(work_key(self.ns, f"member:{member}"), body, px=int(ttl_s * 1000))
        pipe.zadd(self.members_key(), {member: expires_ms})
        at = round(time.time(), 3)
        for row in summary.get("keys") or ():
            learned, budget = row.get("learned"), row.get("budget")
            if isinstance(learned, dict) and budget:
                key = learned_key(self.ns, str(budget))
                pipe.hset(key, member, json.dumps({**learned, "at": at}, separators=(",", ":")))
                pipe.pexpire(key, int(LEARNED_TTL_S * 1000))
        await self._call(pipe.execute)

    async def read_cluster(self) -> ClusterView:
        # Only our own host's learned state: another host's may live on a master that is down,
        # and a call there would stall this client's own calls while it finds its way back.
        tags = {host_tag(self._name)} if self._name else None  # None: before any call, every host's
        return cluster_view(await self._call(read_cluster, self.client, self.ns, tags))

    async def ping(self) -> None:
        """Every master that holds a budget or gate asked about answers (any node, before any):
        a member that comes back must reach all it polls, else its next poll fails again."""
        if not self._name:
            await self._call(self.client.ping)
        names = {self.group(self._name): self._name, **self._tags}
        for name in names.values():
            await self._time_sample(name)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.client.aclose(), COMMAND_TIMEOUT_S)
        except Exception:
            pass


async def read_cluster(
    client: Any, namespace: str = NAMESPACE, tags: set[str] | None = None
) -> dict[str, Any]:
    """The cluster as members last published it: `members` (their summaries) and the shared queues.

    A member whose summary expired (stopped, killed) is left out and
    forgotten. `queues` has the work streams' depths (`main` waiting,
    `claimed`, `uncertain`, `graveyard`) when a work store uses the namespace.
    `learned` has the keys' shared learned state: of the hosts in `tags` only
    (a member reads its own host's), every key's with None.
    """
    now_ms = int(time.time() * 1000)
    key = work_key(namespace, "members")
    await client.zremrangebyscore(key, "-inf", now_ms)
    ids = [m.decode() if isinstance(m, bytes) else m for m in await client.zrange(key, 0, -1)]
    members = []
    if ids:
        for raw in await client.mget([work_key(namespace, f"member:{m}") for m in ids]):
            try:
                summary = json.loads(raw) if raw is not None else None
            except ValueError:  # not a member's summary: left out, never a failure of the store
                continue
            if isinstance(summary, dict):
                members.append(summary)
    budgets = sorted(
        {
            str(k["budget"])
            for m in members
            for k in (m.get("keys") or ())
            if isinstance(k, dict)
            and k.get("budget")
            and (tags is None or host_tag(str(k["budget"])) in tags)
        }
    )
    learned: dict[str, dict[str, Any]] = {}
    if budgets:
        pipe = client.pipeline(transaction=False)
        for b in budgets:
            pipe.hgetall(learned_key(namespace, b))
        for b, raw in zip(budgets, await pipe.execute(), strict=True):
            docs = {}
            for who, body in (raw or {}).items():
                try:
                    doc = json.loads(body)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    docs[_text(who)] = doc
            if docs:
                learned[b] = docs
    return {"members": members, "queues": await queue_depths(client, namespace), "learned": learned}


async def queue_depths(client: Any, namespace: str = NAMESPACE) -> dict[str, int]:
    """The work streams' depths: `main` (waiting to be claimed), `claimed`, `uncertain`, `graveyard`."""
    pipe = client.pipeline(transaction=False)
    pipe.xlen(work_key(namespace, "main"))
    pipe.xlen(work_key(namespace, "uncertain"))
    pipe.xlen(work_key(namespace, "graveyard"))
    main, uncertain, graveyard = await pipe.execute()
    claimed = 0
    if main:
        try:
            claimed = int((await client.xpending(work_key(namespace, "main"), GROUP))["pending"])
        except Exception:  # no group yet
            claimed = 0
    return {
        "main": int(main) - claimed,
        "claimed": claimed,
        "uncertain": int(uncertain),
        "graveyard": int(graveyard),
    }


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _opt_int(value: Any) -> int | None:
    return None if value is None or isinstance(value, bool) else _int(value)


def cluster_view(view: dict[str, Any]) -> ClusterView:
    """`read_cluster`'s answer as the engine's plain `ClusterView` (members sorted by id)."""
    rows = []
    for m in view.get("members", ()):
        leases = m.get("leases") if isinstance(m.get("leases"), dict) else {}
        try:
            tps = float(m.get("current_tps") or 0.0)
        except (TypeError, ValueError):
            tps = 0.0
        rows.append(
            MemberRow(
                member=str(m.get("member", "?")),
                phase=str(m.get("phase", "")),
                current_tps=tps,
                sent=_int(m.get("sent")),
                succeeded=_int(m.get("succeeded")),
                rejected_429=_int(m.get("rejected_429")),
                main_depth=_int(m.get("main_depth")),
                dlq_depth=_int(m.get("dlq_depth")),
                in_flight=_int(m.get("in_flight")),
                leases_used=_int(leases.get("used")),
                leases_granted=_int(leases.get("granted")),
                store=str(m.get("store", "ok")),
            )
        )
    q = view.get("queues") or {}
    now = time.time()
    keys = []
    for budget, docs in sorted((view.get("learned") or {}).items()):
        newest = max(docs.items(), key=lambda kv: _float(kv[1].get("at")))
        with_est = [kv for kv in docs.items() if kv[1].get("estimate") is not None]
        est_who, est = max(with_est, key=lambda kv: _float(kv[1].get("moved_at"))) if with_est else ("", {})
        doc = newest[1]
        limit = _opt_int(est.get("estimate"))
        window = _float(est.get("window_s"))
        keys.append(
            SharedKeyRow(
                budget=budget,
                member=est_who or newest[0],
                age_s=round(max(0.0, now - _float(est.get("moved_at") if est else doc.get("at"))), 1),
                estimate=f"{limit}/{window:g}s" if limit is not None and window > 0 else "",
                estimate_limit=limit,
                reason=str(est.get("reason", ""))[:80],
                remaining=_opt_int(doc.get("remaining")),
                limit=_opt_int(doc.get("limit")),
                headroom_ms=_float(doc.get("headroom_ms")) if doc.get("headroom_ms") is not None else None,
            )
        )
    return ClusterView(
        members=tuple(sorted(rows, key=lambda r: r.member)),
        waiting=_int(q.get("main")),
        claimed=_int(q.get("claimed")),
        uncertain=_int(q.get("uncertain")),
        graveyard=_int(q.get("graveyard")),
        keys=tuple(keys),
    )


def format_cluster(view: dict[str, Any]) -> str:
    """`read_cluster`'s answer as a few lines of text (keys masked: members publish them masked)."""
    q = view["queues"]
    lines = [
        f"queues: {q['main']} waiting, {q['claimed']} claimed, {q['uncertain']} uncertain, "
        f"{q['graveyard']} in the graveyard; {len(view['members'])} members"
    ]
    for m in sorted(view["members"], key=lambda m: str(m.get("member"))):
        leases = m.get("leases") or {}
        lines.append(
            f"  {m.get('member')}: {m.get('phase')}, {m.get('current_tps', 0):g}/s now, "
            f"sent {m.get('sent')}, ok {m.get('succeeded')}, 429 {m.get('rejected_429')}, "
            f"queue {m.get('main_depth')}+{m.get('dlq_depth')}, store {m.get('store')}, "
            f"leases used {leases.get('used', 0)}/{leases.get('granted', 0)}"
        )
    for row in cluster_view(view).keys:
        lines.append(
            f"key {row.budget}: estimate {row.estimate or '-'} ({row.reason or '-'}, {row.member}), "
            f"server remaining {row.remaining if row.remaining is not None else '-'}"
            f"/{row.limit if row.limit is not None else '-'}, headroom {row.headroom_ms} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m ratedeck.store.redis_shared redis://host:port/db`: the cluster, once."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ratedeck.store.redis_shared redis://host:port/db", file=sys.stderr)
        return 2

    async def show() -> str:
        client = connect(args[0])
        try:
            return format_cluster(await read_cluster(client))
        finally:
            await client.aclose()

    try:
        print(asyncio.run(show()))
    except StoreError as exc:
        print(f"ratedeck: {safe_url(args[0]) or 'the URL'}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        print(f"ratedeck: {safe_url(args[0])}: Redis did not answer ({unavailable(exc)})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
