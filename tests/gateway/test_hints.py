"""What the gateway's lines say is true of the gateway: its token line counts keys as keys,
its hints name no flag it does not take."""

from __future__ import annotations

import aiohttp

from ratedeck.runner.headless import metrics_block, token_budgets, token_lines
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEYS = ["sk-hints-aaaaaaaaaaaaaaaa", "sk-hints-bbbbbbbbbbbbbbbb"]


@run_async
async def test_the_token_line_of_a_gateway_with_2_keys_says_2_keys():
    """OpenAI's token budgets are per key and model: 2 keys that served 2 models hold 3 or 4
    budget rows, which are not 3 or 4 keys."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with await start_openai(keys=KEYS, rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, KEYS)) as gw:
            async with aiohttp.ClientSession() as s:
                for model in ("gpt-4o-mini", "gpt-4o-mini", "gpt-4o", "gpt-4o") * 2:
                    prompt = {
                        "model": model,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 5,
                    }
                    async with s.post(gw.url + "/v1/chat/completions", json=prompt, headers=auth) as r:
                        assert r.status == 200
            snap = gw.snapshot()
    rows = token_budgets(snap)
    assert len(rows) > 2, rows  # a budget per key and model: more rows than keys
    line = token_lines(snap)[0]
    assert line.startswith(f"tokens       tokens (2 keys, {len(rows)} budgets): "), line
    assert not [text for text in metrics_block(snap) if "--procs" in text]
