"""`RedisStore`: the work of many processes in Redis Streams, and what they share (`redis_shared`).

Work (keys under `<ns>:{q:<ns>}:`, `ns` = "ratedeck" by default: one hash tag, so
every transaction on the streams touches one slot of a Redis Cluster):

- `main`: a stream of pending jobs (fields `id`, `key`, `item` as JSON) with one
  consumer group, `ratedeck`; `claim` reads new entries for a member
  (`XREADGROUP ... >`), which makes them pending for it until `finish`
  acknowledges and deletes them;
- `graveyard`: a stream of the graveyard records `finish` journals;
- `uncertain`: a stream of jobs a dead member held that are not sent again
  (the target has no Idempotency-Key: sending again could do the work twice);
- `done`: a hash of counts per ending; `seq`: the last job id;
- `sending`: a set of the claimed jobs' ids a member marked before it may send
  them (`mark_sending`); `windows`: a hash of each key's last sends, by fingerprint.

Retries stay in each member's own dead-letter queue (its engine's): a job
is claimed once per member and acknowledged only when it ends.

A member that dies leaves its entries pending. A live member keeps its own
fresh (`XCLAIM ... JUSTID` every `claim_timeout_s / 3`), so an entry idle longer
than `claim_timeout_s` belongs to a dead one: a member that recovers (`--resume`,
`recover`) takes such entries with `XAUTOCLAIM` then and at every later claim,
and sends them again with the same Idempotency-Key, or moves them to
`uncertain` when the target has none; an entry it never marked sending was never
sent, and goes back to the main stream, pending as it was.

While Redis is unreachable `claim` waits for it (a member has no work to
take then, and stops only when told to); `finish` raises `StoreError` and the
journal tries again next tick.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ratedeck.core.secrets import safe_url
from ratedeck.engine.ports import StoreUnavailable

from .base import Finished, Job, StoreCounts, StoreError, WorkStore
from .redis_shared import (
    COMMAND_TIMEOUT_S,
    GROUP,
    NAMESPACE,
    RedisShared,
    cancel_lost,
    check_url,
    connect,
    is_store_failure,
    queue_depths,
    unavailable,
    work_key,
)

#: An entry pending this long without a refresh belongs to a dead member.
CLAIM_TIMEOUT_S = 30.0
#: While Redis is unreachable a claim asks again this often, for at most `CLAIM_PATIENCE_S`.
RETRY_S = 0.25
CLAIM_PATIENCE_S = 30.0


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


class RedisStore(WorkStore):
    """Jobs in Redis Streams, shared by every member that names the same server and namespace."""

    def __init__(self, url: str, *, namespace: str = NAMESPACE, claim_timeout_s: float = CLAIM_TIMEOUT_S):
        self.redis_url = check_url(url)
        self.url = safe_url(self.redis_url) or "redis"
        self.ns = namespace
        self.claim_timeout_s = claim_timeout_s
        self._client: Any = None
        self._held: dict[str, dict[int, bytes]] = {}  # member -> job id -> entry id
        self._reclaim: bool | None = None  # set by recover: retry (True) or make uncertain (False)
        self._reclaimed: list[Job] = []
        self._refresher: asyncio.Task[None] | None = None
        self._group_ready = False
        self._scanned = 0  # entries the last `_take_dead` took from dead members
        self._closing = False  # loops end by this, not only by a cancel (which a client may lose)
        self._epoch: str | None = None  # the work's epoch as this process first saw it
        self.lost_claims = 0
        self._lost_ids: set[int] = set()  # job ids held when the state was lost

    @classmethod
    def open(cls, url: str) -> RedisStore:
        return cls(url)

    def shared(self) -> RedisShared:
        """What members share besides work (budgets, gates, snapshots), on the same server and namespace."""
        return RedisShared(self.redis_url, namespace=self.ns)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.redis_url)
        return self._client

    def _k(self, name: str) -> str:
        return work_key(self.ns, name)

    async def _do(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            if cancel_lost(exc):
                raise asyncio.CancelledError from exc
            if is_store_failure(exc):
                raise StoreError(f"Redis did not answer ({unavailable(exc)})") from None
            raise

    async def _check_epoch(self) -> None:
        """Before a claim or a write: has the store lost its state since we claimed (the epoch, set
        once under the queue's tag, changed)? Then the jobs we hold are gone from it: counted as
        lost, forgotten, never acknowledged or finished against the new state (job ids start again)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._k("epoch"), uuid.uuid4().hex, nx=True)
        pipe.get(self._k("epoch"))
        _set, raw = await self._do(pipe.execute)
        epoch = _text(raw)
        if self._epoch is not None and epoch != self._epoch:
            self.lost_claims += sum(len(h) for h in self._held.values())
            self._lost_ids.update(j for h in self._held.values() for j in h)
            self._held.clear()
            self._reclaimed.clear()
            self._group_ready = False
        self._epoch = epoch

    async def persistence(self) -> str:
        """ "none" when a restart loses the work (`appendonly no` and `save ""` on the server, or on
        any master of a cluster), "snapshots" (`save` only), "appendonly"; "unknown" when the
        server refuses CONFIG (a managed service)."""
        from redis.exceptions import ResponseError

        kept = {"none": 0, "snapshots": 1, "appendonly": 2}
        try:
            if hasattr(self.client, "get_primaries"):  # a cluster: every master says
                await self._do(self.client.initialize)  # the masters, learnt from any node
                nodes = self.client.get_primaries()
                aof = await self._do(self.client.config_get, "appendonly", target_nodes=nodes)
                save = await self._do(self.client.config_get, "save", target_nodes=nodes)
                answers = [(aof[n.name], save[n.name]) for n in nodes]
            else:
                answers = [
                    (
                        await self._do(self.client.config_get, "appendonly"),
                        await self._do(self.client.config_get, "save"),
                    )
                ]
        except (StoreError, ResponseError):
            return "unknown"
        if not answers:
            return "unknown"
        worst = "appendonly"
        for aof, save in answers:
            this = (
                "appendonly"
                if _text(aof.get("appendonly", "")) == "yes"
                else ("snapshots" if _text(save.get("save", "")).strip() else "none")
            )
            worst = min(worst, this, key=kept.__getitem__)
        return worst

    async def check(self) -> None:
        """Reach the server now: `StoreError` (one line) when it does not answer."""
        await self._do(self.client.ping)

    async def _group(self) -> None:
        if self._group_ready:
            return
        from redis.exceptions import ResponseError

        try:
            await self._do(self.client.xgroup_create, self._k("main"), GROUP, id="0", mkstream=True)
        except ResponseError as exc:  # pragma: no cover - the group exists: fine
            if "BUSYGROUP" not in str(exc):
                raise
        except StoreError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    # -- work in
    async def enqueue(self, items: Sequence[Mapping[str, Any]]) -> int:
        if not items:
            return 0
        await self._group()
        last = int(await self._do(self.client.incrby, self._k("seq"), len(items)))
        first = last - len(items) + 1
        pipe = self.client.pipeline(transaction=True)  # all or none
        for i, item in enumerate(items):
            pipe.xadd(
                self._k("main"),
                {"id": first + i, "key": uuid.uuid4().hex, "item": json.dumps(dict(item)), "attempts": 0},
            )
        await self._do(pipe.execute)
        return len(items)

    # -- work out
    def _job(self, member: str, entry_id: bytes, fields: Mapping[bytes, bytes], uncertain: bool) -> Job:
        job_id = int(fields[b"id"])
        self._held.setdefault(member, {})[job_id] = entry_id
        return Job(
            job_id,
            json.loads(fields[b"item"]),
            _text(fields[b"key"]),
            attempts=int(fields.get(b"attempts", b"0")),
            uncertain=uncertain or fields.get(b"uncertain") == b"1",
        )

    async def claim(self, member: str, n: int) -> list[Job]:
        """Up to `n` jobs; while Redis is unreachable it waits (no work can be taken then), up to
        `CLAIM_PATIENCE_S`, then raises `StoreError` (a stop awaits a claim under way)."""
        give_up = time.monotonic() + CLAIM_PATIENCE_S
        while True:
            try:
                return await self._claim(member, n)
            except StoreError:
                if time.monotonic() > give_up or self._closing:
                    raise
                await asyncio.sleep(RETRY_S)

    async def _claim(self, member: str, n: int) -> list[Job]:
        await self._check_epoch()
        await self._group()
        self._start_refresher()
        jobs = self._reclaimed[:n]
        del self._reclaimed[: len(jobs)]
        if self._reclaim is not None and len(jobs) < n:
            jobs += await self._take_dead(member, n - len(jobs))
        if len(jobs) < n:
            reply = await self._do(
                self.client.xreadgroup, GROUP, member, {self._k("main"): ">"}, count=n - len(jobs)
            )
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    jobs.append(self._job(member, entry_id, fields, uncertain=False))
        return jobs

    async def _take_dead(self, member: str, n: int) -> list[Job]:
        """Entries idle past the claim timeout (their member died): ours to send again, or uncertain."""
        idle_ms = int(self.claim_timeout_s * 1000)
        reply = await self._do(
            self.client.xautoclaim, self._k("main"), GROUP, member, idle_ms, start_id="0-0", count=n
        )
        entries = [(eid, f) for eid, f in reply[1] if f]  # a deleted entry comes back empty
        self._scanned = len(entries)
        if not entries:
            return []
        marked = await self._do(self.client.smismember, self._k("sending"), [f[b"id"] for _e, f in entries])
        sent = [(eid, f) for (eid, f), m in zip(entries, marked, strict=True) if m]
        sent_ids = {eid for eid, _f in sent}
        pipe = self.client.pipeline(transaction=True)
        for eid, fields in entries:
            if eid not in sent_ids:  # never marked: never sent; pending again, as it was
                pipe.xadd(self._k("main"), fields)
                pipe.xack(self._k("main"), GROUP, eid)
                pipe.xdel(self._k("main"), eid)
        if self._reclaim:
            await self._do(pipe.execute)
            return [self._job(member, eid, fields, uncertain=True) for eid, fields in sent]
        for eid, fields in sent:
            pipe.xadd(self._k("uncertain"), {**fields, b"at": str(time.time())})
            pipe.xack(self._k("main"), GROUP, eid)
            pipe.xdel(self._k("main"), eid)
            pipe.srem(self._k("sending"), fields[b"id"])
        await self._do(pipe.execute)
        return []

    def _start_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh(), name="store-refresh")

    async def _refresh(self) -> None:
        """Keep this process's pending entries fresh, so nobody takes them for a dead member's."""
        while not self._closing:
            await asyncio.sleep(self.claim_timeout_s / 3)
            for member, held in list(self._held.items()):
                ids = list(held.values())
                for i in range(0, len(ids), 500):
                    try:
                        await self._do(
                            self.client.xclaim,
                            self._k("main"),
                            GROUP,
                            member,
                            0,
                            ids[i : i + 500],
                            justid=True,
                        )
                    except StoreError:
                        break  # tried again next round

    async def finish(self, member: str, endings: Sequence[Finished]) -> None:
        if not endings:
            return
        await self._check_epoch()
        held = self._held.get(member, {})
        # a lost state took the jobs held before it: never written against the new one
        endings = [f for f in endings if f.job_id in held or f.job_id not in self._lost_ids]
        if not endings:
            return
        pipe = self.client.pipeline(transaction=True)
        ids = [held[f.job_id] for f in endings if f.job_id in held]
        if ids:
            pipe.xack(self._k("main"), GROUP, *ids)
            pipe.xdel(self._k("main"), *ids)
        pipe.srem(self._k("sending"), *[f.job_id for f in endings])
        by_ending: dict[str, int] = {}
        for f in endings:
            by_ending[str(f.ending)] = by_ending.get(str(f.ending), 0) + 1
        for ending, n in by_ending.items():
            pipe.hincrby(self._k("done"), ending, n)
        for f in endings:
            if f.record is not None:
                pipe.xadd(self._k("graveyard"), {"job": f.job_id, "record": json.dumps(dict(f.record))})
        await self._do(pipe.execute)
        for f in endings:
            held.pop(f.job_id, None)

    async def release(self, member: str, job_ids: Sequence[int]) -> None:
        held = self._held.get(member, {})
        ids = [held[j] for j in job_ids if j in held]
        if not ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for eid in ids:
            pipe.xrange(self._k("main"), eid, eid)
        found = await self._do(pipe.execute)
        pipe = self.client.pipeline(transaction=True)
        for eid, rows in zip(ids, found, strict=True):
            for _eid, fields in rows:
                pipe.xadd(self._k("main"), fields)  # pending again, at the end
            pipe.xack(self._k("main"), GROUP, eid)
            pipe.xdel(self._k("main"), eid)
        pipe.srem(self._k("sending"), *[j for j in job_ids if j in held])
        await self._do(pipe.execute)
        gone = set(ids)
        for j in [j for j, eid in held.items() if eid in gone]:
            del held[j]

    async def recover(self, member: str, *, retry: bool) -> int:
        """Take every entry a dead member holds (idle past the claim timeout), now and at every claim."""
        await self._group()
        self._reclaim = retry
        total = 0
        while True:
            if retry:
                jobs = await self._take_dead(member, 500)
                self._reclaimed += jobs
                taken = len(jobs)
            else:
                before = int(await self._do(self.client.xlen, self._k("uncertain")))
                await self._take_dead(member, 500)
                taken = int(await self._do(self.client.xlen, self._k("uncertain"))) - before
            total += taken
            if self._scanned < 500:
                return total

    async def mark_sending(self, member: str, job_ids: Sequence[int]) -> None:
        if job_ids:
            await self._do(self.client.sadd, self._k("sending"), *job_ids)

    async def save_windows(self, member: str, windows: Mapping[str, Sequence[float]]) -> None:
        if windows:
            now = time.time()
            mapping = {k: json.dumps([now, [round(t, 4) for t in v]]) for k, v in windows.items()}
            await self._do(self.client.hset, self._k("windows"), mapping=mapping)

    async def load_windows(self) -> dict[str, tuple[float, list[float]]]:
        rows = await self._do(self.client.hgetall, self._k("windows"))
        out: dict[str, tuple[float, list[float]]] = {}
        for k, v in rows.items():
            at, times = json.loads(v)
            out[_text(k)] = (float(at), [float(t) for t in times])
        return out

    async def counts(self) -> StoreCounts:
        depths = await self._do(queue_depths, self.client, self.ns)
        done = await self._do(self.client.hgetall, self._k("done"))
        return StoreCounts(
            pending=depths["main"],
            claimed=depths["claimed"],
            uncertain=depths["uncertain"],
            done={_text(k): int(v) for k, v in done.items()},
        )

    async def graveyard_lines(self) -> list[dict[str, Any]]:
        rows = await self._do(self.client.xrange, self._k("graveyard"), "-", "+")
        return [json.loads(fields[b"record"]) for _eid, fields in rows]

    async def close(self) -> None:
        self._closing = True
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.wait([self._refresher], timeout=COMMAND_TIMEOUT_S)
            self._refresher = None
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await asyncio.wait_for(client.aclose(), COMMAND_TIMEOUT_S)
            except Exception:
                pass


__all__ = ["RedisShared", "RedisStore", "StoreUnavailable", "queue_depths"]
