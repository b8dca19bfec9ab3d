"""Retry affinity and the uncertain ending, against real loopback servers.

An Idempotency-Key is scoped to the account (API key) that first sent it, at
Stripe and everywhere else: a retry on another key is a new request there, and
a charge made twice. A write that may have happened and cannot be settled ends
`uncertain`, with the server's request id, never sent on another key.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict

import pytest
from aiohttp import web

from ratedeck.config import load_config
from ratedeck.core.exits import ExitCode
from ratedeck.core.vocab import Ending
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.transport import http_transport
from ratedeck.runner.report import build_report
from ratedeck.runner.thresholds import evaluate, parse
from ratedeck.server.stubs.stripe import start_stripe

KEYS = ["sk_test_alpha000000000000000000", "sk_test_bravo000000000000000000"]


class Endings:
    """A finish watcher: every request's ending, key and server request id."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str | None, Ending, str | None, str | None]] = []

    def finished(self, req, ending) -> None:
        self.rows.append((req.id, req.key, ending, req.request_id, req.pin))


def write_lines(tmp_path, lines, name="work.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


async def run_engine(cfg, url, seconds, results=None):
    from ratedeck.engine.observe.results import ResultsFile
    from ratedeck.host.run_view import RunView

    transport = http_transport(cfg.engine_settings, url)
    engine = Engine(cfg, transport)
    seen = Endings()
    engine.watch(seen)
    out = ResultsFile(str(results), RunView(engine)) if results is not None else None
    if out is not None:
        engine.watch(out)
    try:
        snap = await engine.run(seconds)
    finally:
        await transport.close()
        if out is not None:
            out.close()
    return snap, seen


def charges(n):
    return [{"amount": 100 + i, "currency": "usd", "metadata[order_id]": f"o{i}"} for i in range(n)]


@pytest.mark.slow
def test_stripe_two_accounts_5pct_500_after_charge_never_charge_twice(tmp_path):
    """300 charges on 2 accounts, 5% answered 500 after the charge was made: the retry goes
    out on the same account only (the stub replays the saved 500 there), so no charge is
    made twice; every charge succeeded or is uncertain; the report's counts are the stub's."""

    async def main():
        async with await start_stripe(
            keys=KEYS, rate_limit=40, endpoint_limit=40, fail_after_write=0.05, seed=7
        ) as stub:
            cfg = load_config(
                preset="stripe",
                overrides={
                    "target": {"url": stub.url + "/v1/charges"},
                    "keys": {"secrets": KEYS, "limits": ["40/1s"]},
                    "workload": {"file": write_lines(tmp_path, charges(300)), "rate": 76.0},
                    "engine": {"graveyard_path": str(tmp_path / "graveyard.jsonl")},
                },
            )
            snap, seen = await run_engine(cfg, stub.url + "/v1/charges", 30.0)
            return snap, seen, stub

    snap, seen, stub = asyncio.run(main())
    state = stub.state
    report = build_report(snap)["requests"]
    assert snap.balance() == 0 and snap.generated == 300
    assert state.duplicate_writes() == {}  # 0 charges created twice, on any account
    assert len(state.writes_by_logical("charge")) == 300  # every order charged, once
    failed = sum(1 for w in state.writes if w.failed)
    assert failed >= 5  # the case under test happened (5% of 300)
    assert report["succeeded"] + report["uncertain"] == 300
    assert report["succeeded"] == len(state.writes) - failed and report["uncertain"] == failed
    assert report["graveyard"] == report["expired"] == 0
    # Each account's charges are the requests that ended on its key.
    by_key = Counter(key for _, key, _, _, _ in seen.rows)
    assert state.writes_by_key() == {KEYS[0]: by_key["k1"], KEYS[1]: by_key["k2"]}
    # An uncertain charge was retried once, on its own key, got the replayed 500, and is
    # reported with Stripe's request id.
    uncertain = [r for r in seen.rows if r[2] is Ending.UNCERTAIN]
    assert uncertain and all(rid and rid.startswith("req_stub") for _, _, _, rid, _ in uncertain)
    assert all(pin == key for _, key, _, _, pin in uncertain)
    assert snap.failed == 2 * failed  # the first 500 and its one replay: nothing more was sent
    assert not stub.ledger.refused("rate_limited")
    assert evaluate([parse("uncertain>0")], build_report(snap))[0].failed


@pytest.mark.slow
def test_a_replayed_500_without_the_replayed_header_is_retried_on_its_key_up_to_max_attempts(tmp_path):
    async def main():
        async with await start_stripe(
            keys=KEYS,
            rate_limit=40,
            endpoint_limit=40,
            fail_pattern=[True] + [False] * 20,
            replayed_header=False,
        ) as stub:
            cfg = load_config(
                preset="stripe",
                overrides={
                    "target": {"url": stub.url + "/v1/charges"},
                    "keys": {"secrets": KEYS, "limits": ["40/1s"]},
                    "workload": {"file": write_lines(tmp_path, charges(10)), "rate": 50.0},
                    "engine": {"max_attempts": 3, "backoff_base_ms": 10, "backoff_cap_ms": 20},
                },
            )
            snap, seen = await run_engine(cfg, stub.url + "/v1/charges", 20.0)
            return snap, seen, stub

    snap, seen, stub = asyncio.run(main())
    assert (snap.succeeded, snap.uncertain, snap.graveyard) == (9, 1, 0)
    first = stub.state.writes[0]
    replays = stub.ledger.select(outcome="replayed")
    assert len(replays) == 2 and {r.key for r in replays} == {first.key}  # 3 attempts, one account
    assert stub.state.duplicate_writes() == {}


@pytest.mark.slow
def test_a_post_without_idempotency_key_answered_500_ends_uncertain_and_is_not_sent_again(tmp_path):
    async def main():
        async with await start_stripe(
            keys=KEYS, rate_limit=40, endpoint_limit=40, fail_pattern=[True, False, False, False]
        ) as stub:
            cfg = load_config(
                preset="stripe",
                overrides={
                    "target": {"url": stub.url + "/v1/charges", "idempotency": False},
                    "keys": {"secrets": KEYS, "limits": ["40/1s"]},
                    "workload": {"file": write_lines(tmp_path, charges(4)), "rate": 20.0},
                },
            )
            snap, seen = await run_engine(cfg, stub.url + "/v1/charges", 20.0, tmp_path / "results.jsonl")
            return snap, seen, stub

    snap, seen, stub = asyncio.run(main())
    assert (snap.succeeded, snap.uncertain, snap.retried) == (3, 1, 0)
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    (line,) = [r for r in lines if r["ending"] == "uncertain"]
    assert line["request_id"].startswith("req_stub") and line["status"] == 500 and line["attempts"] == 1
    assert len(stub.state.writes) == 4 and stub.state.duplicate_writes() == {}
    (row,) = [r for r in seen.rows if r[2] is Ending.UNCERTAIN]
    assert row[3] is not None and row[3].startswith("req_stub")  # Stripe's Request-Id, reported
    assert len([r for r in stub.ledger.records if r.status == 500]) == 1  # sent once, never again
    assert snap.balance() == 0


async def _flaky_get_server():
    """A GET endpoint that answers 500 to the first attempt of each `id`, 200 after;
    it records which key sent each attempt."""
    seen: dict[str, list[str]] = defaultdict(list)

    async def handle(request: web.Request) -> web.Response:
        rid = request.query.get("id", "")
        seen[rid].append(request.headers.get("Authorization", ""))
        if len(seen[rid]) == 1:
            return web.Response(status=500, text="try again")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/x", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/x", seen


def test_a_pinned_line_stays_on_its_key_through_a_retry(tmp_path):
    async def main():
        runner, url, seen = await _flaky_get_server()
        try:
            lines = [{"id": f"p{i}", "_key": "k2"} for i in range(6)] + [{"id": f"f{i}"} for i in range(6)]
            cfg = load_config(
                overrides={
                    "target": {"url": url},
                    "keys": {"secrets": KEYS, "limits": ["50/1s"]},
                    "workload": {"file": write_lines(tmp_path, lines), "rate": 100.0},
                    "engine": {"backoff_base_ms": 5, "backoff_cap_ms": 10},
                },
            )
            snap, rows = await run_engine(cfg, url, 20.0)
        finally:
            await runner.cleanup()
        return snap, rows, seen

    snap, rows, seen = asyncio.run(main())
    assert snap.succeeded == 12 and snap.retried == 12
    for i in range(6):
        assert seen[f"p{i}"] == [f"Bearer {KEYS[1]}"] * 2  # both attempts on k2
    assert {pin for _, _, _, _, pin in rows.rows if pin} == {"k2"}


def test_key_lines_are_checked_before_anything_is_sent(tmp_path):
    from ratedeck.engine.settings import ConfigError

    def cfg_for(lines):
        return dict(
            overrides={
                "target": {"url": "http://127.0.0.1:9/x"},
                "keys": {"secrets": KEYS, "limits": ["5/1s"]},
                "workload": {"file": write_lines(tmp_path, lines)},
            }
        )

    import random

    from ratedeck.engine.sources.workload import Workload

    def check(lines):
        cfg = load_config(**cfg_for(lines))
        Workload.from_config(cfg.engine_settings, random.Random(0))

    from ratedeck.core.secrets import fingerprint

    check([{"_key": 1}, {"_key": "k2"}, {"_key": fingerprint(KEYS[0])}])  # index, label, fingerprint
    for bad, shown in ((3, "3"), ("k7", "'k7'"), (0, "0"), (True, "True")):
        with pytest.raises(ConfigError) as err:
            check([{"a": 1}, {"_key": bad}])
        assert "line 2" in str(err.value) and shown in str(err.value) and "work.jsonl" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check([{"_key": KEYS[1]}])
    text = str(err.value)
    assert "secret" in text and KEYS[1] not in text and "bravo" not in text and "\n" not in text


def test_some_uncertain_requests_alone_exit_0_and_fail_on_uncertain_fails_the_run(tmp_path, capsys):
    import io
    import sys

    from ratedeck.engine.snapshot import Snapshot
    from ratedeck.runner import headless
    from ratedeck.runner.headless import RunFacts
    from tests.runner.test_report_schema import accounted, validate

    report = tmp_path / "report.json"
    cfg = load_config(overrides={"run": {"report": str(report)}})
    snap = Snapshot(generated=10, succeeded=8, uncertain=2, sent=12, failed=2)
    assert snap.balance() == 0
    assert headless.conclude(snap, RunFacts(answers=12), cfg, out=sys.stdout) == ExitCode.OK
    out, err = capsys.readouterr()
    assert "8 succeeded + 2 uncertain" in out and "2 requests are uncertain" in err
    data = json.loads(report.read_text())
    assert validate(data) == [] and data["requests"]["uncertain"] == 2
    assert accounted(data["requests"]) == data["requests"]["generated"] == 10
    code = headless.conclude(
        snap, RunFacts(answers=12), cfg, out=io.StringIO(), thresholds=[parse("uncertain>0")]
    )
    assert code == ExitCode.THRESHOLD


def test_pinned_work_waits_in_its_key_s_own_queue_and_never_blocks_the_others():
    from ratedeck.engine.queues import WorkQueues
    from ratedeck.engine.request import Request

    async def main():
        q = WorkQueues()
        pinned = [Request(i, 0.0, 10.0) for i in range(1, 4)]
        for r in pinned:
            r.pin = "k1"
            q.put(r)
        free = Request(9, 0.0, 10.0)
        q.put(free)
        assert len(q) == 4 and q.fresh() == 4 and q.retries() == 0
        assert q.pop_ready(1.0, key="k2") is free  # k1's backlog does not hold k2 up
        assert q.pop_ready(1.0, key="k2") is None and q.pop_ready(1.0) is None
        assert q.pop_ready(1.0, key="k1") is pinned[0]
        pinned[0].eligible_at = 2.0
        q.retry(pinned[0])  # its retry stays pinned, due at 2.0
        assert q.retries() == 1 and q.pop_ready(1.0, key="k2") is None
        assert q.pop_ready(1.0, key="k1") is pinned[1] and q.pop_ready(2.0, key="k1") is pinned[0]
        assert [r.id for r in q.all_queued()] == [3]
        assert q.drain_expired(20.0) == [pinned[2]] and len(q) == 0
        q.put(pinned[1])
        assert q.take_pinned("k1") == [pinned[1]] and len(q) == 0 and q.fresh() == 0

    asyncio.run(main())
