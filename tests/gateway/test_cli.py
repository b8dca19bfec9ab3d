"""`ratedeck gateway` as a user runs it: the real command in a child process, ended by SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import aiohttp
import pytest

from ratedeck.server.stubs.openai import start_openai

from .support import GATEWAY_COMMAND, TOKEN, gateway_command, run_async

KEYS = "sk-cli-aaaaaaaaaaaaaaaa,sk-cli-bbbbbbbbbbbbbbbb"
PROMPT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.mark.slow
@run_async
async def test_the_command_serves_clients_and_drains_on_sigterm(tmp_path):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), GW_KEYS=KEYS, GW_TOKEN=TOKEN)
    async with await start_openai(keys=KEYS.split(","), rpm=1000, tpm=1_000_000) as stub:
        proc, url, first = await gateway_command(stub.url, "--interval", "200ms", cwd=tmp_path, env=env)
        async with aiohttp.ClientSession() as s:
            statuses = []
            for _ in range(3):
                async with s.post(
                    url + "/v1/chat/completions", json=PROMPT, headers={"Authorization": f"Bearer {TOKEN}"}
                ) as r:
                    statuses.append(r.status)
            async with s.post(url + "/v1/chat/completions", json=PROMPT) as r:
                statuses.append(r.status)
        # A periodic block with the clients' line, then SIGTERM drains.
        seen = first
        while "clients      waiting" not in seen:
            seen += (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        proc.send_signal(signal.SIGTERM)
        rest, err = await asyncio.wait_for(proc.communicate(), 30)
    out = seen + rest.decode()
    assert statuses == [200, 200, 200, 401]
    assert proc.returncode == 0, err.decode()
    assert "stopping: no new requests" in out and "=== ratedeck final summary ===" in out
    assert "answers HTTP 200 x3  HTTP 401 x1" in out
    assert "3 generated = 3 succeeded" in out
    for secret in (*KEYS.split(","), TOKEN):
        assert secret not in out and secret not in err.decode()
    assert len(stub.ledger.accepted()) == 3


@pytest.mark.slow
@run_async
async def test_user_mistakes_are_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    base = ["--preset", "openai", "--target", "http://127.0.0.1:9", "--keys", "sk-x", "--no-ui"]
    cases = [
        (["--listen", "0.0.0.0:0"], "--listen: 0.0.0.0 is reachable beyond this machine"),
        (["--listen", "nowhere"], "--listen: must be HOST:PORT"),
        (["--max-wait", "soon"], "--max-wait: 'soon' is not a duration"),
        (["--max-body-mb", "0"], "--max-body-mb"),
        (["--gateway-token", "env:GW_UNSET_VAR"], "--gateway-token: environment variable GW_UNSET_VAR"),
        (["--workload", "x.jsonl"], "--workload: the gateway's work comes from its clients"),
        (["--store", f"sqlite:{tmp_path / 'no-such-dir' / 'gw.db'}"], "no such directory"),
    ]
    for extra, said in cases:
        proc = await asyncio.create_subprocess_exec(
            *GATEWAY_COMMAND,
            *base,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate()
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2, (extra, err)
        assert len(lines) == 1 and said in lines[0], (extra, lines)
        assert "Traceback" not in err.decode()


@pytest.mark.slow
@run_async
async def test_prometheus_has_the_clients_view(tmp_path):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), GW_KEYS=KEYS, GW_TOKEN=TOKEN)
    async with await start_openai(keys=KEYS.split(","), rpm=1000, tpm=1_000_000) as stub:
        proc = await asyncio.create_subprocess_exec(
            *GATEWAY_COMMAND,
            *("--preset", "openai", "--target", stub.url, "--keys", "env:GW_KEYS"),
            *("--gateway-token", "env:GW_TOKEN", "--listen", "127.0.0.1:0", "--metrics-port", "0", "--no-ui"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        assert proc.stdout is not None
        text = ""
        while "metrics at" not in text:
            text += (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = re.search(r"gateway at (http://\S+?),? for", text)
        metrics = re.search(r"metrics at (http://\S+)", text)
        assert url and metrics, text
        async with aiohttp.ClientSession() as s:
            for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):
                async with s.post(url.group(1) + "/v1/chat/completions", json=PROMPT, headers=headers):
                    pass
            async with s.get(metrics.group(1)) as r:
                scraped = await r.text()
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)
    assert 'ratedeck_gateway_requests_total{status="200"} 1.0' in scraped
    assert 'ratedeck_gateway_requests_total{status="401"} 1.0' in scraped
    assert "ratedeck_gateway_queue_wait_seconds_count 1.0" in scraped
    assert "ratedeck_gateway_clients_waiting 0.0" in scraped
    assert proc.returncode == 0


@pytest.mark.slow
@run_async
async def test_the_consoles_engine_process_runs_the_gateway_and_drains_it(tmp_path):
    """Without --no-ui the console's child process runs the gateway (host/process_host.py):
    it serves clients, publishes snapshots with the clients' view, and drains on stop."""
    import dataclasses

    from ratedeck.config.settings import GatewaySettings
    from ratedeck.gateway.service import gateway_session
    from ratedeck.host.process_host import ProcessHost

    from .support import gateway_config

    keys = KEYS.split(",")
    async with await start_openai(keys=keys, rpm=1000, tpm=1_000_000) as stub:
        cfg = gateway_config("openai", stub.url, keys)
        settings = dataclasses.replace(GatewaySettings(), listen="127.0.0.1:0", token=TOKEN)
        host = ProcessHost(cfg.replace(gateway=settings), publish_s=0.05, make_session=gateway_session)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, host.start)
        try:
            said = ""
            while "gateway at" not in said:  # the child's event names its URL
                said = " ".join(e.text for e in host.snapshot().events)
                await asyncio.sleep(0.05)
            url = re.search(r"gateway at (http://\S+?):? clients", said)
            assert url, said
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    url.group(1) + "/v1/chat/completions",
                    json=PROMPT,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as r:
                    assert r.status == 200
        finally:
            final = await loop.run_in_executor(None, host.stop_blocking)
    assert final.succeeded == 1 and final.balance() == 0
    assert final.clients is not None and dict(final.clients.statuses) == {200: 1}
