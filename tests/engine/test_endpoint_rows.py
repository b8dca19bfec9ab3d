"""A pool's endpoints in the snapshot: each key names its endpoint, and `Snapshot.endpoints` has a
row per endpoint (what it serves, each model's limits as its keys' lanes hold them, its health,
its keys' counts), built from a real pool run against two OpenAI stubs."""

from __future__ import annotations

import asyncio
import json

import pytest

from ratedeck.config import load_config
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.endpoints import run_transport
from ratedeck.engine.snapshot import EndpointRow, KeyRow, ModelLimits, Snapshot
from ratedeck.server.stubs.openai import start_openai
from tests.support.engine_helpers import seed_engine

MODEL = "gpt-4o-mini"


def pool_toml(a_url: str, b_url: str) -> str:
    # "oa" (two keys, each with its own limits) tells its limits in its headers and serves any model; "compat" sends no limit
    # header and its limits are told in `models` (120 requests, 12,000 tokens a minute).
    return f"""
[[endpoints]]
name = "oa"
preset = "openai"
url = "{a_url}"
keys = ["sk-a-0000000000000000", "sk-c-0000000000000000"]
[[endpoints]]
name = "compat"
preset = "openai-compatible"
url = "{b_url}?secret=query"
keys = ["sk-b-0000000000000000"]
models = {{ "{MODEL}" = {{ deployment = "{MODEL}", rpm = 120, tpm = 12000 }} }}
"""


def batch(path, n: int) -> str:
    with path.open("w") as f:
        for i in range(n):
            body = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "x" * 80}]}
            f.write(
                json.dumps(
                    {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                )
            )
            f.write("\n")
    return str(path)


async def pool_run(tmp_path, n: int = 24) -> Snapshot:
    """A small Batch file through a two-endpoint pool, to its end; the final snapshot."""
    a = await start_openai(keys=["sk-a-0000000000000000", "sk-c-0000000000000000"], rpm=600, tpm=60000)
    b = await start_openai(keys=["sk-b-0000000000000000"], rpm=600, tpm=60000, limit_headers=False)
    try:
        toml = tmp_path / "pool.toml"
        toml.write_text(pool_toml(a.url, b.url))
        overrides = {
            "workload": {"file": batch(tmp_path / "batch.jsonl", n)},
            "engine": {"graveyard_path": ""},
        }
        cfg = load_config(str(toml), overrides=overrides)
        engine = Engine(cfg, run_transport(cfg.engine_settings, ""))
        return await engine.run(60.0)
    finally:
        await a.close()
        await b.close()


@pytest.fixture(scope="module")
def pool_snap(tmp_path_factory) -> Snapshot:
    return asyncio.run(pool_run(tmp_path_factory.mktemp("pool")))


def test_each_endpoint_has_a_row_with_its_keys_counts_and_health(pool_snap):
    snap = pool_snap
    assert snap.succeeded == 24, snap.errors
    assert [e.name for e in snap.endpoints] == ["oa", "compat"]
    oa, compat = snap.endpoints
    assert (oa.preset, compat.preset) == ("openai", "openai-compatible")
    # the rows add up their keys' own: every attempt is some endpoint's
    by_endpoint = {e.name: [k for k in snap.keys if k.endpoint == e.name] for e in snap.endpoints}
    for e in snap.endpoints:
        keys = by_endpoint[e.name]
        assert e.keys == len(keys) == {"oa": 2, "compat": 1}[e.name]
        assert e.sent == sum(k.sent for k in keys)
        assert e.succeeded == sum(k.succeeded for k in keys)
        assert e.rejected_429 == sum(k.rejected_429 for k in keys)
    assert oa.sent + compat.sent == snap.sent
    assert oa.sent > 0 and compat.sent > 0
    # two endpoints: each has a health, in the pool throughout
    assert (oa.state, oa.reason, oa.downs) == ("up", "", 0)
    assert compat.state == "up"


def test_keys_name_their_endpoint(pool_snap):
    assert sorted(k.endpoint for k in pool_snap.keys) == ["compat", "oa", "oa"]
    assert all(k.label.startswith(k.endpoint) for k in pool_snap.keys)


def test_what_each_endpoint_serves_and_its_learned_limits(pool_snap):
    oa, compat = pool_snap.endpoints
    assert oa.serves == ("any",)
    assert compat.serves == (MODEL,)
    # the url is printable: the query string (where keys often travel) is gone
    assert compat.url.startswith("http://127.0.0.1:") and "secret" not in compat.url
    # compat's limits are the ones told in `models`, per minute
    (told,) = compat.models
    assert told.model == MODEL
    assert dict(told.limits)["tokens"] == pytest.approx(12000, rel=0.01)
    assert dict(told.limits)["requests"] == pytest.approx(120, rel=0.01)
    assert not told.followed  # no limit header: nothing to follow
    # oa's come from its answers' headers (the stub's 600 rpm and 60,000 tpm per key), followed,
    # and its two keys' add up
    (learned,) = oa.models
    assert learned.model == MODEL and learned.followed
    assert dict(learned.limits)["tokens"] == pytest.approx(2 * 60000, rel=0.05)
    assert dict(learned.limits)["requests"] == pytest.approx(2 * 600, rel=0.05)
    assert compat.limits_text() == f"{MODEL}: requests 120/min, tokens 12,000/min"


def test_a_model_not_sent_yet_says_so():
    assert ModelLimits("gpt-4o").text() == "gpt-4o: not sent yet"
    row = EndpointRow("east", models=(ModelLimits("a", (("tokens", 1000.0),)), ModelLimits("b")))
    assert row.limits_text() == "a: tokens 1,000/min; b: not sent yet"


def test_one_target_has_no_endpoints_and_its_keys_none(tmp_path):
    engine, _ = seed_engine(tmp_path)
    snap = engine.snapshot()
    assert snap.endpoints == ()
    assert snap.keys and all(k.endpoint == "" for k in snap.keys)
    assert KeyRow("k1", "…").endpoint == ""


def test_an_endpoint_whose_every_key_the_server_refused_says_refused(tmp_path):
    async def run() -> Snapshot:
        a = await start_openai(keys=["sk-a-0000000000000000", "sk-c-0000000000000000"], rpm=600, tpm=60000)
        b = await start_openai(keys=["sk-someone-else-00000"], rpm=600, tpm=60000)  # compat's key: 401
        try:
            toml = tmp_path / "pool.toml"
            toml.write_text(pool_toml(a.url, b.url))
            overrides = {
                "workload": {"file": batch(tmp_path / "b.jsonl", 6)},
                "engine": {"graveyard_path": ""},
            }
            cfg = load_config(str(toml), overrides=overrides)
            return await Engine(cfg, run_transport(cfg.engine_settings, "")).run(60.0)
        finally:
            await a.close()
            await b.close()

    snap = asyncio.run(run())
    assert snap.succeeded == 6  # oa took them all
    assert {e.name: e.state for e in snap.endpoints} == {"oa": "up", "compat": "refused"}


def test_an_endpoint_s_own_prices_cost_its_answers_and_bound_the_dry_run(tmp_path):
    from ratedeck.runner.dryrun import plan

    async def run() -> tuple[Snapshot, object]:
        a = await start_openai(keys=["sk-a-0000000000000000", "sk-c-0000000000000000"], rpm=600, tpm=60000)
        b = await start_openai(keys=["sk-b-0000000000000000"], rpm=600, tpm=60000, limit_headers=False)
        try:
            toml = tmp_path / "pool.toml"
            dear = f'prices = {{ "{MODEL}" = {{ input = 100.0, output = 200.0 }} }}\n'
            toml.write_text(pool_toml(a.url, b.url) + dear)  # compat's (the last endpoint's) own prices
            overrides = {
                "workload": {"file": batch(tmp_path / "b.jsonl", 12)},
                "engine": {"graveyard_path": ""},
            }
            cfg = load_config(str(toml), overrides=overrides)
            dry = plan(cfg.engine_settings)
            return await Engine(cfg, run_transport(cfg.engine_settings, "")).run(60.0), dry
        finally:
            await a.close()
            await b.close()

    snap, dry = asyncio.run(run())
    assert snap.spend is not None and snap.succeeded == 12
    rows = {r.key: r for r in snap.spend.rows if r.answers}
    compat = rows["compat"]
    assert compat.usd == pytest.approx((compat.input_tokens * 100.0 + compat.output_tokens * 200.0) / 1e6)
    for label in ("oa-1", "oa-2"):
        if label in rows:  # the shipped price: far below compat's
            assert (
                rows[label].usd < (rows[label].input_tokens * 100.0 + rows[label].output_tokens * 200.0) / 1e6
            )
    bill = dry.models[0]
    assert bill.usd_max == pytest.approx((bill.input_tokens * 100.0 + bill.output_tokens_max * 200.0) / 1e6)
    assert bill.usd_min < bill.usd_max / 100  # the cheapest endpoint's least: the shipped price
