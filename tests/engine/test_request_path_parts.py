"""The request path and a key's limits built from their parts, with no Engine: an answer goes
through learn -> decide -> apply, and the key ends up as a user would see it."""

from __future__ import annotations

import asyncio
import random

from ratedeck.core.policy import Policy
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Ending, EventKind
from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.delays import Quota
from ratedeck.engine.limits.budgets import Budgets
from ratedeck.engine.limits.headroom import HeadroomController
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.observe.metrics import Metrics
from ratedeck.engine.path.key import UNKNOWN_LIMIT, KeyLimits, Learning
from ratedeck.engine.path.request_path import RequestPath, SharedGates
from ratedeck.engine.path.settle import SettleRules
from ratedeck.engine.path.worker import KeyWorker
from ratedeck.engine.ports import RunClock
from ratedeck.engine.queues import Graveyard, WorkQueues
from ratedeck.engine.request import Request
from ratedeck.engine.settings import EngineSettings, KeySpec
from ratedeck.server.simulated import run_virtual


class Answers:
    """A transport that answers each send with the next outcome it was given."""

    def __init__(self, *outcomes: oc.Outcome) -> None:
        self.outcomes = list(outcomes)

    async def send(self, spec, req, nonce):
        return self.outcomes.pop(0)

    def prober(self):
        raise NotImplementedError


class Log:
    def __init__(self) -> None:
        self.rows: list[tuple[EventKind, str]] = []

    def event(self, kind: EventKind, text: str) -> None:
        self.rows.append((kind, text))


class Ends:
    def __init__(self) -> None:
        self.ended: list[tuple[int, Ending]] = []
        self.refused = 0

    def finish(self, req: Request, ending: Ending) -> None:
        req.ending = ending
        self.ended.append((req.id, ending))

    def key_refused(self) -> None:
        self.refused += 1


class Parts:
    """One key, its limits and a request path, wired by hand."""

    def __init__(self, transport: Answers, policies: tuple[Policy, ...]) -> None:
        self.log, self.ends = Log(), Ends()
        self.headroom = HeadroomController(fixed_ms=5.0)
        seconds = self.headroom.seconds

        def make(p: tuple[Policy, ...]) -> WindowLimiter:
            return WindowLimiter(p, seconds)

        budgets = Budgets(EngineSettings(), make)
        self.spec = KeySpec("k1", "secret-k1-abcdef", policies)
        self.limiter = make(policies or (UNKNOWN_LIMIT,))
        self.discovered = 0
        learning = Learning(budgets=budgets, headroom=self.headroom, events=self.log, discovered=self._found)
        self.limits = KeyLimits(self.spec, self.limiter, learning, max_in_flight=4)
        self.queues = WorkQueues()
        self.host_gate = CooldownGate("host")
        self.gate = CooldownGate("k1")
        self.path = RequestPath(
            transport=transport,
            queues=self.queues,
            metrics=Metrics(),
            headroom=self.headroom,
            graveyard=Graveyard(None),
            host_gate=self.host_gate,
            settle_rules=SettleRules(max_attempts=3, backoff_base_s=0.0, backoff_cap_s=0.0),
            rng=random.Random(1),
            ends=self.ends,
            events=self.log,
            cooldown=SharedGates(self.log),
            redact=Redactor(()),
        )
        self.run = RunClock(lambda: 0.0)
        self.worker = KeyWorker(
            self.spec,
            self.limits,
            run=self.run,
            queues=self.queues,
            path=self.path,
            gates=(self.gate, self.host_gate),
        )

    def _found(self) -> None:
        self.discovered += 1

    def send_one(self) -> Request:
        """Launch one request on the key and wait for its answer to be settled."""

        async def go() -> Request:
            loop = asyncio.get_running_loop()
            self.run.loop, self.run.clock = loop, loop.time
            self.path.start(loop, loop.time, loop.time(), 0.0)
            now = loop.time()
            req = Request(1, now, now + 60.0)
            stamp = self.limiter.record(now)
            self.worker.in_flight += 1
            self.path.launch(self.worker, req, None, (stamp,))
            await self.path.sends[req]
            return req

        return run_virtual(go())


def answer(kind, status, **kw) -> oc.Outcome:
    quotas = kw.pop("quotas", ())
    out = oc.Outcome(kind, status, latency_s=0.05, **kw)
    out.quotas = quotas
    return out


def test_a_key_with_no_limit_adopts_the_one_its_server_advertises():
    parts = Parts(Answers(answer(oc.OK, 200, policy_header='"burst";q=20;w=1')), ())
    assert parts.limits.discovering and parts.limits.max_in_flight == 1
    req = parts.send_one()
    assert parts.ends.ended == [(req.id, Ending.SUCCEEDED)]
    assert not parts.limits.discovering and parts.limits.max_in_flight == 4
    assert Policy(20, 1.0) in parts.limiter.policies
    assert parts.discovered == 1
    assert any("adopted it" in text for _, text in parts.log.rows)
    assert parts.worker.row(0.0).succeeded == 1


def test_a_429_with_retry_after_closes_the_keys_gate_and_queues_a_retry():
    parts = Parts(Answers(answer(oc.RATE_LIMITED, 429, retry_after_s=2.0)), (Policy(10, 1.0),))
    req = parts.send_one()
    assert parts.ends.ended == []  # not ended: queued for its retry
    assert parts.queues.retries() == 1 and req.attempts == 1
    assert parts.gate.open_at > parts.path.clock()  # closed for the server's delay
    assert parts.gate.open_at - parts.path.clock() > 1.5
    assert parts.worker.state(parts.path.clock()).name == "COOLING"
    assert parts.worker.row(0.0).rejected_429 == 1
    assert any(kind is EventKind.COOLDOWN for kind, _ in parts.log.rows)


def test_a_quota_header_corrects_the_keys_count_and_is_shown():
    quota = Quota(limit=10, remaining=3, reset_in_s=0.5)
    parts = Parts(Answers(answer(oc.OK, 200, quotas=(quota,))), (Policy(10, 1.0),))
    parts.send_one()
    now = parts.path.clock()
    used, limit = parts.limiter.used(now)
    assert (used, limit) == (7, 10)  # the server counted 7; we had sent 1
    row = parts.worker.row(now)
    assert (row.server_remaining, row.server_limit) == (3, 10)


def test_a_refused_key_is_blocked_and_its_request_left_for_another_key():
    parts = Parts(Answers(answer(oc.BLOCKED, 401, error="bad key")), (Policy(10, 1.0),))
    parts.send_one()
    assert parts.worker.blocked and parts.ends.refused == 1
    assert parts.ends.ended == [] and parts.queues.retries() == 1
    assert any("refused by the server" in text for _, text in parts.log.rows)
    assert parts.worker.row(0.0).refused_status == 401


def _reachable(root: object) -> list[object]:
    """Every object reachable from `root` through the engine's own objects' attributes,
    containers and bound methods (not into the standard library or the loop)."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen[id(obj)] = obj
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
            stack.extend(obj)
        elif hasattr(obj, "__self__") and hasattr(obj, "__func__"):
            stack.append(obj.__self__)
        elif type(obj).__module__.startswith("ratedeck."):
            names = list(getattr(obj, "__dict__", {}))
            for cls in type(obj).__mro__:
                names += [n for n in getattr(cls, "__slots__", ()) if isinstance(n, str)]
            for name in names:
                value = getattr(obj, name, None)
                if value is not None:
                    stack.append(value)
    return list(seen.values())


def test_no_part_of_an_engine_holds_the_engine():
    from tests.support.engine_helpers import seed_engine

    engine, _ = seed_engine(workload={"total": 5})
    reached = _reachable(engine.parts)
    assert any(isinstance(o, KeyWorker) for o in reached)  # the walk reaches the keys
    assert any(isinstance(o, RequestPath) for o in reached)
    assert not [o for o in reached if o is engine]
