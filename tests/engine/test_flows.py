"""Flows (gateway clients, issue 42): priority, fair share by weight in the binding unit, and
quotas over any 60 s, first as the queue alone, then through an engine on virtual time."""

from __future__ import annotations

import asyncio
import math

import pytest

from ratedeck.config import load_config
from ratedeck.core.vocab import Priority
from ratedeck.engine.engine import Engine
from ratedeck.engine.flows import QUOTA_MARGIN_S, FlowQueue, Window
from ratedeck.engine.queues import WorkQueues
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.settings import FlowSpec
from ratedeck.server.simulated import run_virtual
from tests.engine.test_models import PATH, ModelServer

INTERACTIVE, STANDARD, BATCH = Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH


def req(i: int, flow: int, tokens: int = 100, deadline: float = 1e9) -> Request:
    r = Request(i, 0.0, deadline)
    r.flow = flow
    r.units = {"input_tokens": 0, "output_tokens": tokens, "tokens": tokens}
    return r


def queue(*specs: FlowSpec, tokens: bool = True) -> FlowQueue:
    return FlowQueue(specs, tokens=(lambda r: r.units["tokens"]) if tokens else None)


def served(q: FlowQueue, n: int, now: float = 0.0) -> list[int]:
    out = []
    for _ in range(n):
        r = q.popleft(now)
        assert r is not None
        out.append(r.flow)
    return out


# ---------------------------------------------------------------- the queue alone


def test_a_higher_priority_goes_first_whatever_waited_before_it():
    q = queue(FlowSpec("nightly", BATCH), FlowSpec("chat", INTERACTIVE), FlowSpec("app", STANDARD))
    for i in range(100):
        q.append(req(i, 0))
    for i in range(100, 105):
        q.append(req(i, 2))
    q.append(req(999, 1))
    assert served(q, 7) == [1, 2, 2, 2, 2, 2, 0]
    assert len(q) == 99


def test_flows_of_one_priority_share_by_weight_while_both_wait():
    q = queue(FlowSpec("a", weight=1), FlowSpec("b", weight=3))
    for i in range(400):
        q.append(req(i, i % 2))
    counts = served(q, 200)
    assert counts.count(0) == 50 and counts.count(1) == 150
    # and no long runs: b never goes more than 3 in a row, a never twice
    runs = "".join(map(str, counts))
    assert "0000" not in runs and "11111" not in runs


def test_shares_are_in_the_binding_unit_not_in_requests():
    q = queue(FlowSpec("small"), FlowSpec("big"))
    for i in range(300):
        q.append(req(i, 0, tokens=100))
        q.append(req(1000 + i, 1, tokens=300))
    got = served(q, 200)
    small = got.count(0) * 100
    big = got.count(1) * 300
    assert abs(small - big) <= 300  # equal tokens: three small ones for each big one
    # without tokens the unit is the request
    q = queue(FlowSpec("small"), FlowSpec("big"), tokens=False)
    for i in range(100):
        q.append(req(i, 0, tokens=100))
        q.append(req(1000 + i, 1, tokens=300))
    got = served(q, 100)
    assert got.count(0) == got.count(1) == 50
    assert q.unit == "requests"


def test_an_idle_flow_banks_no_credit_and_its_share_goes_to_the_others():
    q = queue(FlowSpec("a"), FlowSpec("b"))
    for i in range(1000):
        q.append(req(i, 1))
    assert served(q, 500) == [1] * 500  # a is idle: b takes everything
    for i in range(50):
        q.append(req(2000 + i, 0))
    # a comes back: it shares from now on, it does not get 500 in a row for the time it was away
    # (it starts at the virtual time of the last request served: one ahead at most)
    assert served(q, 20).count(0) in (10, 11)


def test_a_quota_holds_over_any_60_seconds_and_frees_as_its_oldest_charges_leave():
    q = queue(FlowSpec("q", tokens_per_minute=1000))
    for i in range(20):
        q.append(req(i, 0, tokens=300))
    assert served(q, 3, now=0.0) == [0, 0, 0]  # 900 of 1000
    assert q.popleft(1.0) is None  # 1,200 would pass it
    free = 60.0 + QUOTA_MARGIN_S  # a charge leaves a little after its minute (the way to the server)
    assert q.next_free_at(1.0) == pytest.approx(free)
    assert q.popleft(free - 0.01) is None
    assert q.popleft(free) is not None  # the three charges of t=0 have left the window
    # over the whole run, never more than 1000 in any 60 s
    times = [0.0, 0.0, 0.0, free]
    t = free
    while len(q):
        got = q.popleft(t)
        if got is None:
            nxt = q.next_free_at(t)
            assert nxt is not None and nxt > t
            t = nxt
            continue
        times.append(t)
    assert len(times) == 20
    for start in times:
        assert sum(300 for s in times if start <= s < start + 60) <= 1000


def test_a_flow_over_its_quota_does_not_hold_up_another():
    q = queue(FlowSpec("capped", requests_per_minute=2), FlowSpec("free"))
    for i in range(10):
        q.append(req(i, 0))
        q.append(req(100 + i, 1))
    assert served(q, 12) == [0, 1, 0] + [1] * 9


def test_a_refusing_flow_counts_what_it_has_queued_and_says_when_it_frees():
    q = queue(FlowSpec("r", tokens_per_minute=1000, refuse=True), FlowSpec("w", tokens_per_minute=10))
    for i in range(3):
        r = req(i, 0, tokens=300)
        assert q.refusal(r, 0.0) is None
        q.append(r)
    assert served(q, 2, now=0.0) == [0, 0]  # 600 charged, 300 queued
    late = req(9, 0, tokens=300)
    refused = q.refusal(late, 30.0)
    assert refused is not None
    assert (refused.quota, refused.limit) == ("tokens_per_minute", 1000)
    assert refused.retry_after_s == pytest.approx(30.0 + QUOTA_MARGIN_S)  # the charges of t=0 leave at 61
    # a flow that waits is never refused
    assert q.refusal(req(10, 1, tokens=300), 0.0) is None


def test_expired_requests_leave_each_flow_and_withdrawn_ones_move_no_tag():
    q = queue(FlowSpec("a"), FlowSpec("b"))
    first, second = req(1, 0, deadline=5.0), req(2, 1, deadline=50.0)
    q.append(first)
    q.append(second)
    assert q.expired(10.0) == [first]
    q.remove(second)
    assert len(q) == 0 and q.vtime == 0.0
    with pytest.raises(ValueError):
        q.remove(second)


def test_a_window_knows_when_an_amount_fits():
    w = Window(100, 60.0)
    w.charge(0.0, 60)
    w.charge(10.0, 30)
    assert w.fits(11.0, 10) and not w.fits(11.0, 11)
    assert w.free_at(11.0, 50) == pytest.approx(60.0)  # the 60 of t=0 must leave
    assert w.free_at(11.0, 80) == pytest.approx(70.0)  # and then the 30 of t=10
    assert w.free_at(11.0, 101) == math.inf  # never: more than the limit alone
    assert w.left(70.0) == 100


def test_the_work_queues_serve_flows_and_wake_a_getter_when_a_quota_frees():
    async def main():
        loop = asyncio.get_running_loop()
        q = WorkQueues(queue(FlowSpec("q", requests_per_minute=1)))
        q.put(req(1, 0))
        q.put(req(2, 0))
        now = loop.time()
        assert q.pop_ready(now) is not None
        assert q.pop_ready(now) is None  # held by its quota, still counted as waiting
        assert len(q) == 1 and q.fresh() == 1
        woken = loop.create_future()
        q.add_getter(woken)
        await asyncio.wait_for(woken, 120)
        return loop.time() - now, q.pop_ready(loop.time())

    waited, got = run_virtual(main())
    assert waited == pytest.approx(60.0 + QUOTA_MARGIN_S, abs=0.01) and got is not None and got.id == 2


# ---------------------------------------------------------------- through an engine


KEY = "sk-proj-flows0000000000000001"


def flow_engine(server: ModelServer, flows: tuple[FlowSpec, ...]) -> Engine:
    cfg = load_config(
        preset="openai",
        overrides={
            "target": {"url": "http://stub.invalid"},
            "keys": {"secrets": [KEY]},
            "workload": {"rate": 0},
            "engine": {"graveyard_path": "", "max_attempts": 10},
        },
    )
    return Engine(cfg.replace(flows=flows), server)


class Recording(ModelServer):
    """The model server, noting each arrival's flow."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.flows: list[tuple[float, int, int]] = []  # (arrival, flow, status)

    async def send(self, key, req, nonce):
        out = await super().send(key, req, nonce)
        _model, at, status, _tokens = self.log[-1]
        self.flows.append((at, req.flow, status))
        return out


def submit(engine: Engine, flow: int, n: int, prompt: int = 400, max_tokens: int = 100) -> list[Request]:
    made = []
    for _ in range(n):
        r = engine.parts.intake.new_request()
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x" * prompt}],
            "max_tokens": max_tokens,
        }
        r.shape = Shape(method="POST", path=PATH, body=body, payload=Shape.encode(body))
        r.flow = flow
        engine.parts.intake.submit(r)
        made.append(r)
    return made


def test_an_interactive_request_waits_for_capacity_not_behind_a_batch_backlog():
    # 12,000 tokens a minute (200 a second); batch prompts cost 200 tokens: 300 of them are 5 minutes
    server = Recording({"m": (10_000, 12_000)}, rtt=0.2)
    engine = flow_engine(server, (FlowSpec("chat", INTERACTIVE), FlowSpec("nightly", BATCH)))
    chats: list[Request] = []

    async def main():
        engine.start()
        submit(engine, 1, 300)
        await asyncio.sleep(20)
        for _ in range(20):  # two small prompts a second while the backlog waits
            chats.extend(submit(engine, 0, 1, prompt=40, max_tokens=20))
            await asyncio.sleep(0.5)
        await asyncio.sleep(5)
        return await engine.stop()

    run_virtual(main())
    waits = [r.first_sent_at - r.created_at for r in chats]
    assert len(waits) == 20 and all(r.last_status == 200 for r in chats)
    # one chat costs 30 tokens: 0.15 s of refill; the backlog never goes ahead of one
    assert max(waits) < 0.5, waits
    assert not [s for _, _, s in server.flows if s == 429]
    # the batch went on in between: the chats took only their own tokens, the keys stayed busy
    cost = {0: 30, 1: 200}
    spent = sum(cost[f] for t, f, _ in server.flows if 21.0 <= t < 30.0)
    assert spent >= 0.9 * 9 * 200  # 12,000 a minute: 200 a second
    assert sum(1 for t, f, _ in server.flows if 21.0 <= t < 30.0 and f == 1) >= 5


def test_two_flows_of_one_priority_share_the_tokens_one_to_three():
    server = Recording({"m": (10_000, 60_000)}, rtt=0.2)
    engine = flow_engine(server, (FlowSpec("one", weight=1), FlowSpec("three", weight=3)))

    async def main():
        engine.start()
        submit(engine, 0, 800)
        submit(engine, 1, 800)
        await asyncio.sleep(60)
        return await engine.stop()

    run_virtual(main())
    window = [f for t, f, s in server.flows if 5.0 <= t < 55.0 and s == 200]
    share = window.count(1) / len(window)
    assert len(window) > 200 and share == pytest.approx(0.75, abs=0.02)


def test_a_quota_that_waits_holds_over_any_60_seconds_in_an_engine():
    server = Recording({"m": (10_000, 10**6)}, rtt=0.2)
    engine = flow_engine(server, (FlowSpec("capped", tokens_per_minute=2_000),))

    async def main():
        engine.start()
        submit(engine, 0, 40)  # 200 tokens each: 10 a minute
        await asyncio.sleep(150)
        return await engine.stop()

    run_virtual(main())
    times = [t for t, _, s in server.flows if s == 200]
    assert len(times) == 30  # 10 at once, then 10 a minute (and a second) later, twice
    assert max(sum(1 for s in times if t <= s < t + 60.0) for t in times) == 10  # in any 60 s
