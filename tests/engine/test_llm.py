"""LLM APIs, the pure parts: token estimates, the rate-limit headers, buckets followed both ways,
reservations given back, and the config that declares them (issue 24)."""

from __future__ import annotations

import json
import sys
import types
from datetime import UTC, datetime

import pytest

from ratedeck.config.load import build_config
from ratedeck.core.policy import parse_policy
from ratedeck.engine.http.delays import go_duration_bound, json_field_hook, read_quotas, rfc3339_bound
from ratedeck.engine.limits.costs import CostModel, output_tokens, prompt_tokens
from ratedeck.engine.limits.limiter import WindowLimiter
from ratedeck.engine.settings import ConfigError

# ---------------------------------------------------------------- token estimates


def test_prompt_tokens_are_a_quarter_of_the_characters_rounded_up_per_piece():
    body = {
        "system": "x" * 9,  # 3
        "messages": [
            {"role": "user", "content": "y" * 8},  # 2
            {"role": "user", "content": [{"type": "text", "text": "z" * 5}, {"type": "image"}]},  # 2
        ],
    }
    assert prompt_tokens(body) == 7
    assert prompt_tokens({"input": ["abcd", "abcde"]}) == 3  # embeddings: 1 + 2
    assert prompt_tokens({"prompt": "a" * 401}) == 101


def test_output_tokens_come_from_max_tokens_then_max_completion_tokens_then_the_default():
    assert output_tokens({"max_tokens": 300}, 1024) == 300
    assert output_tokens({"max_completion_tokens": 50}, 1024) == 50
    assert output_tokens({}, 1024) == 1024
    assert output_tokens({"max_tokens": True}, 7) == 7  # not a count


def test_a_body_costs_its_input_plus_its_output_in_tokens():
    units = CostModel("chars/4", 256).units(
        {"messages": [{"role": "user", "content": "a" * 40}], "max_tokens": 90}
    )
    assert units == {"input_tokens": 10, "output_tokens": 90, "tokens": 100}
    assert CostModel().units("form")["tokens"] == 0  # no JSON body: no tokens


def test_a_hook_counts_the_input_tokens(monkeypatch):
    mod = types.ModuleType("fake_tokenizer")
    mod.count = lambda body: 42  # type: ignore[attr-defined]
    mod.units = lambda body: {"input_tokens": 5, "output_tokens": 6}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_tokenizer", mod)
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    assert CostModel("fake_tokenizer:count").units(body) == {
        "input_tokens": 42,
        "output_tokens": 8,
        "tokens": 50,
    }
    assert CostModel("fake_tokenizer:units").units(body) == {
        "input_tokens": 5,
        "output_tokens": 6,
        "tokens": 11,
    }


def test_a_cost_hook_that_cannot_load_is_one_line_naming_the_setting():
    with pytest.raises(ConfigError) as err:
        build_config({"costs": {"estimate": "no_such_module_xyz:count"}}, "my.toml", keys_needed=False)
    assert str(err.value).startswith("my.toml: costs.estimate: cannot load the cost hook")
    with pytest.raises(ConfigError, match="costs.estimate: must be"):
        build_config({"costs": {"estimate": "tiktoken"}}, "my.toml", keys_needed=False)


def test_budget_units_and_settle_are_checked_with_the_budget_named():
    base = {"name": "t", "limits": ["1000@1000/m"]}
    with pytest.raises(ConfigError, match="budget 't': unit must be one of"):
        build_config({"budgets": [base | {"unit": "bananas"}]}, "c.toml", keys_needed=False)
    with pytest.raises(ConfigError, match="budget 't': settle must be"):
        build_config({"budgets": [base | {"settle": "usage.output_tokens"}]}, "c.toml", keys_needed=False)
    cfg = build_config(
        {"budgets": [base | {"unit": "output_tokens", "settle": "usage.output_tokens"}]},
        "c.toml",
        keys_needed=False,
    )
    (spec,) = cfg.engine_settings.budgets
    assert (spec.unit, spec.settle, spec.tokens, spec.weighted) == (
        "output_tokens",
        "usage.output_tokens",
        True,
        False,
    )


def test_free_statuses_must_be_http_statuses():
    with pytest.raises(ConfigError, match="target.free_statuses: must be a list of HTTP statuses"):
        build_config({"target": {"free_statuses": [529, "x"]}}, "c.toml", keys_needed=False)


# ---------------------------------------------------------------- the headers


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("6m0s", 361.0),
        ("1.4s", 1.5),
        ("12ms", 0.013),
        ("1h2m3s", 3724.0),
        ("0s", 1.0),
        ("20", None),
        ("", None),
    ],
)
def test_openai_resets_read_as_a_bound_rounded_up_in_their_last_figure(text, bound):
    got = go_duration_bound(text)
    assert got == pytest.approx(bound) if bound is not None else got is None


def test_anthropic_resets_are_wall_clock_times_plus_their_resolution():
    now = 1_800_000_000.0
    when = datetime.fromtimestamp(now + 2.5, UTC)
    assert rfc3339_bound(
        when.isoformat(timespec="milliseconds").replace("+00:00", "Z"), now
    ) == pytest.approx(2.501)
    assert rfc3339_bound(
        when.replace(microsecond=0).isoformat().replace("+00:00", "Z"), now
    ) == pytest.approx(3.0)
    assert rfc3339_bound("yesterday", now) is None


def test_openai_headers_give_a_bucket_per_unit():
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-tokens": "2s",
    }
    by_name = {q.name: q for q in read_quotas(headers)}
    assert set(by_name) == {"requests", "tokens"}
    tokens = by_name["tokens"]
    assert (tokens.limit, tokens.remaining, tokens.reset_in_s, tokens.follow) == (30000, 29000, 3.0, True)
    assert not tokens.reset_from_time


def test_anthropic_headers_give_a_bucket_per_unit():
    now = 1_800_000_000.0
    reset = datetime.fromtimestamp(now + 1, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    headers = {}
    for unit, limit, left in (
        ("requests", 50, 49),
        ("input-tokens", 30000, 29000),
        ("output-tokens", 8000, 7000),
    ):
        headers |= {
            f"anthropic-ratelimit-{unit}-limit": str(limit),
            f"anthropic-ratelimit-{unit}-remaining": str(left),
            f"anthropic-ratelimit-{unit}-reset": reset,
        }
    quotas = read_quotas(headers, now)
    assert [(q.name, q.limit, q.remaining) for q in quotas] == [
        ("requests", 50, 49),
        ("input-tokens", 30000, 29000),
        ("output-tokens", 8000, 7000),
    ]
    assert all(q.follow and q.reset_from_time and q.reset_in_s == pytest.approx(1.001) for q in quotas)


def test_the_wait_a_429_message_names_is_read():
    hook = json_field_hook("error.message")
    text = "Rate limit reached for gpt-4o-mini on tokens per min (TPM): Limit 30000. Please try again in 1.4s. Visit"
    assert hook(429, {}, json.dumps({"error": {"message": text}})) == pytest.approx(1.5)
    assert hook(429, {}, json.dumps({"error": {"message": "You exceeded your current quota"}})) is None


# ---------------------------------------------------------------- buckets followed, reservations given back


def _bucket(text: str = "1000@1000/m") -> WindowLimiter:
    return WindowLimiter((parse_policy(text),), lambda: 0.0)


def test_a_followed_bucket_takes_the_servers_size_and_refill():
    lim = _bucket()
    assert lim.follow(0.0, 6000, counted=0, since=0, window_s=6.0)
    assert lim.capacity_tps == pytest.approx(1000.0)  # 6,000 refilled over 6 s
    assert lim.bucket().limit == 6000


def test_the_servers_count_lowers_ours_only_when_it_proves_it_too_high():
    lim = _bucket()
    lim.follow(0.0, 1000, counted=0, since=0, window_s=1000.0)  # refills 1/s: time barely moves it
    lim.record(0.0, 600)
    # Counted 100 before 200 more of ours: at most 300 now, below our 600.
    lim.follow(0.0, 1000, counted=100, since=200, window_s=None)
    assert lim.used(0.0)[0] == 300
    # A slow answer: 250 counted before 400 more of ours (650 > 300): says nothing new.
    lim.follow(0.0, 1000, counted=250, since=400, window_s=None)
    assert lim.used(0.0)[0] == 300
    # The server counted more than we think at all (someone else, a bigger tokenizer count).
    lim.follow(0.0, 1000, counted=700, since=0, window_s=None)
    assert lim.used(0.0)[0] == 700


def test_a_refund_gives_back_what_the_server_did_not_charge():
    lim = _bucket()
    lim.follow(0.0, 1000, counted=0, since=0, window_s=1000.0)
    stamp = lim.record(0.0, 400)
    lim.refund(stamp, 150, 0.0)
    assert lim.used(0.0)[0] == 250
    assert (lim.spent, lim.returned) == (400, 150)
    window = WindowLimiter((parse_policy("10/1s"),), lambda: 0.0)
    first = window.record(0.0, 3)
    window.record(0.0, 2)
    window.refund(first, 2, 0.0)
    assert window.used(0.0) == (3, 10)


def test_a_real_api_preset_without_a_target_is_one_line_and_exit_2(tmp_path):
    """The simulator speaks the study's conventions: `--preset openai` against it would only be refused."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratedeck.runner.cli",
            "--no-ui",
            "--preset",
            "openai",
            "--keys",
            "sk-proj-0123456789abcdef",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ratedeck: command line: --target: the openai preset is for the real API: give its URL with "
        "--target ('ratedeck presets openai' shows the recipe)"
    )
    assert "0123456789abcdef" not in proc.stdout + proc.stderr
