"""The settings schema: one row per setting, and what is made from it (flags, TOML, docs, JSON schema)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ratedeck.config import PRESETS, build_config, load_config, to_toml_dict
from ratedeck.config.docs import (
    EXITS,
    EXITS_BEGIN,
    EXITS_END,
    KINDS,
    REFERENCE,
    SCHEMA,
    exit_codes_page,
    reference,
    schema,
    stale,
)
from ratedeck.config.flags import overrides_from_args
from ratedeck.config.load import PRESET_DIR, PRESET_META
from ratedeck.config.rows import FIELDS, GATEWAY, NO_SWITCH, ROWS, RUN
from ratedeck.config.settings import RunnerSettings
from ratedeck.core.exits import MEANING, ORDER, ExitCode
from ratedeck.core.study_server import STUDY_KEYS
from ratedeck.core.vocab import Arrival, Excess, HeadroomMode, MessagePattern, Pacing
from ratedeck.engine.settings import EngineSettings
from ratedeck.runner.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
FLAG_ROWS = [row for row in ROWS if row.flag is not None]


# ---------------------------------------------------------------- generated files


def test_the_generated_reference_and_schema_are_current():
    """docs/config-reference.md and docs/config.schema.json are what the rows make now."""
    assert stale(REPO) == [], "stale; run: python -m ratedeck.config.docs --write"


def test_a_missing_or_edited_generated_file_is_stale(tmp_path):
    assert set(stale(tmp_path)) == {REFERENCE, SCHEMA, EXITS}
    (tmp_path / "docs").mkdir()
    (tmp_path / REFERENCE).write_text(reference())
    (tmp_path / SCHEMA).write_text(json.dumps(schema(), indent=2) + "\n")
    (tmp_path / EXITS).write_text((REPO / EXITS).read_text())
    assert stale(tmp_path) == []
    (tmp_path / REFERENCE).write_text(reference().replace("in_flight_per_key", "in_flight"))
    assert stale(tmp_path) == [REFERENCE]
    (tmp_path / EXITS).write_text((REPO / EXITS).read_text().replace("| 99 |", "| 98 |"))
    assert stale(tmp_path) == [REFERENCE, EXITS]


def test_the_exit_codes_page_lists_every_code_from_the_enum():
    """docs/exit-codes.md's table is `ExitCode`: each code once with its meaning, and the order rule."""
    text = (REPO / EXITS).read_text()
    table = text[text.index(EXITS_BEGIN) : text.index(EXITS_END)]
    for code in ExitCode:
        assert table.count(f"| {int(code)} |") == 1, code
        assert MEANING[code].replace("|", "\\|") in table, code
    assert f"the first of {', '.join(str(int(c)) for c in ORDER)} is the code" in table
    assert "A run that achieved nothing fails" in text  # the prose around the table is kept


def test_the_exit_codes_page_keeps_its_prose_when_the_table_is_made_anew():
    page = f"# Title\n\nbefore\n\n{EXITS_BEGIN}\nold table\n{EXITS_END}\n\nafter\n"
    made = exit_codes_page(page)
    assert made.startswith("# Title\n\nbefore\n\n") and made.endswith("\n\nafter\n")
    assert "old table" not in made and "| 130 |" in made
    assert exit_codes_page(None).startswith("# Exit codes")


def test_the_docs_command_checks_the_files():
    out = subprocess.run(
        [sys.executable, "-m", "ratedeck.config.docs", "--check"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- one row: one flag, one key, one line


def test_every_row_is_one_reference_line_and_one_schema_property():
    text = reference()
    props = schema()["properties"]
    for row in ROWS:
        assert row.kind in KINDS, row.path
        assert text.count(f"| `{row.path}` |") == 1, row.path
        table = props[row.section]["properties"] if row.section else props
        assert row.key in table, row.path
        if row.flag is not None:
            assert f"`{row.flag.name}" in text, row.path


def _parser(command: str):
    from ratedeck.runner.commands.gateway import build_parser as gateway_parser

    return gateway_parser() if command == GATEWAY else build_parser()


def test_every_flag_row_is_a_flag_of_each_command_that_takes_it_and_of_no_other():
    names = [row.flag.name for row in FLAG_ROWS]
    assert len(names) == len(set(names)), "two rows with one flag"
    for command in (RUN, GATEWAY):
        parser = _parser(command)
        options = {s for action in parser._actions for s in action.option_strings}
        for row in FLAG_ROWS:
            assert (row.flag.name in options) == (command in row.flag.commands), (command, row.flag.name)


#: A valid value of each kind, as typed on a command line.
SAMPLES = {
    "url": "https://api.example.com/v1/x",
    "string": "X-Thing",
    "path": "out.jsonl",
    "integer": "3",
    "duration": "2s",
    "rate": "5",
    "headroom": "20",
    "table": "Accept: text/plain",
    "strings": "k-1,k-2",
    "limits": "10/1s",
    "procs": "auto",
    "in_flight": "3",
    "dollars": "$2.50",
}


@pytest.mark.parametrize("row", FLAG_ROWS, ids=lambda row: row.flag.name)
def test_each_flag_sets_the_setting_of_its_row(row):
    flag = row.flag
    if flag.switch is not NO_SWITCH:
        argv = [flag.name]
    else:
        value = flag.choices[-1] if flag.choices else SAMPLES[row.kind]
        if row.path == "target.key_format":
            value = "Token {key}"
        argv = [flag.name, value]
    section, key = row.path.split(".")
    overrides = overrides_from_args(_parser(row.flag.commands[0]).parse_args(argv))
    assert key in overrides[section], argv
    if flag.switch is not NO_SWITCH:
        assert overrides[section][key] == flag.switch


def test_the_run_flags_that_are_no_engine_setting_are_rows_too():
    """--procs, --interval and --metrics-* are [run] settings: a flag, a key of the file, a reference line."""
    args = build_parser().parse_args(
        ["--procs", "auto", "--interval", "500ms", "--metrics-port", "0", "--metrics-host", "::1"]
        + ["--metrics-linger", "2m"]
    )
    assert overrides_from_args(args)["run"] == {
        "procs": "auto",
        "interval_s": 0.5,
        "metrics_port": 0,
        "metrics_host": "::1",
        "metrics_linger_s": 120.0,
    }
    run = build_config(
        {"run": {"procs": 3, "interval_s": "2s", "metrics_port": 9100}}, keys_needed=False
    ).runner
    assert (run.procs, run.interval_s, run.metrics_port, run.metrics_host) == (3, 2.0, 9100, "127.0.0.1")
    assert to_toml_dict(load_config(preset="study", overrides={"run": {"procs": 3}}))["run"]["procs"] == 3
    saved = to_toml_dict(load_config(preset="study")).get("run", {})
    assert not {"procs", "interval_s", "metrics_port", "metrics_host", "metrics_linger_s"} & set(saved)
    for bad, needle in (({"procs": 0}, "at least 1"), ({"interval_s": "10ms"}, "run.interval_s")):
        with pytest.raises(Exception, match=needle):
            build_config({"run": bad}, keys_needed=False)


def test_flag_help_shows_defaults_and_the_demo_preset_from_the_rows_and_its_file():
    """A default in --help is generated from the row's field and the demo preset's file, never
    written by hand: each flag's help names its default once, and the demo preset's value where
    it differs."""
    from ratedeck.config.flags import DEMO_PRESET, demo_value, flag_help, shown_value

    helps = {row.flag.name: flag_help(row) for row in FLAG_ROWS}
    assert helps["--timeout"].endswith(f"(default 10s; 1s with --preset {DEMO_PRESET})")
    assert helps["--rate"].endswith(f"(default: capacity; 90 with --preset {DEMO_PRESET})")
    assert helps["--method"] == "HTTP method (default GET)"
    for row in FLAG_ROWS:
        text = helps[row.flag.name]
        assert text.count("default") <= 1 or "(default:" in text, text
        if row.flag.switch is NO_SWITCH and "(default" not in (row.flag.help or row.help):
            default = shown_value(row, row.default)
            assert default is None or f"default {default}" in text, text
        demo = demo_value(row)
        if demo is not None and demo != shown_value(row, row.default):
            assert f"{demo} with --preset {DEMO_PRESET}" in text, text


def test_a_changed_preset_file_changes_the_help(monkeypatch):
    from ratedeck.config import flags

    row = next(row for row in FLAG_ROWS if row.path == "target.timeout_s")
    monkeypatch.setitem(flags.PRESETS, flags.DEMO_PRESET, {"target": {"timeout_s": 3}})
    assert flags.flag_help(row).endswith(f"(default 10s; 3s with --preset {flags.DEMO_PRESET})")


def test_no_flag_sets_nothing():
    assert overrides_from_args(build_parser().parse_args([])) == {}


def test_the_rows_are_the_settings_objects_fields():
    """Every field a layer receives has a row, and every row a field (or a table its layer reads)."""
    sections = {"target", "engine", "workload", "messages", "console"}
    for section in sections:
        (cls,) = FIELDS[section]
        rows = [row.key for row in ROWS if row.section == section]
        assert rows == [f.name for f in dataclasses.fields(cls)], section
    run = {row.key for row in ROWS if row.section == "run"}
    not_in_file = {"preset", "preset_needs_target", "key_sources"}  # set by --preset and [keys] secrets
    assert run == {f.name for f in dataclasses.fields(RunnerSettings)} - not_in_file | {"seed", "max_cost"}
    engine_parts = {f.name for f in dataclasses.fields(EngineSettings)}
    assert {"budgets", "paths", "pools"} <= engine_parts
    assert "cooldown" not in {row.key for row in ROWS}


def test_choices_reach_the_engine_as_enums():
    cfg = load_config(
        preset="study",
        overrides={
            "engine": {"pacing": "burst", "headroom": "adaptive"},
            "workload": {"arrival": "poisson"},
            "messages": {"pattern": "sequential", "excess": "shed"},
        },
    )
    e = cfg.engine_settings
    assert e.engine.pacing is Pacing.BURST and e.engine.headroom is HeadroomMode.ADAPTIVE
    assert e.workload.arrival is Arrival.POISSON
    assert e.messages.pattern is MessagePattern.SEQUENTIAL and e.messages.excess is Excess.SHED
    saved = to_toml_dict(cfg)
    assert saved["engine"]["pacing"] == "burst" and type(saved["engine"]["pacing"]) is str
    assert load_config(preset="study", overrides=saved).engine_settings == e


def test_the_study_preset_is_a_data_file_with_the_study_keys():
    assert (PRESET_DIR / "study.toml").is_file()
    assert list(PRESETS)[0] == "study"
    assert PRESETS["study"]["keys"]["secrets"] == list(STUDY_KEYS)


def test_seed_is_an_old_name_for_the_study_preset_and_says_so(tmp_path, capsys):
    assert "seed" not in PRESETS  # an alias, not a preset of its own
    study = load_config(preset="study")
    assert capsys.readouterr().err == ""
    by_flag = load_config(preset="seed")
    assert capsys.readouterr().err == 'preset "seed" is an old name for "study"\n'
    file = tmp_path / "old.toml"
    file.write_text('preset = "seed"\n')
    by_file = load_config(str(file))
    assert capsys.readouterr().err == 'preset "seed" is an old name for "study"\n'
    for cfg in (by_flag, by_file):
        assert cfg.runner.preset == "study"
        assert cfg.engine_settings == study.engine_settings and cfg.server == study.server


# ---------------------------------------------------------------- the JSON schema


def _types(value: Any) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, dict):
        return {"object"}
    return {"null"}


def problems(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """The subset of JSON schema config.schema.json uses: type, enum, const, anyOf, properties, items."""
    if "anyOf" in schema:
        if all(problems(value, s, where) for s in schema["anyOf"]):
            return [f"{where}: matches none of anyOf"]
        return []
    if "const" in schema and value != schema["const"]:
        return [f"{where}: not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not one of {schema['enum']}"]
    if "type" in schema:
        wanted = {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
        if not wanted & _types(value):
            return [f"{where}: {type(value).__name__} is not {sorted(wanted)}"]
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                out += problems(v, props[k], f"{where}.{k}")
            elif extra is False:
                out.append(f"{where}.{k}: not allowed")
            elif isinstance(extra, dict):
                out += problems(v, extra, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{where}[{i}]")
    return out


def test_the_checker_can_fail():
    s = schema()
    assert problems({"engine": {"in_flight": 3}}, s) == [".engine.in_flight: not allowed"]
    assert problems({"engine": {"in_flight_max": "many"}}, s)
    assert problems({"engine": {"pacing": "fast"}}, s)
    assert problems({"bogus": {}}, s)


@pytest.mark.parametrize("path", sorted(PRESET_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_the_schema_accepts_every_preset_file(path):
    data = tomllib.loads(path.read_text())
    for meta in PRESET_META:  # what a preset says of itself (`ratedeck presets`), not a config setting
        data.pop(meta, None)
    assert problems(data, schema()) == []


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_schema_accepts_a_saved_config(preset, monkeypatch):
    monkeypatch.setenv("MY_KEYS", "key-a secret-a,key-b secret-b")
    overrides = {
        "keys": {"secrets": ["env:MY_KEYS"]},
        "run": {"fail_on": ["rejected_429>0"], "report": "r.json"},
    }
    if preset != "study":
        overrides["target"] = {"url": "https://api.example.com/v1/x"}
    saved = to_toml_dict(load_config(preset=preset, overrides=overrides))
    assert problems(saved, schema()) == []


def test_the_schema_accepts_a_saved_config_with_every_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.jsonl").write_text('{"a": 1}\n')
    cfg = build_config(
        {
            "target": {
                "url": "https://api.example.com/v1/x",
                "params": {"a": 1},
                "probe_url": "https://api.example.com/health",
            },
            "keys": {"secrets": ["k-1", "k-2"], "limits_by_key": {"k2": ["5/1s"]}, "host_limits": ["30/1s"]},
            "engine": {"headroom": 25, "graveyard_path": ""},
            "workload": {"file": "work.jsonl", "total": 10},
            "messages": {"calls": 2, "throttle": "auto"},
            "pools": {"read": 4},
            "budgets": [{"name": "orders", "limits": ["5/1s"]}],
            "paths": {"/orders": {"budgets": ["orders"], "weight": 2}},
            "run": {"duration_s": "5s", "plot": True, "seed": 3, "results": "res.jsonl"},
            "console": {"theme": "ratedeck-light", "keymap": {"pause_key": "x"}},
            "server": {"mode": "study"},
        }
    )
    saved = to_toml_dict(cfg)
    assert {"pools", "budgets", "paths", "messages", "console", "server"} <= set(saved)
    assert problems(saved, schema()) == []
    assert build_config(saved | {"keys": saved["keys"] | {"secrets": ["k-1", "k-2"]}}).engine_settings == (
        cfg.engine_settings
    )


def test_the_reference_names_every_section():
    text = reference()
    for section in ("[target]", "[keys]", "[engine]", "[workload]", "[messages]", "[run]", "[console]"):
        assert re.search(rf"^## {re.escape(section)}$", text, re.M), section
