"""The gateway in front of a pool of endpoints (`[[endpoints]]`): two Azure OpenAI resources and
an OpenAI org, each a real stub on loopback; requests go where the model is served and limits
admit them, the body and path as each API wants them, and around an endpoint that dies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from ratedeck.config import load_config
from ratedeck.server.stubs.azure import start_azure
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def prompt(model: str = "gpt-4o-mini", chars: int = 400, max_tokens: int = 100) -> dict:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "x" * chars}]}


def pool_file(tmp: Path, east: str, west: str, openai: str | None = None) -> str:
    text = f"""
[[endpoints]]
name = "east"
preset = "azure-openai"
url = "{east}"
keys = ["east-key"]
models = {{ "gpt-4o-mini" = {{ deployment = "mini", tpm = 20000 }} }}
[[endpoints]]
name = "west"
preset = "azure-openai"
url = "{west}"
api_version = "2024-10-21"
keys = ["west-key"]
models = {{ "gpt-4o-mini" = {{ deployment = "mini-w", tpm = 40000 }}, "gpt-4o" = "big" }}
"""
    if openai:
        text += f"""
[[endpoints]]
name = "openai"
preset = "openai"
url = "{openai}"
keys = ["sk-openai"]
"""
    path = tmp / "pool.toml"
    path.write_text(text)
    return str(path)


async def post(s: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with s.post(url + "/v1/chat/completions", json=body, headers=AUTH) as r:
        return r.status, json.loads(await r.read())


def azure(deployment: str, tpm: int) -> dict:
    return {deployment: {"model": "gpt-4o-mini", "tpm": tpm}}


@run_async
async def test_each_model_goes_to_the_endpoints_that_serve_it_as_their_api_wants(tmp_path):
    east = await start_azure(keys=["east-key"], deployments=azure("mini", 20000))
    west = await start_azure(
        keys=["west-key"], deployments={**azure("mini-w", 40000), "big": {"model": "gpt-4o", "tpm": 30000}}
    )
    async with east, west:
        cfg = load_config(pool_file(tmp_path, east.url, west.url))
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            minis = await asyncio.gather(*(post(s, gw.url, prompt()) for _ in range(30)))
            big = await post(s, gw.url, prompt("gpt-4o"))
            nowhere = await post(s, gw.url, prompt("gpt-5-nano"))
    assert [status for status, _ in minis] == [200] * 30
    assert {body["model"] for _, body in minis} == {"gpt-4o-mini"}  # the upstream's answer, as it said
    east_ok, west_ok = east.ledger.accepted(bucket="mini"), west.ledger.accepted(bucket="mini-w")
    assert east_ok and west_ok and len(east_ok) + len(west_ok) == 30  # both resources serve the model
    assert big[0] == 200 and len(west.ledger.accepted(bucket="big")) == 1  # only west serves gpt-4o
    assert nowhere[0] >= 400 and "no endpoint serves" in json.dumps(nowhere[1])
    assert not east.ledger.refused("rate_limited") and not west.ledger.refused("rate_limited")
    assert not east.ledger.refused("deployment_not_found") and not west.ledger.refused("deployment_not_found")


@run_async
async def test_an_endpoint_that_stops_answering_leaves_the_pool_and_no_request_fails(tmp_path):
    east = await start_azure(keys=["east-key"], deployments=azure("mini", 200000))
    west = await start_azure(keys=["west-key"], deployments=azure("mini-w", 400000))
    async with east, west, await start_openai(keys=["sk-openai"], rpm=5000, tpm=1_000_000) as oai:
        cfg = load_config(pool_file(tmp_path, east.url, west.url, oai.url))
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            first = await asyncio.gather(*(post(s, gw.url, prompt()) for _ in range(30)))
            await east.state.go_dark("refuse")
            during = await asyncio.gather(*(post(s, gw.url, prompt()) for _ in range(60)))
            served_before = len(east.ledger.accepted(bucket="mini"))
            await east.state.come_back()
            view = gw.engine.snapshot() if hasattr(gw, "engine") else None
    assert [status for status, _ in first + during] == [200] * 90  # every one answered, none twice
    total = len(east.ledger.accepted()) + len(west.ledger.accepted()) + len(oai.ledger.accepted())
    assert total == 90
    assert served_before == len(east.ledger.accepted(bucket="mini"))  # nothing reached it while dark
    del view


@run_async
async def test_one_azure_target_without_a_pool_gets_azure_paths_too():
    async with await start_azure(keys=["east-key"], deployments=azure("mini", 20000)) as east:
        cfg = gateway_config("azure-openai", east.url, ["east-key"])
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            status, body = await post(s, gw.url, prompt("mini"))  # the v1 path: the deployment as the model
    assert status == 200 and body["model"] == "gpt-4o-mini"
    assert len(east.ledger.accepted(bucket="mini")) == 1


@run_async
async def test_two_gateways_share_a_pools_budgets_through_redis(tmp_path, redis_server):
    # Two OpenAI-style endpoints, 10 requests a (scaled) minute of 6 s each: beyond the first
    # buckets a key's next slot is more than 0.3 s away, so its leases must outlive the store's
    # polls of both endpoints' hosts (they were dropped at each poll, and the keys starved).
    a = await start_openai(keys=["sk-a"], rpm=10, tpm=1_000_000, minute_s=6.0)
    b = await start_openai(keys=["sk-b"], rpm=10, tpm=1_000_000, minute_s=6.0)
    async with a, b:
        text = "".join(
            f'[[endpoints]]\nname = "{name}"\npreset = "openai"\nurl = "{stub.url}"\nkeys = ["sk-{name}"]\n'
            for name, stub in (("a", a), ("b", b))
        )
        (tmp_path / "pool.toml").write_text(text)
        cfg = load_config(str(tmp_path / "pool.toml")).replace(store=redis_server.url)
        async with running_gateway(cfg) as one, running_gateway(cfg) as two, aiohttp.ClientSession() as s:
            answers = await asyncio.gather(
                *(post(s, gw.url, prompt()) for gw in (one, two) for _ in range(16))
            )
    assert [status for status, _ in answers] == [200] * 32
    assert not a.ledger.refused("rate_limited") and not b.ledger.refused("rate_limited")
    assert len(a.ledger.accepted()) + len(b.ledger.accepted()) == 32


@run_async
async def test_a_deployment_someone_else_drained_is_read_from_its_remaining_counts(tmp_path):
    # Azure sends what is left (x-ratelimit-remaining-tokens), not of what: the engine counts it
    # against the limit told, after one first request, instead of spending its own full bucket.
    east = await start_azure(keys=["east-key"], deployments=azure("mini", 20000))
    west = await start_azure(keys=["west-key"], deployments=azure("mini-w", 40000))
    async with east, west, aiohttp.ClientSession() as s:
        for stub, path in ((east, "/openai/v1/chat/completions"), (west, "/openai/v1/chat/completions")):
            key = "east-key" if stub is east else "west-key"
            body = {**prompt("mini" if stub is east else "mini-w", chars=4000, max_tokens=4000)}
            while True:  # another program spends the whole bucket
                async with s.post(stub.url + path, json=body, headers={"api-key": key}) as r:
                    if r.status == 429:
                        break
        refused_before = len(east.ledger.refused("rate_limited")) + len(west.ledger.refused("rate_limited"))
        cfg = load_config(pool_file(tmp_path, east.url, west.url))
        async with running_gateway(cfg) as gw:
            answers = await asyncio.gather(*(post(s, gw.url, prompt(max_tokens=100)) for _ in range(8)))
        refused = len(east.ledger.refused("rate_limited")) + len(west.ledger.refused("rate_limited"))
    assert [status for status, _ in answers] == [200] * 8
    assert refused - refused_before <= 2  # at most each deployment's first request
