"""Properties over any input: the config loader, every header parser, the number parsers, redaction.

Each gives a value or its own refusal (ConfigError, PolicyError, ValueError,
None), never another exception, and what it gives is usable: finite, in
range, and for the config, saved and loaded back to the same settings.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import math
import string
import tomllib
from urllib.parse import quote, quote_plus

import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ratedeck.config import ConfigError as ConfigErr
from ratedeck.config import build_config, load_config, to_toml_dict
from ratedeck.core.numbers import (
    MAX_DURATION_S,
    MAX_RATE,
    number,
    parse_duration,
    parse_milliseconds,
    parse_rate,
    whole,
)
from ratedeck.core.policy import MAX_LIMIT, MAX_WINDOW_S, MIN_WINDOW_S, Policy, PolicyError, parse_policy
from ratedeck.core.secrets import MASK, redact
from ratedeck.engine.http import delays as delays_module
from ratedeck.engine.http.delays import (
    _NUMBER,
    MAX_DELAY_S,
    _number,
    advertised_policies,
    answer_hints,
    hint_names,
    json_field_hook,
    parse_retry_after,
    ratelimit_delay,
    read_quotas,
    response_delay,
    x_ratelimit_delay,
)
from ratedeck.engine.settings import EngineConfig, MessagesConfig, TargetConfig, WorkloadConfig

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- TOML values

plausible = st.one_of(
    st.integers(min_value=0, max_value=50),
    st.floats(min_value=0, max_value=50),
    st.sampled_from(["GET", "post", "burst", "poisson", "shed", "sample", "sequential", "per-request"]),
    st.sampled_from(["http://127.0.0.1:9/x", "X-Api-Key", "out.json", "10/1s", "1/1.0005s", "0.5s", "25"]),
)
scalars = st.one_of(
    plausible,
    plausible,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "adaptive", "5m", "250ms", "20/1s", "nan", "-1", "0", "1e300", "env:", "@", "auto"]),
    st.datetimes(max_value=dt.datetime(9999, 1, 1)),
    st.dates(),
)
toml_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)

FIELDS = {
    "target": [f for f in TargetConfig.__dataclass_fields__],
    "engine": [f for f in EngineConfig.__dataclass_fields__],
    "workload": [f for f in WorkloadConfig.__dataclass_fields__],
    "messages": [f for f in MessagesConfig.__dataclass_fields__],
    "keys": ["secrets", "limits", "limits_by_key", "host_limits"],
    "run": ["duration_s", "report", "plot", "seed"],
    "console": ["theme", "keymap"],
    "server": ["mode", "keys", "latency_in_ms", "escalation_base_s", "error_rate", "seed"],
    "pools": ["read", "write"],
}
GOOD = {
    "url": ["http://127.0.0.1:9/x", "https://api.example.com/v1?q=1", ""],
    "method": ["GET", "post"],
    "key_param": ["api_key", ""],
    "key_header": ["X-Api-Key", ""],
    "nonce_param": ["nonce", ""],
    "id_param": ["", "rid"],
    "params": [{"a": "b", "n": 3}, {}],
    "timeout_s": [0.5, "2s", 3],
    "delay_field": ["error.retryDelay", ""],
    "host_limit_match": ["host"],
    "follow_redirects": [True, False],
    "headroom": ["adaptive", 5, "20ms", 0],
    "headroom_initial_ms": [50, 1.5],
    "headroom_min_ms": [0, 1],
    "headroom_max_ms": [500, "1s"],
    "pacing": ["even", "burst"],
    "graveyard_path": ["", "g.jsonl"],
    "ttl_s": [1, "5m", 0.25],
    "drain_timeout_s": [0, "2s"],
    "backoff_base_ms": [10, 0],
    "backoff_cap_ms": [2000, "3s"],
    "rate": [0, 12.5, "20/1s", "600/1m", ""],
    "arrival": ["constant", "poisson"],
    "total": [0, 100, 3.0, ""],
    "calls": [1, 3],
    "pattern": ["parallel", "sequential"],
    "throttle": ["off", "auto", 25, "12.5 msg/s"],
    "excess": ["queue", "shed", "sample"],
    "sample_fraction": [0.5, 1],
    "shed_path": ["", "shed.jsonl"],
    "limits": [["10/1s", "1/1.0005s"], "7/333.3ms", ["600/1m"]],
    "limits_by_key": [{"k2": ["3/1s"]}, {}],
    "host_limits": [["50/1s"], []],
    "duration_s": [1, "5m", 0.1],
    "report": ["out.json", ""],
    "theme": ["ratedeck-light"],
    "keymap": [{"quit": "x"}],
    "latency_in_ms": [[0, 5]],
    "escalation_base_s": [1, 0.5],
    "error_rate": [0, 0.25],
    "read": [1, 8],
    "write": [2],
}
known_fields = st.sampled_from([(s, f) for s, fs in FIELDS.items() for f in fs])
field_names = st.one_of(
    known_fields,
    known_fields,
    known_fields,
    st.tuples(st.sampled_from([*FIELDS, "preset", "bogus"]), st.text(max_size=6)),
)


@st.composite
def assignment(draw):
    section, name = draw(field_names)
    good = GOOD.get(name)
    if good and draw(st.integers(0, 3)):
        return (section, name), draw(st.sampled_from(good))
    return (section, name), draw(plausible | toml_values)


settings_list = st.lists(assignment(), min_size=1, max_size=4)


def config_data(assignments) -> dict:
    data: dict = {"keys": {"secrets": ["PROP-KEY-000000001", "PROP-KEY-000000002"]}}
    for (section, name), value in assignments:
        if section == "preset":
            data["preset"] = value
            continue
        table = data.setdefault(section, {})
        if isinstance(table, dict):
            table[name] = value
    return data


def comparable(cfg):
    """The settings a saved config carries (`engine.record_path` is never saved: a recording
    is asked for per run, config/rows.py)."""
    return (
        cfg.engine_settings.target,
        cfg.engine_settings.keys,
        dataclasses.replace(cfg.engine_settings.engine, record_path=None),
        cfg.engine_settings.workload,
        cfg.engine_settings.messages,
        cfg.runner.duration_s,
        cfg.runner.report,
        cfg.runner.plot,
        cfg.engine_settings.seed,
        cfg.console.theme,
        cfg.console.keymap,
        cfg.engine_settings.host_policies,
        cfg.engine_settings.pools,
    )


@FAST
@given(settings_list)
def test_any_value_in_any_field_gives_a_config_or_one_config_error(assignments):
    data = config_data(assignments)
    try:
        cfg = build_config(data, "prop.toml")
    except ConfigErr as exc:
        assert "\n" not in str(exc) and str(exc).startswith("prop.toml: ")
        assert "PROP-KEY" not in str(exc)
        return
    assert "PROP-KEY" not in repr(cfg)
    assert (
        math.isfinite(cfg.engine_settings.arrival_rate) and 0 <= cfg.engine_settings.arrival_rate <= MAX_RATE
    )
    # what loads, saves, and loads back to the same settings
    saved = tomllib.loads(tomli_w.dumps(to_toml_dict(cfg, include_secrets=True)))
    saved.pop("preset", None)
    assert comparable(build_config(saved, "saved.toml")) == comparable(cfg)


@FAST
@given(settings_list)
def test_flag_overrides_over_the_seed_preset_never_raise_anything_else(assignments):
    data = config_data(assignments)
    data.pop("preset", None)
    try:
        load_config(overrides=data)
    except ConfigErr:
        pass


# ---------------------------------------------------------------- headers

header_text = st.text(max_size=40) | st.text(alphabet='";=,. 0123456789qwrtelimsng-+e', max_size=40)


def usable_delay(value) -> bool:
    return value is None or (isinstance(value, float) and 0.0 <= value <= MAX_DELAY_S)


@FAST
@given(header_text, header_text)
def test_every_header_parser_gives_a_value_or_none(a, b):
    assert usable_delay(parse_retry_after(a, now_wall=1e9))
    assert usable_delay(ratelimit_delay(a))
    assert usable_delay(x_ratelimit_delay(a, b, now_wall=1e9))
    for policy in advertised_policies(a):
        assert isinstance(policy, Policy) and 1 <= policy.limit <= MAX_LIMIT
        assert MIN_WINDOW_S <= policy.window_s <= MAX_WINDOW_S
    headers = {"Retry-After": a, "RateLimit": b, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": a}
    assert usable_delay(response_delay(429, headers, b, json_field_hook("a.b")))


#: Every name a hint reader looks up, in the case servers write them and in others.
HINT_NAMES = (
    "Server-Timing",
    "X-Response-Time",
    "X-Runtime",
    "X-Envoy-Upstream-Service-Time",
    "openai-processing-ms",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Used",
    "X-RateLimit-Reset",
    "X-RateLimit-Resource",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "RateLimit",
    "RateLimit-Policy",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-reset-requests",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "X-MBX-USED-WEIGHT-1M",
    "x-mbx-order-count-10s",
    "x-ratelimit-remaining",
    "Content-Type",
    "Date",
)
hint_values = header_text | st.sampled_from(
    ["100", "99", "1.000", "0", "app;dur=12.5", '"100/1s";r=99;t=1', '"100/1s";q=100;w=1', "6m0s", "1.5"]
)


@FAST
@given(st.dictionaries(st.sampled_from(HINT_NAMES), hint_values, max_size=8))
def test_readers_told_the_answers_names_read_what_they_read_without_them(headers):
    """`hint_names` only spares the readers look-ups: told the names, they read the same."""
    from multidict import CIMultiDict

    for mapping in (headers, CIMultiDict(headers)):
        names = hint_names(mapping)
        assert names is not None
        assert answer_hints(mapping, names) == answer_hints(mapping)
        assert read_quotas(mapping, 1e9, names) == read_quotas(mapping, 1e9)


count_texts = hint_values | st.sampled_from(["1796000000", "1796000000.5", "2e9", "-1", " 7 ", "1e13"])


@FAST
@given(count_texts | st.none(), count_texts | st.none(), count_texts | st.none(), count_texts | st.none())
def test_a_quota_read_once_per_text_is_the_quota_read_afresh(limit, remaining, used, reset):
    """`read_quotas` reads an X-RateLimit-* family once per set of texts (`_plain_quota`): it
    gives what reading them afresh gives (`_quota`), a reset that is a Unix time included, at
    any clock, and twice running."""
    from ratedeck.engine.http.delays import _quota

    fields = {"Limit": limit, "Remaining": remaining, "Used": used, "Reset": reset}
    headers = {f"X-RateLimit-{k}": v for k, v in fields.items() if v is not None}
    for now_wall in (1.7e9, 1.8e9):
        fresh = _quota(limit, remaining, used, reset, None, now_wall)
        for _ in range(2):
            assert read_quotas(headers, now_wall) == ((fresh,) if fresh is not None else ())


@FAST
@given(hint_values | st.text(max_size=40))
def test_server_timing_read_once_per_text_is_read_as_afresh(text):
    from ratedeck.engine.http.delays import server_time_s, server_timing_s

    for _ in range(2):
        assert server_time_s({"Server-Timing": text}) == server_timing_s(text)


@FAST
@given(st.text(max_size=12) | st.text(alphabet="0123456789.", max_size=12))
def test_a_number_read_the_short_way_is_the_number_the_full_grammar_reads(text):
    match = _NUMBER.fullmatch(text)
    expected = float(match.group(1)) if match else None
    assert _number(text) == (expected if expected is None or not math.isnan(expected) else None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
    max_leaves=6,
)


@FAST
@given(json_values | st.text(max_size=30))
def test_the_json_delay_hook_gives_a_value_or_none(node):
    import json

    body = node if isinstance(node, str) else json.dumps({"a": {"b": node}})
    assert usable_delay(json_field_hook("a.b")(429, {}, body))


# ---------------------------------------------------------------- limits, durations, rates

any_input = st.one_of(
    st.text(max_size=20),
    st.text(alphabet="0123456789./ emshinaf+-", max_size=16),
    st.floats(),
    st.integers(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@FAST
@given(any_input)
def test_parse_policy_gives_a_sane_policy_or_says_why(value):
    try:
        policy = parse_policy(value)
    except PolicyError:
        return
    assert 1 <= policy.limit <= MAX_LIMIT and MIN_WINDOW_S <= policy.window_s <= MAX_WINDOW_S


@FAST
@given(
    st.integers(min_value=1, max_value=MAX_LIMIT),
    st.floats(min_value=MIN_WINDOW_S, max_value=MAX_WINDOW_S),
)
def test_every_policy_formats_and_parses_back_exactly(limit, window):
    policy = Policy(limit, window)
    assert parse_policy(str(policy)) == policy


@FAST
@given(any_input)
def test_number_parsers_give_finite_in_range_values_or_value_errors(value):
    checks = [
        (lambda v: parse_duration(v), lambda r: 0 < r <= MAX_DURATION_S),
        (lambda v: parse_milliseconds(v), lambda r: 0 <= r),
        (lambda v: parse_rate(v), lambda r: 0 <= r <= MAX_RATE),
        (lambda v: number(v, low=0, high=10), lambda r: 0 <= r <= 10),
        (lambda v: whole(v, low=1, high=100), lambda r: isinstance(r, int) and 1 <= r <= 100),
    ]
    for parse, ok in checks:
        try:
            result = parse(value)
        except ValueError as exc:
            assert "\n" not in str(exc)
            continue
        assert not isinstance(value, bool)
        assert math.isfinite(result) and ok(result), (value, result)


@FAST
@given(st.floats(min_value=1e-6, max_value=MAX_DURATION_S / 3600), st.sampled_from(["ms", "s", "m", "h"]))
def test_durations_with_units(amount, unit):
    seconds = amount * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    assume(0 < seconds <= MAX_DURATION_S)
    assert parse_duration(f"{amount!r}{unit}") == seconds
    assert parse_duration(repr(seconds)) == seconds


@FAST
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["", "/s", "/1s", "/1m", "/500ms"]))
def test_rates_per_second(count, window):
    per = {"": 1.0, "/s": 1.0, "/1s": 1.0, "/1m": 60.0, "/500ms": 0.5}[window]
    assert parse_rate(f"{count}{window}") == count / per


# ---------------------------------------------------------------- redaction

secrets = st.text(alphabet=string.ascii_letters + string.digits + "-_/+=.", min_size=8, max_size=40)
filler = st.text(alphabet=" :;,<>()[]{}!?\n", max_size=20)


@FAST
@given(secrets, filler, filler, st.integers(min_value=0, max_value=80))
def test_a_secret_in_any_form_never_survives_redact_or_a_cut(secret, before, after, limit):
    for form in (
        secret,
        quote(secret, safe=""),
        quote_plus(secret),
        base64.b64encode(secret.encode()).decode(),
    ):
        text = before + form + after
        out = redact(text, [secret], limit=limit)
        assert secret[:4] not in out.replace(MASK, "") or secret[:4] in before + after
        assert form not in out


@FAST
@given(secrets, st.text(alphabet=string.ascii_letters, min_size=1, max_size=6))
def test_a_secret_inside_basic_auth_is_masked_at_any_offset(secret, user):
    token = base64.b64encode(f"{user}:{secret}".encode()).decode()
    out = redact(f"Authorization: Basic {token}", [secret])
    assert MASK in out and len(out.replace(MASK, "")) < len(f"Authorization: Basic {token}") - len(secret)


@FAST
@given(
    st.from_regex(delays_module._ONE_DUR, fullmatch=True)
    | st.text(alphabet="ab-; \t=dur0123456789.", max_size=30)
)
def test_server_timing_read_in_one_match_is_read_as_the_full_reader_reads_it(text):
    # A trailing empty member never matches the one-match form, and the full reader skips it.
    assert delays_module.server_timing_s(text) == delays_module.server_timing_s(text + ",")
