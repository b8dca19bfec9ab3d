"""A client's request is the client's: a gateway asked for no output writes none of it to disk.

The real command in a child process, under a HOME and XDG directories of the test's own and
a permissive umask, in front of the OpenAI stub, which answers a request with no messages
400 and a model it does not serve 404 (answers the engine buries rather than retries).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_command, run_async

KEYS = "sk-priv-aaaaaaaaaaaaaaaa,sk-priv-bbbbbbbbbbbbbbbb"
MODELS = {"gpt-4o-mini": {"rpm": 1000, "tpm": 1_000_000}}  # any other model: 404
SECRET = "the-clients-own-words-7f3a9c"  # the text a client's prompt holds; no file may hold it


def _holding(root: Path, text: str) -> list[Path]:
    """Every file under `root` whose bytes contain `text`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and text.encode() in path.read_bytes():
            found.append(path)
    return found


@pytest.mark.slow
@run_async
async def test_a_gateway_asked_for_no_output_keeps_no_clients_prompt(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        GW_KEYS=KEYS,
        GW_TOKEN=TOKEN,
    )
    old = os.umask(0o022)
    try:
        async with await start_openai(keys=KEYS.split(","), models=MODELS) as stub:
            proc, url, first = await gateway_command(stub.url, "--interval", "200ms", cwd=home, env=env)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            bad = {"model": "gpt-4o-mini", "prompt": SECRET}  # no messages: 400
            unknown = {"model": "no-such-model", "messages": [{"role": "user", "content": SECRET}]}  # 404
            async with aiohttp.ClientSession() as s:
                statuses = []
                for body in (bad, unknown):
                    async with s.post(url + "/v1/chat/completions", json=body, headers=auth) as r:
                        statuses.append(r.status)  # the client got its answer
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        os.umask(old)
    assert statuses == [400, 404], statuses
    assert proc.returncode is not None and proc.returncode != 2, err.decode()
    said = first + out.decode()
    assert "answers HTTP 400 x1  HTTP 404 x1" in said, said
    assert "graveyard:" not in said  # no file was named for the buried requests
    assert _holding(home, SECRET) == []
    assert not (home / ".local" / "state" / "ratedeck").exists()  # nothing left behind at all


@run_async
async def test_a_graveyard_is_written_only_where_one_was_named(tmp_path):
    """In-process: the engine of a gateway (a live source) places no graveyard for "auto";
    a named one takes the refused request, body and all, in a file only its user reads."""
    from .support import gateway_config, running_gateway

    keys = KEYS.split(",")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    named = tmp_path / "refused.jsonl"
    buried = {}
    old = os.umask(0o022)
    try:
        async with await start_openai(keys=keys, models=MODELS) as stub:
            for graveyard in ("auto", str(named)):
                cfg = gateway_config("openai", stub.url, keys, engine={"graveyard_path": graveyard})
                async with running_gateway(cfg) as gw:
                    async with aiohttp.ClientSession() as s:
                        body = {"model": "gpt-4o-mini", "prompt": SECRET}
                        async with s.post(gw.url + "/v1/chat/completions", json=body, headers=auth) as r:
                            assert r.status == 400
                buried[graveyard] = gw.session.facts
    finally:
        os.umask(old)
    assert buried["auto"].graveyard_path is None and buried["auto"].graveyard_written == 0
    assert buried[str(named)].graveyard_path == str(named) and buried[str(named)].graveyard_written == 1
    assert SECRET in named.read_text()
    assert oct(named.stat().st_mode & 0o777) == oct(0o600)
