"""Limits per key and model on virtual time: each model its own buckets, gate, first answer and
learning, as OpenAI's and Anthropic's limits are (engine/path/lanes.py)."""

from __future__ import annotations

import asyncio
import math

import pytest

from ratedeck.config import load_config
from ratedeck.config.load import build_config
from ratedeck.engine.engine import Engine
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.delays import read_quotas
from ratedeck.engine.http.transport import TransportBase
from ratedeck.engine.request import Shape
from ratedeck.engine.settings import ConfigError
from ratedeck.server.simulated import run_virtual
from ratedeck.server.stubs.llm_common import Bucket
from ratedeck.server.stubs.openai import duration

KEY = "sk-proj-models00000000000001"
MINUTE = 60.0
PATH = "/v1/chat/completions"


class ModelServer(TransportBase):
    """OpenAI's rules in memory, on the loop's (virtual) clock: per key and model a requests
    and a tokens bucket, charged at arrival (prompt/4 + max_tokens), x-ratelimit-* headers of
    the model the request named, 429 with the wait, 404 model_not_found for an unknown model.

    `force_429` names (model, n): that model's n-th arrival is refused with a 5 s wait."""

    def __init__(self, limits: dict[str, tuple[int, int]], rtt: float = 0.2, force_429=()):
        self.limits = limits
        self.rtt = rtt
        self.force_429 = set(force_429)
        self.buckets: dict[tuple[str, str], tuple[Bucket, Bucket]] = {}
        self.log: list[tuple[str, float, int, int]] = []  # (model, arrival, status, tokens charged)
        self.arrivals: dict[str, int] = {}

    async def send(self, key, req, nonce):
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.rtt / 2)
        now = loop.time()
        body = req.shape.body
        model = body.get("model")
        self.arrivals[model] = n = self.arrivals.get(model, 0) + 1
        if model not in self.limits:
            self.log.append((model, now, 404, 0))
            await asyncio.sleep(self.rtt / 2)
            text = (
                f'{{"error": {{"message": "The model `{model}` does not exist", "code": "model_not_found"}}}}'
            )
            return oc.Outcome(oc.CLIENT_ERROR, 404, None, self.rtt, text)
        rpm, tpm = self.limits[model]
        pair = self.buckets.get((key.secret, model))
        if pair is None:
            pair = self.buckets[key.secret, model] = (
                Bucket(rpm, MINUTE, updated=now),
                Bucket(tpm, MINUTE, updated=now),
            )
        r, t = pair
        cost = math.ceil(len(body["messages"][0]["content"]) / 4) + body["max_tokens"]
        wait = max(r.wait_for(1, now), t.wait_for(cost, now))
        if (model, n) in self.force_429:
            wait = max(wait, 5.0)
        status = 429 if wait > 0 else 200
        if status == 200:
            r.take(1, now)
            t.take(cost, now)
        self.log.append((model, now, status, cost if status == 200 else 0))
        headers = {
            "x-ratelimit-limit-requests": str(rpm),
            "x-ratelimit-limit-tokens": str(tpm),
            "x-ratelimit-remaining-requests": str(r.remaining(now)),
            "x-ratelimit-remaining-tokens": str(t.remaining(now)),
            "x-ratelimit-reset-requests": duration(r.full_in(now)),
            "x-ratelimit-reset-tokens": duration(t.full_in(now)),
        }
        await asyncio.sleep(self.rtt / 2)
        if status == 429:
            out = oc.Outcome(oc.RATE_LIMITED, 429, wait, self.rtt, "rate_limit_exceeded")
        else:
            out = oc.Outcome(oc.OK, 200, None, self.rtt)
        out.quotas = read_quotas(headers)
        return out

    async def close(self):
        pass

    def sent(self, model: str, start: float = 0.0, end: float = math.inf, status: int | None = None) -> list:
        return [
            e
            for e in self.log
            if e[0] == model and start <= e[1] < end and (status is None or e[2] == status)
        ]


def engine_for(server: ModelServer, **over) -> Engine:
    cfg = load_config(
        preset="openai",
        overrides={
            "target": {"url": "http://stub.invalid"},
            "keys": {"secrets": [KEY]},
            "workload": {"rate": 0},  # only the lines a test feeds
            "engine": {"graveyard_path": "", "max_attempts": 10, **over},
        },
    )
    return Engine(cfg, server)


def feed(engine: Engine, models: list[str], prompt: int = 400, max_tokens: int = 100) -> None:
    for i, model in enumerate(models):
        req = engine.parts.intake.new_request()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "x" * prompt}],
            "max_tokens": max_tokens,
        }
        req.shape = Shape(method="POST", path=PATH, body=body, payload=Shape.encode(body))
        req.line_id = f"{model}-{i}"
        engine.parts.intake.submit(req)


def run(engine: Engine, seconds: float, models: list[str], **kw):
    async def main():
        engine.start()
        feed(engine, models, **kw)
        await asyncio.sleep(seconds)
        return await engine.stop()

    return run_virtual(main())


def lanes(engine: Engine):
    (worker,) = engine.parts.keys.workers
    assert worker.limits.lanes is not None
    return worker.limits.lanes.by_model


def test_a_models_429_does_not_slow_another_model_on_the_same_key():
    # the small model's 3rd request is refused with a 5 s wait: only the small model waits
    server = ModelServer({"small": (600, 10**6), "big": (600, 10**6)}, force_429={("small", 3)})
    engine = engine_for(server)
    snap = run(engine, 30, ["small", "big"] * 150)
    ((_, refused_at, _, _),) = server.sent("small", status=429)
    answered = refused_at + server.rtt / 2
    # the small model sends nothing while its gate is closed; the big one goes on at its pace
    assert server.sent("small", answered + 0.01, answered + 4.9) == []
    assert len(server.sent("big", answered, answered + 4.9)) >= 40  # 600/min: 10 a second
    assert server.sent("big", status=429) == []
    assert snap.succeeded == 300 and snap.rejected_429 == 1
    assert lanes(engine)["small"].rejected_429 == 1 and lanes(engine)["big"].rejected_429 == 0


def test_an_exhausted_models_bucket_does_not_hold_back_another_model():
    # the small model's tokens run out at once (2,000 a minute, 200 a request); the big one's never
    server = ModelServer({"small": (600, 2_000), "big": (600, 10**6)})
    engine = engine_for(server)
    run(engine, 20, ["small"] * 40 + ["big"] * 40)
    # everything the big model had went in its first seconds, behind the small one's stalled lines
    assert len(server.sent("big")) == 40 and max(t for _, t, _, _ in server.sent("big")) < 6.0
    # the small model: its full bucket (10) then its refill (2,000 a minute: one every 6 s)
    assert 10 <= len(server.sent("small", status=200)) <= 14
    assert server.sent("small", status=429) == [] and server.sent("big", status=429) == []


def test_the_headers_of_an_answer_update_only_the_bucket_of_the_model_it_named():
    server = ModelServer({"small": (60, 30_000), "big": (500, 200_000)})
    engine = engine_for(server)
    run(engine, 10, ["small", "big"] * 5)
    by_model = lanes(engine)
    small, big = by_model["small"], by_model["big"]
    assert small.limiter.bucket().limit == 60 and small.own["tokens"].bucket().limit == 30_000
    assert big.limiter.bucket().limit == 500 and big.own["tokens"].bucket().limit == 200_000
    assert (small.limit, big.limit) == (60, 500)  # the server's count of each, as its answers said
    # the preset's start (500 requests, 200,000 tokens) stands for neither any more, and the key's
    # own limiter is not spent: every request went through its model's lane
    assert engine.parts.keys.workers[0].limits.limiter.used(10.0)[0] == 0


def test_each_model_waits_for_its_own_first_answer():
    server = ModelServer({"small": (60, 30_000), "big": (500, 200_000)}, rtt=1.0)
    engine = engine_for(server)
    run(engine, 3, ["small", "big"] * 20)
    # one request of each model until its first answer came (at 1 s), then as the limits allow
    firsts = sorted(t for _, t, _, _ in server.log if t < 1.0)
    assert len(firsts) == 2
    assert len(server.log) > 10


def test_an_unknown_model_fails_its_lines_and_does_not_block_the_key():
    server = ModelServer({"big": (600, 10**6)})
    engine = engine_for(server)
    snap = run(engine, 20, ["nope", "big"] * 10)
    assert snap.graveyard == 10 and snap.succeeded == 10
    assert len(server.sent("nope")) == 10  # each tried once: a 404 is not retried
    (worker,) = engine.parts.keys.workers
    assert not worker.blocked
    assert "model_not_found" in worker.stats.last_error


def test_two_models_each_reach_their_own_capacity():
    limits = {"small": (60, 30_000), "big": (500, 200_000)}
    server = ModelServer(limits)
    engine = engine_for(server, in_flight_per_key=64)
    # a small line in nine, as their capacities are; 500-token prompts + 600 max_tokens: tokens bind
    models = ["small" if i % 9 == 0 else "big" for i in range(1000)]
    seconds = 120
    run(engine, seconds, models, prompt=2000, max_tokens=600)
    for model, (_, tpm) in limits.items():
        arrivals = [t for _, t, _, _ in server.sent(model)]
        start, end = min(arrivals), max(arrivals)
        used = sum(c for _, _, _, c in server.sent(model))
        capacity = tpm + tpm * (end - start) / MINUTE
        assert used / capacity >= 0.9, (model, used, capacity)
        assert len(server.sent(model, status=429)) <= 1


# ---------------------------------------------------------------- the settings


def test_a_bad_scope_is_one_line_naming_the_file_and_the_budget():
    with pytest.raises(ConfigError) as err:
        build_config(
            {"budgets": [{"name": "tokens", "limits": ["10/1m"], "scope": "model"}]},
            "my.toml",
            keys_needed=False,
        )
    assert str(err.value).startswith("my.toml: budgets: budget 'tokens': scope must be one of")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r'my.toml: keys.scope: must be "key" or "key\+model"'):
        build_config({"keys": {"secrets": ["k"], "scope": "model"}}, "my.toml")
    with pytest.raises(ConfigError, match="target.model_field"):
        build_config({"target": {"model_field": ""}}, "my.toml", keys_needed=False)


def test_the_presets_hold_their_limits_per_key_and_model():
    for preset in ("openai", "anthropic"):
        es = load_config(preset=preset, overrides={"keys": {"secrets": ["k-0000000000"]}}).engine_settings
        assert es.key_per_model and es.per_model and es.target.model_field == "model"
        assert all(b.scope == "key+model" for b in es.budgets)
