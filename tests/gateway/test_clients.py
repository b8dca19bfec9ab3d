"""A gateway for a team (issue 42): `[[gateway.clients]]` against the OpenAI stub, over real HTTP.

Each client is named by its own token; the upstream sees only the pool's keys. A client over
a quota that refuses gets 429 with Retry-After; a batch backlog does not hold up an
interactive client; the clients' view says who waited and who was served."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import aiohttp
import pytest

from ratedeck.server.stubs.openai import start_openai

from .support import GATEWAY_COMMAND, gateway_config, run_async, running_gateway

KEYS = ["sk-team-aaaaaaaaaaaaaaaa", "sk-team-bbbbbbbbbbbbbbbb"]
CHAT, NIGHTLY, CAPPED = "tok-chat-0123456789", "tok-nightly-0123456789", "tok-capped-0123456789"


def body(chars: int = 40, max_tokens: int = 20, model: str = "gpt-4o-mini") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "x" * chars}], "max_tokens": max_tokens}


async def post(s: aiohttp.ClientSession, url: str, token: str, payload: dict | None = None):
    headers = {"Authorization": f"Bearer {token}"}
    async with s.post(url + "/v1/chat/completions", json=payload or body(), headers=headers) as r:
        return r.status, r.headers.copy(), await r.json(content_type=None)


def team(**extra) -> list[dict]:
    return [
        {"name": "chat", "token": CHAT, "priority": "interactive"},
        {"name": "nightly", "token": NIGHTLY, "priority": "batch"},
        {"name": "capped", "token": CAPPED, "tokens_per_minute": 100, "quota": "refuse", **extra},
    ]


def team_config(url: str, clients: list[dict]):
    return gateway_config("openai", url, KEYS, gateway={"clients": clients})


@run_async
async def test_each_token_names_its_client_and_a_token_no_client_has_is_401():
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        cfg = team_config(stub.url, team())
        async with running_gateway(cfg, clients=cfg.gateway.clients, token=None) as gw:
            async with aiohttp.ClientSession() as s:
                chat = await post(s, gw.url, CHAT)
                nightly = [await post(s, gw.url, NIGHTLY) for _ in range(2)]
                wrong = await post(s, gw.url, "tok-nobody-0123456789")
            rows = {r.name: r for r in gw.snapshot().clients.rows}
    assert chat[0] == 200 and [n[0] for n in nightly] == [200, 200]
    assert wrong[0] == 401 and wrong[2]["error"]["code"] == "invalid_api_key"
    assert list(rows) == ["chat", "nightly", "capped", "batches"]  # and the Batch APIs' own flow
    assert rows["batches"].priority == "batch" and rows["batches"].sent == 0
    assert (rows["chat"].priority, rows["chat"].answered, rows["chat"].sent) == ("interactive", 1, 1)
    assert (rows["nightly"].answered, rows["nightly"].sent) == (2, 2)
    assert rows["capped"].sent == 0 and rows["capped"].quotas[0].left == 100
    # the upstream saw the pool's keys only, never a client's token
    assert {r.key for r in stub.ledger.records} <= set(KEYS)
    assert not any(t in str(stub.ledger.records) for t in (CHAT, NIGHTLY, CAPPED))


@run_async
async def test_a_client_over_a_quota_that_refuses_gets_429_with_the_time_it_frees():
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        cfg = team_config(stub.url, team())
        async with running_gateway(cfg, clients=cfg.gateway.clients, token=None) as gw:
            async with aiohttp.ClientSession() as s:
                # 40 characters and 20 max_tokens: 30 tokens each, 100 a minute: three fit
                got = [await post(s, gw.url, CAPPED) for _ in range(5)]
                other = await post(s, gw.url, CHAT)
            rows = {r.name: r for r in gw.snapshot().clients.rows}
    assert [g[0] for g in got] == [200, 200, 200, 429, 429]
    status, headers, answer = got[3]
    assert answer["error"]["code"] == "quota_exceeded" and answer["error"]["type"] == "rate_limit_exceeded"
    assert "'capped'" in answer["error"]["message"] and "tokens_per_minute" in answer["error"]["message"]
    assert 55 <= int(headers["Retry-After"]) <= 62  # its first charge leaves the window a minute on
    assert other[0] == 200  # the others are not held by its quota
    assert rows["capped"].refused == 2 and rows["capped"].quotas[0].left == pytest.approx(10)
    assert len(stub.ledger.records) == 4  # the refused ones never reached the upstream


@run_async
async def test_a_usd_quota_refuses_a_model_with_no_price_in_one_line():
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        cfg = team_config(stub.url, [{"name": "spend", "token": CHAT, "usd_per_day": 5}])
        async with running_gateway(cfg, clients=cfg.gateway.clients, token=None) as gw:
            async with aiohttp.ClientSession() as s:
                priced = await post(s, gw.url, CHAT)
                unpriced = await post(s, gw.url, CHAT, body(model="no-such-priced-model"))
            row = gw.snapshot().clients.rows[0]
    assert priced[0] == 200
    assert unpriced[0] == 400 and unpriced[2]["error"]["code"] == "model_not_priced"
    assert "usd_per_day" in unpriced[2]["error"]["message"]
    assert row.quotas[0].name == "usd_per_day" and 0 < row.quotas[0].left < 5
    assert len(stub.ledger.records) == 1


@run_async
async def test_an_interactive_client_is_not_held_behind_a_batch_backlog():
    # 2 keys x 6,000 tokens a minute: 200 tokens a second; a batch prompt costs 300
    async with await start_openai(keys=KEYS, rpm=1000, tpm=6_000, latency=0.02) as stub:
        cfg = team_config(stub.url, team())
        async with running_gateway(cfg, clients=cfg.gateway.clients, token=None) as gw:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                backlog = [
                    asyncio.ensure_future(post(s, gw.url, NIGHTLY, body(chars=800, max_tokens=100)))
                    for _ in range(80)
                ]
                await asyncio.sleep(1.0)  # the buckets' first tokens are gone, the rest wait
                waits = []
                for _ in range(6):
                    t0 = time.monotonic()
                    got = await post(s, gw.url, CHAT)
                    waits.append(time.monotonic() - t0)
                    assert got[0] == 200
                    await asyncio.sleep(0.3)
                rows = {r.name: r for r in gw.snapshot().clients.rows}
                for f in backlog:
                    f.cancel()
                await asyncio.gather(*backlog, return_exceptions=True)
    # a chat costs 30 tokens (0.15 s of refill); behind 60-odd batch prompts it would wait minutes
    assert max(waits) < 1.0, waits
    assert rows["nightly"].waiting >= 35  # the first buckets took 40 of the 80
    assert not stub.ledger.refused()


@pytest.mark.slow
@run_async
async def test_the_command_takes_clients_from_the_config_with_their_tokens_from_the_environment(tmp_path):
    config = tmp_path / "team.toml"
    config.write_text(
        "[[gateway.clients]]\n"
        'name = "chat"\ntoken = "env:CHAT_TOKEN"\npriority = "interactive"\n'
        "[[gateway.clients]]\n"
        'name = "nightly"\ntoken = "env:NIGHTLY_TOKEN"\npriority = "batch"\nweight = 2\n'
    )
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        env = {
            **os.environ,
            "GW_KEYS": ",".join(KEYS),
            "CHAT_TOKEN": CHAT,
            "NIGHTLY_TOKEN": NIGHTLY,
            "PYTHONUNBUFFERED": "1",
        }
        proc = await asyncio.create_subprocess_exec(
            *GATEWAY_COMMAND,
            *("--preset", "openai", "--target", stub.url, "--keys", "env:GW_KEYS", "--config", str(config)),
            *("--listen", "127.0.0.1:0", "--no-ui", "--interval", "0.5"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        assert proc.stdout is not None and proc.stderr is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = first.split("gateway at ")[1].split(" ")[0]
        async with aiohttp.ClientSession() as s:
            statuses = [(await post(s, url, t))[0] for t in (CHAT, NIGHTLY, "wrong-token-0123")]
        await asyncio.sleep(1.2)  # a periodic line with the clients
        proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    text = first + out.decode()
    assert proc.returncode == 0, err.decode()
    assert statuses == [200, 200, 401]
    assert "chat (interactive)" in first and "nightly (batch)" in first
    assert "nightly" in text and "chat" in text
    for secret in (CHAT, NIGHTLY, *KEYS):
        assert secret not in text and secret not in err.decode()
    assert "Traceback" not in err.decode()
    assert sys.executable  # the command ran under this interpreter
