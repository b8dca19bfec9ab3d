"""The bill outside the engine: the [prices] section and --max-cost in the config, the dry run's
plan of a workload, the summary's and report's spend, the Prometheus series, the header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from ratedeck.config import load_config
from ratedeck.config.pricing import user_prices
from ratedeck.config.save import to_toml_dict
from ratedeck.console.widgets.run_bar import header_text
from ratedeck.engine.limits.costs import CostModel
from ratedeck.engine.llm.prices import Price, estimate_range_usd
from ratedeck.engine.settings import ConfigError
from ratedeck.engine.snapshot import Snapshot, Spend, SpendRow
from ratedeck.runner.dryrun import plan, table
from ratedeck.runner.headless import summary_lines
from ratedeck.runner.money import spend_report
from ratedeck.runner.prometheus import families

SECRET = "sk-test-0123456789abcdef"


def config(tmp_path: Path, toml: str = "", **run):
    path = tmp_path / "ratedeck.toml"
    path.write_text(toml)
    overrides = {"target": {"url": "http://127.0.0.1:9"}, "keys": {"secrets": [SECRET, SECRET[::-1]]}}
    if run:
        overrides["run"] = run
    return load_config(str(path), "openai", overrides)


def test_a_prices_section_overrides_and_adds_models_and_reaches_the_engine_as_data(tmp_path):
    cfg = config(
        tmp_path,
        '[prices."gpt-4o-mini"]\ninput = 1.0\noutput = 2.0\n\n[prices."my-model"]\ninput = 0.5\noutput = 1.5\n',
    )
    prices = cfg.engine_settings.prices
    assert prices["gpt-4o-mini"] == Price(1.0, 2.0)  # replaced whole
    assert prices["my-model"] == Price(0.5, 1.5)
    assert prices["claude-haiku-4-5"].output > 0  # both providers' tables, whatever the preset
    assert (
        to_toml_dict(cfg)["prices"]
        == user_prices(prices)
        == {
            "gpt-4o-mini": {"input": 1.0, "output": 2.0},
            "my-model": {"input": 0.5, "output": 1.5},
        }
    )


@pytest.mark.parametrize(
    ("toml", "where"),
    [
        ('[prices."m"]\ninput = -1\noutput = 2\n', 'prices."m".input'),
        ('[prices."m"]\ninput = 1\n', 'prices."m".output'),
        ('[prices."m"]\ninput = 1\noutput = 2\nfree = 0\n', 'prices."m".free'),
        ("prices = 3\n", "prices"),
    ],
)
def test_a_bad_prices_section_is_one_error_naming_the_file_and_the_key(tmp_path, toml, where):
    with pytest.raises(ConfigError) as exc:
        config(tmp_path, toml)
    assert "ratedeck.toml" in str(exc.value) and where in str(exc.value)


def test_max_cost_takes_dollars_and_refuses_anything_else(tmp_path):
    assert config(tmp_path, max_cost="$2.50").engine_settings.max_cost == 2.5
    assert config(tmp_path, max_cost=0.3).engine_settings.max_cost == 0.3
    for bad in (0, -1, "two dollars", True):
        with pytest.raises(ConfigError, match="max_cost"):
            config(tmp_path, max_cost=bad)


def lines(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(model: str, chars: int, max_tokens: int | None = None) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "x" * chars}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return {"_path": "/v1/chat/completions", "_body": body}


def test_the_dry_run_adds_up_each_models_tokens_and_range_and_says_an_unpriced_one(tmp_path):
    work = lines(
        tmp_path,
        [chat("gpt-4o-mini", 400, 100)] * 3
        + [chat("gpt-4o", 4000)]
        + [chat("mystery-1", 40, 10), {"_path": "/v1/chat/completions", "q": 1}],
    )
    cfg = config(tmp_path)
    cfg = cfg.replace(engine_settings=_with_file(cfg.engine_settings, work))
    run = plan(cfg.engine_settings)
    bills = {b.model: b for b in run.models}
    assert run.requests == 6 and run.sent == 0
    assert (bills["gpt-4o-mini"].input_tokens, bills["gpt-4o-mini"].output_tokens_max) == (300, 300)
    assert bills["gpt-4o"].output_tokens_max == 1024  # no max_tokens: the preset's [costs] max_tokens
    low, high = estimate_range_usd(Price(0.15, 0.60), 300, 300)
    assert (bills["gpt-4o-mini"].usd_min, bills["gpt-4o-mini"].usd_max) == pytest.approx((low, high))
    assert bills["mystery-1"].usd_min is None and run.unpriced == ["mystery-1"]
    assert run.usd_min == pytest.approx(low + 1000 * 2.5e-6)
    assert bills["(no model)"].requests == 1 and bills["(no model)"].usd_max == 0.0
    printed = "\n".join(table(run))
    assert '[prices."mystery-1"]' in printed and "+ mystery-1 unknown" in printed
    assert "least time" in printed


def _with_file(es, path: Path):
    import dataclasses

    return dataclasses.replace(es, workload=dataclasses.replace(es.workload, file=str(path)))


def test_the_dry_runs_least_time_is_what_the_told_limits_allow_the_whole_job(tmp_path):
    """2 keys of 10 per second (sliding) and 45 requests: 20 at once, 20 more at 1 s, 5 at 2 s.
    The preset's token budget (200,000 a minute, a bucket) never binds these small prompts."""
    work = lines(tmp_path, [chat("gpt-4o-mini", 40, 10)] * 45)
    cfg = load_config(
        None,
        "openai",
        {
            "target": {"url": "http://127.0.0.1:9"},
            "keys": {"secrets": [SECRET, SECRET[::-1]], "limits": ["10/1s"]},
            "workload": {"file": str(work)},
        },
    )
    assert plan(cfg.engine_settings).least_s == pytest.approx(2.0)
    no_limit = load_config(
        None,
        None,
        {
            "target": {"url": "http://127.0.0.1:9"},
            "keys": {"secrets": [SECRET]},
            "workload": {"file": str(work)},
        },
    )
    assert plan(no_limit.engine_settings).least_s is None  # not told: learned from the first answer


SPEND = Spend(
    (
        SpendRow("gpt-4o-mini", "k1", 10, 1000, 500, 0.0012),
        SpendRow("gpt-4o-mini", "k2", 5, 500, 250, 0.0006),
        SpendRow("mystery-1", "k1", 2, 10, 10, None),
    ),
    0.0018,
    ("mystery-1",),
    0.0004,
    0.01,
    True,
)


def test_the_summary_the_report_and_the_header_say_the_bill_per_model_and_key():
    snap = Snapshot(spend=SPEND)
    text = "\n".join(summary_lines(snap))
    assert "spend        $0.0018 spent (gpt-4o-mini $0.0018, mystery-1 unknown)" in text
    assert "no price: mystery-1" in text and "cap $0.01 reached" in text
    assert "  k2 gpt-4o-mini: 5 answers, 500 in / 250 out tokens, $0.0006" in text
    assert "k1 mystery-1: 2 answers, 10 in / 10 out tokens, unknown" in text
    report = spend_report(SPEND)
    assert report is not None
    assert report["by_model"] == {"gpt-4o-mini": pytest.approx(0.0018), "mystery-1": None}
    assert report["capped"] is True and report["rows"][2]["usd"] is None
    header = header_text(snap)
    assert (
        "spent" in header and "$0.0018" in header and "cap $0.01 reached" in header and "1 unpriced" in header
    )
    assert "spent" not in header_text(Snapshot())


def test_prometheus_has_the_cost_per_model_and_key_and_no_sample_for_an_unknown_price():
    registry = CollectorRegistry()

    class Collector:
        def collect(self):
            return families(Snapshot(spend=SPEND))

    registry.register(Collector())
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("ratedeck_cost_usd_total", (("key", "k2"), ("model", "gpt-4o-mini")))] == 0.0006
    assert not [k for k in samples if k[0] == "ratedeck_cost_usd_total" and ("model", "mystery-1") in k[1]]
    assert samples[("ratedeck_cost_cap_usd", ())] == 0.01
    assert SECRET not in generate_latest(registry).decode()


def test_the_cost_model_used_for_the_reservation_is_the_configs(tmp_path):
    cfg = config(tmp_path)
    costs = cfg.engine_settings.costs
    assert (
        CostModel(costs.estimate, costs.max_tokens).units(chat("gpt-4o", 8)["_body"])["output_tokens"] == 1024
    )


def test_one_cap_cannot_be_shared_by_several_processes(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "--preset", "openai", "--target", "http://127.0.0.1:9"]
        + ["--keys", f"{SECRET},{SECRET[::-1]}", "--procs", "2", "--max-cost", "1", "--no-ui"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        "--procs: above 1 cannot share one --max-cost cap" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_a_dry_run_needs_no_target_and_says_the_presets_limits_are_a_start(tmp_path):
    # Nothing is sent, so a real API's preset plans without its URL; its limits are where a
    # key starts (each learns its tier from its first answer), and the plan says so.
    work = lines(tmp_path, [chat("gpt-4o-mini", 40, 10)] * 5)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ratedeck.runner.cli",
            "--preset",
            "openai",
            "--keys",
            f"{SECRET},{SECRET[::-1]}",
        ]
        + ["--workload", str(work), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 requests; nothing sent" in proc.stdout
    assert "the keys learn their tier from their first answers" in proc.stdout
    told = load_config(
        None, None, {"keys": {"secrets": [SECRET], "limits": ["10/1s"]}, "workload": {"file": str(work)}}
    )
    assert "learn their tier" not in "\n".join(table(plan(told.engine_settings)))
