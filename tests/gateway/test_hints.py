"""What the gateway's lines and help say is true of the gateway: its token line counts keys
as keys, its hints name no flag it does not take, its --help lists the flags it takes."""

from __future__ import annotations

import os
import subprocess
import sys

import aiohttp

from ratedeck.runner.headless import metrics_block, token_budgets, token_lines
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_config, run_async, running_gateway

KEYS = ["sk-hints-aaaaaaaaaaaaaaaa", "sk-hints-bbbbbbbbbbbbbbbb"]
#: Flags of a run that the gateway refuses: its work comes from its clients.
RUN_ONLY = ("--workload", "--rate", "--poisson", "--total", "--procs", "--dry-run", "--plot", "--method")


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


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CONFIG_HOME="/nonexistent", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _options(help_text: str) -> set[str]:
    return {word.strip("[],") for word in help_text.split() if word.strip("[],").startswith("--")}


def test_the_gateway_s_help_lists_only_the_flags_it_takes():
    gateway, run = _cli("gateway", "--help"), _cli("--help")
    assert gateway.returncode == run.returncode == 0
    on_gateway, on_run = _options(gateway.stdout), _options(run.stdout)
    assert not set(RUN_ONLY) & on_gateway, set(RUN_ONLY) & on_gateway
    assert set(RUN_ONLY) <= on_run  # a run still takes them
    assert "--save-config" in on_run and "--save-config" not in on_gateway  # the gateway refuses it
    assert {"--listen", "--gateway-token", "--access-log", "--keys", "--in-flight"} <= on_gateway
    assert not {"--listen", "--access-log"} & on_run
    for text in (gateway.stdout, run.stdout):
        assert "seed server" not in text and "'seed'" not in text  # no preset of that name now


def test_a_run_s_flag_given_to_the_gateway_is_one_line_naming_it():
    for flag, value in (
        ("--rate", "5"),
        ("--workload", "jobs.jsonl"),
        ("--procs", "auto"),
        ("--dry-run", None),
    ):
        proc = _cli("gateway", "--keys", "k", flag, *([value] if value else []))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"ratedeck: {flag}: the gateway's work comes from its clients")
        assert proc.stderr.rstrip().endswith("(a run's flag)") and "Traceback" not in proc.stderr
