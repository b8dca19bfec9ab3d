"""The engine's side of a shared store (`engine/cluster/member.py`) on virtual time, with a store in memory.

`FakeShared` grants every `gap` seconds from its own record, like the Redis
script does for one policy, and can fail or lose its state on demand: the
member must send only at granted times, stop without a store, drop leases
of an old epoch and ask for a hold when it had been sending.
"""

from __future__ import annotations

import asyncio

from ratedeck.config import load_config
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import KeyState
from ratedeck.engine.cluster.member import Grant, Poll, StoreUnavailable
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import study_settings
from ratedeck.server.simulated import SimulatedTransport, run_virtual
from ratedeck.store.redis_shared import cluster_view


class FakeShared:
    """One budget per key name: slots `gap` apart, never more than `horizon` ahead."""

    shown = "fake"

    def __init__(self, gap: float = 0.05, delay: float = 0.0):
        self.gap = gap
        self.delay = delay  # a grant's round trip
        self.clock = asyncio.get_event_loop_policy  # replaced by bind
        self.last: dict[str, float] = {}
        self.granted: dict[str, list[float]] = {}
        self.holds: list[float] = []
        self.down = False
        self.epoch = "e1"
        self.gates: dict[str, tuple[float, str]] = {}
        self.calls = 0
        self.summaries: dict[str, dict] = {}
        self.reads = 0
        self.sends = 0  # sends told (`sent`)

    def bind(self, clock):
        self.clock = clock

    def _check(self):
        self.calls += 1
        if self.down:
            raise StoreUnavailable("ConnectionError: refused")

    async def lease(self, asks, count, headroom_s, slack_s, pace_s, spacing, horizon_s, hold_s):
        self._check()
        if self.delay:
            await asyncio.sleep(self.delay)
        budget = asks[0].budget  # the study preset: each key's own limits only
        now = self.clock()
        fresh = budget not in self.last
        if fresh:
            self.holds.append(hold_s)
            self.last[budget] = now + hold_s - self.gap
        times = []
        s = max(now, self.last[budget] + self.gap)
        while len(times) < count and s <= now + horizon_s:
            times.append(s)
            s += self.gap
        if times:
            self.last[budget] = times[-1]
            self.granted.setdefault(budget, []).extend(times)
        # the leases carry a microsecond of margin, as RedisShared's do (LEASE_EARLY_S)
        leases = tuple(t + 1e-6 for t in times)
        return Grant(
            leases, slack_s, None if times else s - horizon_s, fresh, self.epoch, tickets=tuple(times)
        )

    async def give_back(self, ticket, budget, units):
        self._check()

    async def sync(self, budget, policy, counted, at, until):
        self._check()

    async def sent(self, sends):
        self._check()
        self.sends += len(sends)

    async def close_gate(self, gate, until, reason):
        self._check()
        self.gates[gate] = (until, reason)

    async def poll(self, gates):
        self._check()
        return Poll({g: v for g, v in self.gates.items() if g in gates}, self.epoch)

    async def publish(self, member, summary, ttl_s):
        self._check()
        self.summaries[member] = summary

    async def read_cluster(self):
        self._check()
        self.reads += 1
        return cluster_view({"members": list(self.summaries.values()), "queues": {"main": 7, "claimed": 2}})

    async def ping(self):
        self._check()

    async def close(self):
        pass

    def lose_state(self):
        self.last.clear()
        self.epoch = "e2"


def record_asks(shared: FakeShared) -> set[str]:
    """The budget names `shared` is asked to grant (filled as the grants are asked)."""
    asked: set[str] = set()
    lease = shared.lease

    async def recording(asks, *args):
        asked.update(a.budget for a in asks)
        return await lease(asks, *args)

    shared.lease = recording  # type: ignore[method-assign]
    return asked


def _engine(shared: FakeShared) -> Engine:
    cfg = load_config(
        preset="study",
        overrides={"engine": {"graveyard_path": ""}, "workload": {"rate": 200.0}, "run": {"seed": 3}},
    )
    return Engine(cfg, SimulatedTransport(study_settings()), shared_state=shared)


def _in_store(engine: Engine, label: str) -> str:
    """Key `label`'s budget (and gate) as the store is asked it (`ClusterMember.store_name`)."""
    cluster = engine.parts.cluster
    return cluster.store_name(cluster.budget_ids[label])


def _sends_by_key(engine: Engine) -> dict[str, int]:
    return {w.label: w.sent for w in engine.parts.keys.workers}


def test_a_member_sends_only_at_granted_times_and_stops_without_the_store():
    shared = FakeShared(gap=0.06)  # slower than the keys' own 20/s: the grants bind

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(3.0)
        sent = _sends_by_key(engine)
        # each key sent about what was granted, never more (3 s / 0.06 s = 50 per key)
        for w in engine.parts.keys.workers:
            granted = shared.granted[_in_store(engine, w.label)]
            assert w.sent <= len(granted) and w.sent >= 40, (w.label, w.sent, len(granted))
        # every send is told to the store within a poll (0.1 s: at most about 20 not yet)
        assert sum(sent.values()) - 20 <= shared.sends <= sum(sent.values())
        shared.down = True
        await asyncio.sleep(0.5)  # held leases may go (they were granted); then nothing
        assert engine.parts.cluster.down_since is not None
        held = _sends_by_key(engine)
        await asyncio.sleep(2.0)
        assert _sends_by_key(engine) == held
        snap = engine.snapshot()
        assert all(k.state is KeyState.COOLING for k in snap.keys)
        assert [g.reason for g in snap.gates if g.name == "store"] == ["store unreachable"]
        shared.down = False
        await asyncio.sleep(0.6)  # a ping (0.25 s) and a grant
        assert all(
            after > before
            for after, before in zip(_sends_by_key(engine).values(), held.values(), strict=True)
        )
        await engine.stop()
        return sent

    run_virtual(main())


def test_a_lost_state_drops_old_leases_and_the_first_grant_holds():
    shared = FakeShared(gap=0.05)

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(2.0)
        assert shared.holds and max(shared.holds) == 0.0  # a cold start waits for nothing
        lost_at = engine.parts.run.clock()
        before = {b: len(times) for b, times in shared.granted.items()}
        shared.lose_state()
        await asyncio.sleep(0.2)  # the next poll sees the new epoch
        assert all(len(w.leases) == 0 or w.leases.times[0][0] >= lost_at for w in engine.parts.keys.workers)
        events = [e.text for e in engine.snapshot().events]
        assert any("started afresh" in t for t in events)
        await asyncio.sleep(3.0)
        await engine.stop()
        # the members had been sending: each budget's first grant after the loss waited
        # out the window (1 s) + headroom + slack + the epoch's confirmation time
        later = shared.holds[5:]
        assert (
            len(later) == 5
            and min(later) >= 1.0 + engine.parts.cluster.slack_s + engine.parts.cluster.confirm_s
        )
        for w in engine.parts.keys.workers:
            budget = _in_store(engine, w.label)
            after = shared.granted[budget][before[budget] :]  # granted after the loss
            assert after and after[0] >= lost_at + min(later) - 1e-6

    run_virtual(main())


def test_a_shared_gate_closes_ours_and_ours_is_shared():
    shared = FakeShared()

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(1.0)
        now = engine.parts.run.clock()
        name = _in_store(engine, "k2")  # the key's gate: named as its budget
        shared.gates[name] = (now + 2.0, "Retry-After 2s")  # another member's
        await asyncio.sleep(0.15)
        assert engine.parts.limits.gates["k2"].open_at >= now + 2.0 - 1e-6
        k2 = engine.parts.keys.by_label["k2"]
        before = k2.sent
        await asyncio.sleep(1.5)
        assert k2.sent == before  # stopped by another member's Retry-After
        gate = engine.parts.limits.gates["k3"]
        gate.close(engine.parts.run.clock() + 1.0, "Retry-After 1s", engine.parts.run.clock())
        engine.parts.cluster.gate_closed(gate, "Retry-After 1s")
        await asyncio.sleep(0.05)
        assert _in_store(engine, "k3") in shared.gates
        await engine.stop()

    run_virtual(main())


def test_budget_names_are_fingerprints_not_keys():
    from ratedeck.engine.cluster.member import budget_name, gate_names

    secret = "sk_live_abcdefghijklmnop"
    name = budget_name("https://api.example.com/v1/x", secret)
    host, _, key = name.partition("/")
    assert len(host) == len(key) == 16 and secret not in name and "abcd" not in name
    assert name == budget_name("https://api.example.com/v2/other", secret)  # same host: one budget
    assert name != budget_name("https://other.example.com/v1/x", secret)
    assert name != budget_name("https://api.example.com/v1/x", secret + "x")
    names = gate_names("https://api.example.com/v1/x", {"k1": secret})
    assert names["k1"] == name and names["host"] == f"{host}/host" and secret not in str(names)
    assert Policy(1, 1.0)  # (the policy type the lease takes)


def test_the_cluster_view_is_read_at_most_once_a_second_and_shown_in_the_snapshot():
    shared = FakeShared()

    async def main():
        engine = _engine(shared)
        assert engine.snapshot().cluster is None  # nothing read yet
        engine.start()
        await asyncio.sleep(5.05)
        reads = shared.reads
        snap = engine.snapshot()
        view = snap.cluster
        assert view is not None
        assert [m.member for m in view.members] == [engine.parts.cluster.member]
        me = view.members[0]
        assert me.sent > 0 and me.phase == "running" and me.store == "ok"
        assert me.leases_granted >= me.leases_used > 0
        assert (view.waiting, view.claimed, view.uncertain, view.graveyard) == (7, 2, 0, 0)
        assert 4.0 <= view.read_at_s <= 5.05
        shared.down = True
        await asyncio.sleep(1.5)
        assert engine.snapshot().cluster == view  # the last view is kept while the store is away
        await engine.stop()
        return reads

    reads = run_virtual(main())
    assert 5 <= reads <= 6  # once a second over 5 s (the first at the start), not at every 0.1 s poll


def test_a_poll_loop_killed_by_an_unexpected_error_is_told_and_starts_again():
    """A client's bug (not a store failure) ends the poll loop: told once as a problem, and the
    loop starts again, so a member that went down still comes back when the store does."""
    shared = FakeShared(gap=0.05)
    broken = {"polls": 2}
    poll = shared.poll

    async def flaky_poll(gates):
        if broken["polls"] > 0:
            broken["polls"] -= 1
            raise RuntimeError("a bug in the client")
        return await poll(gates)

    shared.poll = flaky_poll

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(1.5)
        assert broken["polls"] == 0  # both failures met, each ending the loop
        assert engine.parts.ends.problems == ["cluster: RuntimeError: a bug in the client"]  # told once
        shared.down = True
        await asyncio.sleep(1.0)
        assert engine.parts.cluster.down_since is not None
        held = sum(_sends_by_key(engine).values())
        shared.down = False
        await asyncio.sleep(1.0)
        assert engine.parts.cluster.down_since is None and sum(_sends_by_key(engine).values()) > held + 20
        await engine.stop()

    run_virtual(main())


def test_a_request_costs_one_lease_however_many_keys_look_at_it(tmp_path):
    # A token budget makes each request's plan its own (its cost), leased one slot at a time.
    # Requests arrive one by one (as a gateway's do) and each wakes a key while others wait on
    # a grant's round trip; every key sees the same head of the queue. Only the key that asked
    # the store for its slot may send it; the others lease for the requests behind it. Were two
    # keys to lease one request, the one that did not send it would hold a slot nobody uses
    # (the gateway on a redis store reached half its capacity that way).
    lines = tmp_path / "prompts.jsonl"
    lines.write_text(
        "".join(
            f'{{"_body": {{"messages": [{{"role": "user", "content": "{"x" * (40 + 7 * i)}"}}], "max_tokens": 20}}}}\n'
            for i in range(120)
        )
    )
    cfg = load_config(
        preset="study",
        overrides={
            "engine": {"graveyard_path": ""},
            "workload": {"file": str(lines), "rate": 40.0},
            "budgets": [{"name": "tokens", "scope": "key", "unit": "tokens", "limits": ["100000/1s"]}],
            "run": {"seed": 3},
        },
    )
    shared = FakeShared(gap=0.02, delay=0.01)  # a grant takes a round trip

    async def main():
        engine = Engine(cfg, SimulatedTransport(study_settings()), shared_state=shared)
        await engine.run()
        return engine

    engine = run_virtual(main())
    granted, used, _dropped = engine.parts.cluster.lease_totals()
    assert engine.snapshot().succeeded == 120
    assert sum(1 for w in engine.parts.keys.workers if w.sent) >= 2  # the keys shared the work
    assert used == 120 and granted - used <= 1, (granted, used)


def test_each_model_of_a_key_is_its_own_budget_in_the_store(tmp_path):
    # Limits per key and model (the OpenAI preset): every member that uses a key must spend one
    # store budget per model, or two gateways would each think they had the model's whole bucket.
    from ratedeck.engine.cluster.member import budget_name
    from ratedeck.engine.request import Request, Shape
    from tests.engine.test_models import ModelServer

    lines = tmp_path / "prompts.jsonl"
    lines.write_text(
        "".join(
            f'{{"_path": "/v1/chat/completions", "_body": {{"model": "gpt-{"ab"[i % 2]}", '
            f'"messages": [{{"role": "user", "content": "hi {i}"}}], "max_tokens": 5}}}}\n'
            for i in range(40)
        )
    )
    url, secrets = "http://127.0.0.1:9", ["sk-one-0000000000000001", "sk-two-0000000000000002"]
    cfg = load_config(
        preset="openai",
        overrides={
            "target": {"url": url},
            "keys": {"secrets": secrets},
            "engine": {"graveyard_path": "", "learn_first": False},
            "workload": {"file": str(lines)},
        },
    )
    shared = FakeShared(gap=0.01)
    asked = record_asks(shared)

    async def main():
        engine = Engine(
            cfg, ModelServer({"gpt-a": (500, 30_000), "gpt-b": (500, 30_000)}), shared_state=shared
        )
        # Each lane's limiters are named in the store as they are made, before any send.
        for w in engine.parts.keys.workers:
            req = Request(0, 0.0, 1.0)
            req.shape = Shape(body={"model": "gpt-a"})
            lane = w.limits.lanes.lane(req)
            names = w.limits.leases.store_names
            assert [names.get(lim) for _, lim in lane.buckets()] == [
                budget_name(url, w.spec.secret, f"{unit}\0model\0gpt-a") for unit, _ in lane.buckets()
            ]
        await engine.run(30)  # virtual seconds: a bound (the job takes under one)
        return engine

    engine = run_virtual(main())
    snap = engine.snapshot()
    assert snap.succeeded == 40, [e.text for e in snap.events]
    for secret in secrets:
        for model in ("gpt-a", "gpt-b"):
            for unit in ("requests", "tokens"):
                name = engine.parts.cluster.store_name(budget_name(url, secret, f"{unit}\0model\0{model}"))
                assert name in asked, (unit, model)


class TwoHosts(FakeShared):
    """A store whose budgets sit under two hosts (a pool's endpoints): a grant says its host's
    epoch, a poll every host's, as RedisShared does (`host=epoch`, joined by `|`)."""

    async def lease(self, *args, **kwargs):
        grant = await super().lease(*args, **kwargs)
        return Grant(
            grant.times, grant.usable_s, grant.retry_at, grant.fresh, f"h:a={self.epoch}", grant.tickets
        )

    async def poll(self, gates):
        polled = await super().poll(gates)
        return Poll(polled.gates, f"h:a={self.epoch}|h:b={self.epoch}")


def test_leases_of_one_host_outlive_polls_that_read_every_hosts_epoch():
    # Grants 0.5 s apart lie further ahead than confirm_s (0.3 s): a poll must confirm them. It
    # used to compare its "a|b" with the grant's "a", take that for a lost store and drop them
    # all, and the key, its slot spent in the store, never sent again.
    shared = TwoHosts(gap=0.5)

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(4.0)
        sent = _sends_by_key(engine)
        granted = {
            w.label: len(shared.granted[_in_store(engine, w.label)]) for w in engine.parts.keys.workers
        }
        dropped = sum(s.dropped for w in engine.parts.keys.workers for s in w.all_leases())
        await engine.stop()
        return sent, granted, dropped, engine.parts.cluster.epoch

    sent, granted, dropped, epoch = run_virtual(main())
    for label, n in sent.items():
        assert n >= granted[label] - 2 and n >= 6, (label, n, granted[label])
    assert dropped <= len(sent) * 2  # at most the last leases held at the stop
    assert epoch == "h:a=e1|h:b=e1"


def test_a_new_epoch_on_one_host_drops_the_leases():
    shared = TwoHosts(gap=0.05)

    async def main():
        engine = _engine(shared)
        engine.start()
        await asyncio.sleep(1.0)
        before = sum(s.dropped for w in engine.parts.keys.workers for s in w.all_leases())
        shared.lose_state()
        await asyncio.sleep(0.5)
        after = sum(s.dropped for w in engine.parts.keys.workers for s in w.all_leases())
        events = [e.text for e in engine.snapshot().events]
        await engine.stop()
        return before, after, events

    before, after, events = run_virtual(main())
    assert after > before
    assert any("started afresh" in text for text in events)


def test_a_member_leases_no_more_than_the_work_it_holds():
    # Offered less than its keys allow (as a member offered its share of the capacity is, now
    # and then), a key leased a quarter second of its rate (5 slots at 20/1s) for one waiting
    # request and left the rest unused: the store counts an unused lease until it expires, so
    # nobody had those slots (3 members each offered their share: 0.90 of the capacity,
    # against 0.92 for one process).
    cfg = load_config(
        preset="study",
        overrides={"engine": {"graveyard_path": ""}, "workload": {"rate": 40.0}, "run": {"seed": 3}},
    )
    shared = FakeShared(gap=0.05)
    counts: list[int] = []
    lease = shared.lease

    async def counting(asks, count, *args):
        counts.append(count)
        return await lease(asks, count, *args)

    shared.lease = counting  # type: ignore[method-assign]

    async def main():
        engine = Engine(cfg, SimulatedTransport(study_settings()), shared_state=shared)
        await engine.run(10.0)
        return engine

    engine = run_virtual(main())
    granted, used, dropped = engine.parts.cluster.lease_totals()
    assert engine.snapshot().succeeded >= 390  # 40/s for 10 s, all sent
    # Asked for what waits: at 40/s over 5 keys a request or two, never a quarter second's 5.
    assert max(counts) <= 3 and sum(counts) <= 1.2 * len(counts), (max(counts), sum(counts), len(counts))
    assert granted <= sum(counts)
