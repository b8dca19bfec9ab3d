"""`ratedeck bench --scenarios llm`: prompts through OpenAI and Anthropic keys at the tokens-per-minute limit.

Each strategy drives the same seeded prompts (20..2,000 characters, max_tokens
50..400) against a fresh loopback stub (`server/stubs/openai.py`,
`server/stubs/anthropic.py`) for the same duration, one after another. Every
number in the table comes from the stub's own ledger, never from the client:
prompts served (accepted requests less duplicates), tokens charged, 429s,
``insufficient_quota`` answers, 529s, duplicate prompts, and the share of the
token capacity the stub allowed (`allowed_capacity`) over the keys that have a
quota (for Anthropic: output tokens over the output-token capacity, the limit
that binds).

The peers are written from their documented behaviour (no code copied):

- ``cookbook``: the OpenAI cookbook's ``api_request_parallel_processor.py``. The
  script works one key per process; here one instance runs per key, all in one
  event loop, and each takes the next line of one shared prompt list when it
  has the capacity for it (as if the file were split among the processes as
  fast as each works). Each instance is told its key's requests and tokens per
  minute and runs at ``SAFETY_SHARE`` (0.75) of them, as the script's docs
  advise running below the limit. Capacity is tracked as requests and tokens
  available, refilled continuously; a request costs 1 request and its prompt
  estimate (characters / 4, the stubs' estimate, where the script uses
  tiktoken) plus ``max_tokens``. The main loop polls every 1 ms. An error whose
  message says "rate limit" pauses all of that instance's sending for 15 s
  (``seconds_to_pause_after_rate_limit_error``), then the request is retried;
  any error is retried up to 5 attempts in all (``max_attempts``). For
  Anthropic, which has separate input and output limits, the instance tracks
  input tokens (the prompt estimate) and output tokens (``max_tokens``) the
  same way.
- ``litellm``: a LiteLLM ``Router`` with ``routing_strategy="usage-based-routing"``
  over one deployment per key, each with its told ``rpm``/``tpm``. It counts
  requests and tokens per deployment in fixed one-minute windows from its own
  answers (``usage.total_tokens``), picks the deployment with the fewest tokens
  used whose counters leave room for the request, sends, and only on a 429
  puts that deployment in cooldown for ``COOLDOWN_S`` (LiteLLM's
  ``DEFAULT_COOLDOWN_TIME_SECONDS = 5``, read from its ``litellm/constants.py``;
  a 429 in a group of several deployments cools it at once) and retries the
  request on another (up to ``ROUTER_ATTEMPTS`` attempts). It reads no
  rate-limit headers. When no deployment is free the caller waits for the
  soonest cooldown end or window turn and asks again (LiteLLM itself raises
  "no deployments available").
- ``ratedeck``: the real CLI in a subprocess with ``--preset openai`` or
  ``--preset anthropic`` (budgets learned from the answers' headers; no
  ``--limit``): skipped with "preset not available" in an install without them.

Time: the stubs' minute is ``minute_s`` (6 s) real seconds, and the limits the
peers are told are per that minute, as are their refills and windows. The
documented pauses are NOT scaled: the cookbook pauses 15 real seconds (2.5 of
the stub's minutes) and LiteLLM cools a deployment for 5 real seconds; that is
their true behaviour, and the table says so.

The stubs are the simulator's (`ratedeck.server.stubs`), installed with the package.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ratedeck.server.stubs.anthropic import start_anthropic
from ratedeck.server.stubs.llm_common import prompt_identity
from ratedeck.server.stubs.openai import start_openai

from .scenarios import LLM_SCENARIOS, LLM_STRATEGIES, LLMScenario

#: The cookbook's documented defaults.
SAFETY_SHARE = 0.75
PAUSE_AFTER_RATE_LIMIT_S = 15.0
MAX_ATTEMPTS = 5
POLL_S = 0.001
#: LiteLLM's default deployment cooldown (DEFAULT_COOLDOWN_TIME_SECONDS).
COOLDOWN_S = 5.0
#: Attempts per request through the router: the first and two retries (num_retries=2).
ROUTER_ATTEMPTS = 3
#: Requests in flight through the router at once (the caller's concurrency).
ROUTER_CONCURRENCY = 24
REQUEST_TIMEOUT_S = 30.0

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-latest"
ANTHROPIC_VERSION = "2023-06-01"

_WORDS = (
    "rate limit token minute bucket prompt answer model key budget window refill share pause "
    "route deploy retry quota stream batch queue latency header request server client"
).split()


# ----------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    """One workload line: an id, the user's text, and the answer's ``max_tokens``."""

    id: str
    text: str
    max_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """The stubs' estimate (characters / 4, rounded up), which every peer uses too."""
        return math.ceil(len(self.text) / 4)

    def body(self, api: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": self.text}]
        if api == "anthropic":
            return {"model": ANTHROPIC_MODEL, "max_tokens": self.max_tokens, "messages": messages}
        return {"model": OPENAI_MODEL, "messages": messages, "max_tokens": self.max_tokens}

    def line(self, api: str) -> dict[str, Any]:
        """The JSONL workload line ratedeck reads (the request body under `_body`).

        An object `_body` is the body itself, sent as JSON (engine/sources/workload.py).
        """
        path = ANTHROPIC_PATH if api == "anthropic" else OPENAI_PATH
        return {"_id": self.id, "_path": path, "_body": self.body(api)}


def prompts(n: int, seed: int = 1) -> list[Prompt]:
    """``n`` distinct prompts of many sizes (20..2,000 characters, max_tokens 50..400), seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # sizes spread on a log scale: many short prompts, some long ones
        size = int(round(math.exp(rng.uniform(math.log(20), math.log(2000)))))
        head = f"p{i}: "
        words: list[str] = []
        length = len(head)
        while length < size:
            w = rng.choice(_WORDS)
            words.append(w)
            length += len(w) + 1
        text = (head + " ".join(words))[:size]
        out.append(Prompt(f"p{i}", text, rng.randint(50, 400)))
    return out


# ------------------------------------------------------------ the stubs


class StubThread:
    """A stub served by its own event loop in a thread, so the client's thread CPU is its own.

    ``with StubThread(s) as stub:``: ``stub`` is the running `Stub` (`url`, `ledger`, `state`).
    """

    def __init__(self, scenario: LLMScenario, **overrides: Any) -> None:
        self.scenario = scenario
        self.options = {**scenario.stub_options(), **overrides}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llm-stub", daemon=True)
        self.stub: Any = None

    def __enter__(self) -> Any:
        start = start_anthropic if self.scenario.api == "anthropic" else start_openai
        self.thread.start()
        started: Future[Any] = asyncio.run_coroutine_threadsafe(start(**self.options), self.loop)
        self.stub = started.result(10.0)
        return self.stub

    def __exit__(self, *exc: object) -> None:
        if self.stub is not None:
            asyncio.run_coroutine_threadsafe(self.stub.close(), self.loop).result(10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)
        self.loop.close()


# ---------------------------------------------------------------- peers


def _headers(api: str, key: str) -> dict[str, str]:
    if api == "anthropic":
        return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}
    return {"Authorization": f"Bearer {key}"}


async def _post(
    session: aiohttp.ClientSession, url: str, api: str, key: str, prompt: Prompt
) -> tuple[int, dict[str, Any]]:
    """One attempt: the status and the JSON body (empty when there is none)."""
    path = ANTHROPIC_PATH if api == "anthropic" else OPENAI_PATH
    async with session.post(url + path, json=prompt.body(api), headers=_headers(api, key)) as resp:
        try:
            body = await resp.json(content_type=None)
        except (ValueError, aiohttp.ContentTypeError):
            body = {}
        return resp.status, body if isinstance(body, dict) else {}


def _error_message(body: dict[str, Any]) -> str | None:
    """The error's message when the answer is an error (both APIs put it under "error")."""
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message", ""))
    return None


@dataclass
class _Capacity:
    """A continuously refilled amount (the cookbook's "available capacity"), starting full."""

    limit: float
    per_s: float
    level: float = -1.0
    at: float = 0.0

    def refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.at = self.limit, now
        self.level = min(self.limit, self.level + (now - self.at) * self.per_s)
        self.at = now


@dataclass
class PeerTally:
    """What a peer did, by its own count (the table uses the stub's ledger instead)."""

    attempts: int = 0
    ok: int = 0
    gave_up: int = 0
    pauses: int = 0
    cooldowns: int = 0


class Cookbook:
    """The cookbook script's loop, one instance per key (see the module docstring).

    ``pause_s`` is the pause after a rate-limit error (15 s, as documented; tests
    shorten it). ``told`` is the key's limits per ``minute_s``; ``share`` the
    fraction of them it runs at.
    """

    def __init__(
        self,
        url: str,
        api: str,
        key: str,
        told: dict[str, float],
        minute_s: float,
        *,
        share: float = SAFETY_SHARE,
        pause_s: float = PAUSE_AFTER_RATE_LIMIT_S,
        max_attempts: int = MAX_ATTEMPTS,
        poll_s: float = POLL_S,
    ) -> None:
        self.url, self.api, self.key = url, api, key
        self.pause_s, self.max_attempts, self.poll_s = pause_s, max_attempts, poll_s
        self.capacity = {
            name: _Capacity(limit * share, limit * share / minute_s) for name, limit in told.items()
        }
        self.tally = PeerTally()
        self.last_rate_limit = -math.inf
        self.retry: deque[tuple[Prompt, int]] = deque()
        self.in_flight = 0

    def cost(self, prompt: Prompt) -> dict[str, float]:
        if self.api == "anthropic":
            return {"requests": 1, "input": prompt.prompt_tokens, "output": prompt.max_tokens}
        return {"requests": 1, "tokens": prompt.prompt_tokens + prompt.max_tokens}

    async def run(self, session: aiohttp.ClientSession, work: Iterator[Prompt], deadline: float) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        nxt: tuple[Prompt, int] | None = None
        while True:
            now = loop.time()
            if now >= deadline:
                break
            if nxt is None:
                if self.retry:
                    nxt = self.retry.popleft()
                else:
                    p = next(work, None)
                    if p is None and not tasks:
                        break
                    nxt = None if p is None else (p, 1)
            for c in self.capacity.values():
                c.refill(now)
            if nxt is not None:
                cost = self.cost(nxt[0])
                if all(self.capacity[n].level >= cost[n] for n in cost):
                    for n, amount in cost.items():
                        self.capacity[n].level -= amount
                    t = asyncio.create_task(self._call(session, *nxt))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    nxt = None
            await asyncio.sleep(self.poll_s)
            # after a rate-limit error, every send waits until the pause is over
            since = loop.time() - self.last_rate_limit
            if since < self.pause_s:
                await asyncio.sleep(min(self.pause_s - since, max(0.0, deadline - loop.time())))
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _call(self, session: aiohttp.ClientSession, prompt: Prompt, attempt: int) -> None:
        self.tally.attempts += 1
        try:
            status, body = await _post(session, self.url, self.api, self.key, prompt)
            message = _error_message(body) if status != 200 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, message = 0, str(exc)
        if status == 200 and message is None:
            self.tally.ok += 1
            return
        if message is not None and "rate limit" in message.lower():
            self.last_rate_limit = asyncio.get_running_loop().time()
            self.tally.pauses += 1
        if attempt < self.max_attempts:
            self.retry.append((prompt, attempt + 1))
        else:
            self.tally.gave_up += 1


@dataclass
class _Deployment:
    key: str
    rpm: float
    tpm: float
    window: int = -1
    requests: int = 0
    tokens: int = 0
    cooled_until: float = 0.0


class LiteLLMRouter:
    """Usage-based routing over one deployment per key, with cooldowns on 429 (see the module docstring)."""

    def __init__(
        self,
        url: str,
        api: str,
        keys: Sequence[str],
        told: dict[str, float],
        minute_s: float,
        *,
        cooldown_s: float = COOLDOWN_S,
        attempts: int = ROUTER_ATTEMPTS,
        concurrency: int = ROUTER_CONCURRENCY,
    ) -> None:
        self.url, self.api, self.minute_s = url, api, minute_s
        self.cooldown_s, self.attempts, self.concurrency = cooldown_s, attempts, concurrency
        # LiteLLM's deployment takes one tpm: for Anthropic, the output-token limit (the tighter one)
        tpm = told.get("tokens", told.get("output", 0.0))
        self.deployments = [_Deployment(k, told["requests"], tpm) for k in keys]
        self.tally = PeerTally()

    def _counters(self, d: _Deployment, now: float) -> _Deployment:
        window = int(now // self.minute_s)
        if window != d.window:
            d.window, d.requests, d.tokens = window, 0, 0
        return d

    def pick(self, prompt: Prompt, now: float, exclude: set[str]) -> _Deployment | None:
        """The deployment with the fewest tokens used this minute that has room, not cooling, not tried."""
        room = []
        for d in self.deployments:
            self._counters(d, now)
            if d.key in exclude or d.cooled_until > now:
                continue
            if d.requests + 1 > d.rpm or d.tokens + prompt.prompt_tokens > d.tpm:
                continue
            room.append(d)
        return min(room, key=lambda d: d.tokens) if room else None

    def next_free(self, now: float) -> float:
        """When a deployment may next have room: the soonest cooldown end or window turn."""
        turn = (math.floor(now / self.minute_s) + 1) * self.minute_s
        ends = [d.cooled_until for d in self.deployments if d.cooled_until > now]
        return min([turn, *ends])

    async def run(self, session: aiohttp.ClientSession, work: Iterator[Prompt], deadline: float) -> None:
        async def caller() -> None:
            for prompt in work:
                if asyncio.get_running_loop().time() >= deadline:
                    return
                await self.complete(session, prompt, deadline)

        tasks = [asyncio.create_task(caller()) for _ in range(self.concurrency)]
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), max(0.0, deadline - loop.time()))
        except TimeoutError:
            pass

    async def complete(self, session: aiohttp.ClientSession, prompt: Prompt, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        attempt = 0
        while attempt < self.attempts:
            now = loop.time()
            if now >= deadline:
                return False
            # a retry skips the deployments that failed it, unless no other has room
            d = self.pick(prompt, now, tried) or self.pick(prompt, now, set())
            if d is None:
                await asyncio.sleep(max(POLL_S, min(self.next_free(now), deadline) - now))
                continue
            attempt += 1
            d.requests += 1
            self.tally.attempts += 1
            try:
                status, body = await _post(session, self.url, self.api, d.key, prompt)
            except (aiohttp.ClientError, TimeoutError):
                status, body = 0, {}
            self._counters(d, loop.time())
            if status == 200:
                usage = body.get("usage", {})
                used = usage.get("total_tokens")
                if used is None:
                    used = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
                d.tokens += int(used)
                self.tally.ok += 1
                return True
            if status == 429:
                d.cooled_until = loop.time() + self.cooldown_s
                self.tally.cooldowns += 1
            tried.add(d.key)
        self.tally.gave_up += 1
        return False


# ------------------------------------------------------------ running


def _session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        connector=aiohttp.TCPConnector(limit=limit),
    )


async def run_cookbook(
    scenario: LLMScenario, url: str, work: Sequence[Prompt], duration_s: float, **options: Any
) -> list[Cookbook]:
    """One cookbook instance per key over one shared prompt list, for `duration_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    it = iter(work)
    peers = [
        Cookbook(url, scenario.api, k, scenario.told(), scenario.minute_s, **options) for k in scenario.keys
    ]
    async with _session() as session:
        await asyncio.gather(*(p.run(session, it, deadline) for p in peers))
    return peers


async def run_litellm(
    scenario: LLMScenario, url: str, work: Sequence[Prompt], duration_s: float, **options: Any
) -> LiteLLMRouter:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    router = LiteLLMRouter(url, scenario.api, scenario.keys, scenario.told(), scenario.minute_s, **options)
    async with _session() as session:
        await router.run(session, iter(work), deadline)
    return router


def preset_available(api: str) -> bool:
    """Whether this install has the preset the ratedeck strategy runs with."""
    from ratedeck.config import PRESETS

    return api in PRESETS


def ratedeck_command(
    api: str, url: str, keys_file: str, workload_file: str, duration_s: float, report_file: str
) -> list[str]:
    """The CLI line the ratedeck strategy runs (the preset reads its budgets from the answers' headers)."""
    return [
        sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--preset", api, "--target", url,
        "--keys", f"@{keys_file}", "--workload", workload_file, "--duration", f"{duration_s:g}",
        "--report", report_file,
    ]  # fmt: skip


async def run_ratedeck(
    scenario: LLMScenario, url: str, work: Sequence[Prompt], duration_s: float
) -> dict[str, Any]:
    """The CLI in a subprocess; its report's `requests`, and its engine's CPU (the report's
    `client.cpu_s`; the child's rusage, start included, as `process_cpu_s`)."""
    with tempfile.TemporaryDirectory(prefix="ratedeck-llm-") as tmp:
        keys = Path(tmp) / "keys.txt"
        keys.write_text("".join(k + "\n" for k in scenario.keys), encoding="utf-8")
        workload = Path(tmp) / "prompts.jsonl"
        workload.write_text("".join(json.dumps(p.line(scenario.api)) + "\n" for p in work), encoding="utf-8")
        report = Path(tmp) / "report.json"
        cmd = ratedeck_command(scenario.api, url, str(keys), str(workload), duration_s, str(report))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "NO_COLOR": "1"},
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), duration_s + 60.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"error": f"ratedeck did not stop within {duration_s + 60:g} s"}
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if not report.is_file():
            last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            return {"error": f"ratedeck wrote no report: {last[0]}", "cpu_s": cpu}
        data = json.loads(report.read_text(encoding="utf-8"))
        # The engine's own CPU from its start (the report's client.cpu_s), as the peers' is
        # their thread's from theirs: the interpreter's start and imports are the same for any
        # Python client and would be most of a short run's. The whole process's is kept beside it.
        engine_cpu = (data.get("client") or {}).get("cpu_s")
        return {
            "exit": proc.returncode,
            "requests": data.get("requests", {}),
            "cpu_s": engine_cpu if isinstance(engine_cpu, (int, float)) else cpu,
            "process_cpu_s": round(cpu, 3),
        }


@dataclass
class LLMRun:
    """One strategy's run: the window it ran in (on the stub's clock) and what the client says."""

    strategy: str
    start: float
    end: float
    cpu_s: float
    client: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    duration_s: float | None = None  # how long it was asked to send


def run_strategy(
    scenario: LLMScenario, strategy: str, duration_s: float, seed: int = 1, **options: Any
) -> dict[str, Any]:
    """One strategy against a fresh stub: its row, every count from the stub's ledger."""
    work = prompts(scenario.prompt_count(duration_s), seed)
    if strategy == "ratedeck" and not preset_available(scenario.api):
        return skipped_row(strategy, f"preset not available: no '{scenario.api}' preset in this install")
    with StubThread(scenario) as stub:
        loop = asyncio.new_event_loop()
        try:
            cpu0, start = time.thread_time(), time.monotonic()
            client: dict[str, Any] = {}
            if strategy == "cookbook":
                peers = loop.run_until_complete(run_cookbook(scenario, stub.url, work, duration_s, **options))
                client = {"pauses": sum(p.tally.pauses for p in peers)}
            elif strategy == "litellm":
                router = loop.run_until_complete(run_litellm(scenario, stub.url, work, duration_s, **options))
                client = {"cooldowns": router.tally.cooldowns}
            elif strategy == "ratedeck":
                client = loop.run_until_complete(run_ratedeck(scenario, stub.url, work, duration_s))
            else:
                raise ValueError(f"unknown LLM strategy {strategy!r}; known: {', '.join(LLM_STRATEGIES)}")
            end = time.monotonic()
            cpu = client.pop("cpu_s", None) if strategy == "ratedeck" else time.thread_time() - cpu0
        finally:
            loop.close()
        if "error" in client:
            return skipped_row(strategy, str(client["error"]))
        run = LLMRun(strategy, start, end, float(cpu or 0.0), client, duration_s=duration_s)
        return ledger_row(scenario, stub, work, run)


def skipped_row(strategy: str, why: str) -> dict[str, Any]:
    return {"strategy": strategy, "skipped": why, "ok_per_s": 0.0}


def ledger_row(scenario: LLMScenario, stub: Any, work: Sequence[Prompt], run: LLMRun) -> dict[str, Any]:
    """A row from the stub's ledger over the run's window: nothing here is the client's own count."""
    ledger = stub.ledger
    # The window every strategy is judged on: from its first request's arrival at the stub, for
    # the run's duration. A client that starts sending at once (the peers) is judged from its
    # start; the CLI in a subprocess from its first send, not from its interpreter's start.
    first = min((r.at for r in ledger.records), default=run.start)
    elapsed = max(1e-9, min(run.end - first, run.duration_s or run.end - run.start))
    window = {"start": first, "end": first + elapsed + 1e-6}
    accepted = ledger.accepted(**window)
    counts = ledger.counts(**window)
    duplicates = int(stub.state.book.duplicates())
    tokens = float(sum(r.cost for r in accepted))
    minutes = elapsed / scenario.minute_s
    capacity_end = first + elapsed
    if scenario.api == "anthropic":
        # output tokens of each accepted prompt (the stub settles them at its output ratio)
        by_id = {
            prompt_identity({"system": "", "messages": p.body("anthropic")["messages"]}): p for p in work
        }
        ratio = stub.state.output_ratio
        used = sum(
            min(p.max_tokens, math.ceil(p.max_tokens * ratio))
            for r in accepted
            if (p := by_id.get(r.detail)) is not None
        )
        cap = sum(
            stub.allowed_capacity(first, capacity_end, key=k, bucket="output-tokens")
            for k in scenario.quota_keys
        )
    else:
        used = tokens
        cap = sum(stub.allowed_capacity(first, capacity_end, key=k) for k in scenario.quota_keys)
    ok = len(accepted) - duplicates
    return {
        "strategy": run.strategy,
        "prompts_ok": ok,
        "ok_per_s": round(ok / elapsed, 2),
        "tokens": int(tokens),
        "tokens_per_min": round(tokens / minutes, 1),
        "share_tokens": round(used / cap, 4) if cap else None,
        "rejected_429": int(counts.get("rate_limited", 0)),
        "insufficient_quota": int(counts.get("insufficient_quota", 0)),
        "overloaded_529": int(counts.get("overloaded", 0)),
        "duplicates": duplicates,
        "requests": len(ledger.select(**window)),
        "cpu_s": round(run.cpu_s, 3),
        "cpu_us_per_ok": round(1e6 * run.cpu_s / ok, 1) if ok else None,
        "elapsed_s": round(elapsed, 3),
        "minute_s": scenario.minute_s,
        "share_of": "output tokens" if scenario.api == "anthropic" else "tokens",
        "client": run.client,
    }


def run_llm(
    name: str, strategies: list[str], duration_s: float, seed: int, progress: Callable[[str], None]
) -> Any:
    """One LLM scenario, every strategy in turn: a `ScenarioResult` of ledger rows."""
    from .output import ScenarioResult

    s = LLM_SCENARIOS[name]
    # the table's capacity: tokens per stub minute over the keys with a quota
    result = ScenarioResult(name, s.summary, float(len(s.quota_keys) * s.token_limit))
    for strategy in strategies:
        progress(f"{name}: {strategy} for {duration_s:g} s")
        result.rows.append(run_strategy(s, strategy, duration_s, seed))
    return result
