"""`[[endpoints]]` (config/endpoints.py, issue 41): one pool over several endpoints.

Every mistake a user can make in the table is one `ConfigError` naming the file, the key
and the value, through `load_config(path)` on a real TOML file, and through the real CLI
one line on stderr and exit 2. The happy path: each endpoint's target, labels, told
limits (Azure's RPM from its TPM, over 10 s windows) and the file's [target] under each.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ratedeck.config import load_config
from ratedeck.config.endpoints import AZURE_RPM_PER_1000_TPM, AZURE_RPM_WINDOW_S
from ratedeck.core.policy import Policy
from ratedeck.core.vocab import ApiStyle, PolicyKind
from ratedeck.engine.settings import ConfigError

EAST_KEY, WEST_KEY = "azure-east-key-00000001", "azure-west-key-00000002"


def azure(name: str = "east", key: str = "env:AZURE_EAST_KEY", **extra: str) -> str:
    """One azure-openai endpoint as TOML; `extra` adds raw `field = value` lines."""
    lines = [
        "[[endpoints]]",
        f'name = "{name}"',
        'preset = "azure-openai"',
        f'url = "https://{name}-res.openai.azure.com"',
        f'keys = "{key}"',
        *(f"{k} = {v}" for k, v in extra.items()),
    ]
    return "\n".join(lines) + "\n"


OPENAI = """
[[endpoints]]
name = "openai"
preset = "openai"
url = "https://api.openai.com"
keys = ["sk-openai-000000000001", "sk-openai-000000000002"]
"""


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("AZURE_EAST_KEY", EAST_KEY)
    monkeypatch.setenv("AZURE_WEST_KEY", WEST_KEY)
    monkeypatch.delenv("RATEDECK_NO_SUCH_KEY", raising=False)


def load(tmp_path, text: str, **kwargs):
    path = tmp_path / "pool.toml"
    path.write_text(text)
    return load_config(str(path), **kwargs)


def refused(tmp_path, text: str, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, **kwargs)
    return info.value


def one_line(exc: ConfigError, source: str, key: str, *needles: str) -> None:
    """The message is one line: the source, the key, and what was wrong (the value)."""
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    assert exc.source.endswith(source), (exc.source, text)
    assert exc.key == key, (exc.key, text)
    assert text.startswith(f"{exc.source}: {key}: "), text
    for needle in needles:
        assert needle in exc.problem, (needle, text)


# ---------------------------------------------------------------- mistakes, one line each

MISTAKES = [
    # (id, the file, the key named, what the message says)
    ("not-a-list", 'endpoints = "east"\n', "endpoints", ["list of tables", "[[endpoints]]"]),
    ("an-empty-list", "endpoints = []\n", "endpoints", ["list of tables"]),
    ("not-tables", "endpoints = [1, 2]\n", "endpoints", ["list of tables"]),
    ("a-table", '[endpoints]\nname = "east"\n', "endpoints", ["list of tables"]),
    ("unknown-field", azure(region='"eastus"'), "endpoints[0].region", ["unknown setting", "models"]),
    (
        "bad-name",
        azure().replace('"east"', '"east us!"'),
        "endpoints[0].name",
        ["letters, digits", "'east us!'"],
    ),
    ("no-name", azure().replace('name = "east"\n', ""), "endpoints[0].name", ["got None"]),
    ("a-number-name", azure().replace('"east"', "7"), "endpoints[0].name", ["got 7"]),
    ("a-long-name", azure().replace('"east"', '"' + "e" * 33 + '"'), "endpoints[0].name", ["up to 32"]),
    (
        "duplicate-name",
        azure() + azure(key="env:AZURE_WEST_KEY"),
        "endpoints[1].name",
        ["'east'", "endpoints[0]"],
    ),
    (
        "unknown-preset",
        azure().replace('"azure-openai"', '"azure"'),
        "endpoints[0].preset",
        ["unknown preset 'azure'", "azure-openai", "openai-compatible"],
    ),
    ("no-preset", azure().replace('preset = "azure-openai"\n', ""), "endpoints[0].preset", ["None"]),
    (
        "bad-url",
        azure().replace("https://east-res.openai.azure.com", "ftp://east"),
        "endpoints.east.url",
        ["http://", "'ftp://east'"],
    ),
    (
        "no-url",
        azure().replace('url = "https://east-res.openai.azure.com"\n', ""),
        "endpoints.east.url",
        ["None"],
    ),
    ("no-keys", azure().replace('keys = "env:AZURE_EAST_KEY"\n', ""), "endpoints.east.keys", ["no API keys"]),
    (
        "keys-a-number",
        azure().replace('"env:AZURE_EAST_KEY"', "5"),
        "endpoints.east.keys",
        ["list of strings"],
    ),
    (
        "env-var-unset",
        azure(key="env:RATEDECK_NO_SUCH_KEY"),
        "endpoints.east.keys",
        ["RATEDECK_NO_SUCH_KEY", "not set"],
    ),
    ("key-file-missing", azure(key="@no-such.keys"), "endpoints.east.keys", ["no-such.keys", "no such file"]),
    (
        "the-same-key-twice",
        azure() + azure("west"),
        "endpoints.west.keys",
        ["'west'", "'east'"],
    ),
    (
        "two-keys-on-azure",
        azure().replace('"env:AZURE_EAST_KEY"', '["azure-key-000000000a", "azure-key-000000000b"]'),
        "endpoints.east.keys",
        ["one key per endpoint", "2 given"],
    ),
    (
        "models-a-string",
        azure(models='"mini"'),
        "endpoints.east.models",
        ["must be a table", '"gpt-4o-mini"'],
    ),
    ("models-empty", azure(models="{}"), "endpoints.east.models", ["must be a table"]),
    (
        "a-model-a-number",
        azure(models='{ "gpt-4o-mini" = 5 }'),
        'endpoints.east.models."gpt-4o-mini"',
        ["deployment name or a table", "got 5"],
    ),
    (
        "unknown-model-field",
        azure(models='{ "gpt-4o-mini" = { deployment = "mini", rps = 2 } }'),
        'endpoints.east.models."gpt-4o-mini".rps',
        ["unknown setting", "deployment, rpm, tpm"],
    ),
    (
        "empty-deployment",
        azure(models='{ "gpt-4o-mini" = { deployment = " " } }'),
        'endpoints.east.models."gpt-4o-mini".deployment',
        ["got ' '"],
    ),
    ("empty-model-name", azure(models='{ "" = "mini" }'), "endpoints.east.models", ["1 to 80", "got ''"]),
    (
        "api-version-a-number",
        azure(api_version="20241021"),
        "endpoints.east.api_version",
        ["2024-10-21", "got 20241021"],
    ),
    ("target-not-a-table", azure(target="5"), "endpoints.east.target", ["table of [target] settings"]),
    (
        "url-inside-target",
        azure(target='{ url = "https://west-res.openai.azure.com" }'),
        "endpoints.east.target.url",
        ["endpoints.east.url"],
    ),
    (
        "api-version-inside-target",
        azure(target='{ api_version = "2024-10-21" }'),
        "endpoints.east.target.api_version",
        ["endpoints.east.api_version"],
    ),
    (
        "tpm-where-no-tokens",
        azure().replace('preset = "azure-openai"', 'preset = "github"')
        + 'models = { "gpt-4o-mini" = { tpm = 1000 } }\n',
        'endpoints.east.models."gpt-4o-mini".tpm',
        ["counts no tokens", "tpm = 1000"],
    ),
    (
        "openai-and-anthropic",
        OPENAI + azure("claude").replace("azure-openai", "anthropic"),
        "endpoints.claude.preset",
        ["'anthropic'", "input-tokens", "openai (openai)", "tokens", "one API"],
    ),
    (
        "openai-and-github",
        OPENAI + azure("gh").replace("azure-openai", "github"),
        "endpoints.gh.preset",
        ["'github'", "points", "openai (openai)"],
    ),
    (
        "target-url-in-the-file",
        '[target]\nurl = "https://api.openai.com"\n' + azure(),
        "target.url",
        ["[[endpoints]]", "its url"],
    ),
    (
        "keys-secrets-in-the-file",
        '[keys]\nsecrets = ["sk-0000000000000001"]\n' + azure(),
        "keys.secrets",
        ["[[endpoints]]", "its keys"],
    ),
    (
        "another-top-level-preset",
        'preset = "openai"\n' + azure(),
        "preset",
        ["azure-openai first", "'openai'"],
    ),
]


@pytest.mark.parametrize(("text", "key", "needles"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_every_mistake_is_one_error_naming_the_file_the_key_and_the_value(tmp_path, env, text, key, needles):
    one_line(refused(tmp_path, text), "pool.toml", key, *needles)


@pytest.mark.parametrize("value", ["0", "-1", '"x"', "true", "1.5", "1_000_000_000_000_000"])
@pytest.mark.parametrize("field", ["rpm", "tpm"])
def test_a_bad_rpm_or_tpm_is_named_with_its_value(tmp_path, env, field, value):
    text = azure(models=f'{{ "gpt-4o-mini" = {{ deployment = "mini", {field} = {value} }} }}')
    exc = refused(tmp_path, text)
    shown = {"true": "True", '"x"': "'x'", "1_000_000_000_000_000": "1000000000000000"}.get(value, value)
    one_line(exc, "pool.toml", f'endpoints.east.models."gpt-4o-mini".{field}', "at least 1", f"got {shown}")


def test_a_bad_setting_in_an_endpoint_s_target_names_the_endpoint_and_the_setting(tmp_path, env):
    exc = refused(tmp_path, azure(target="{ timeout_s = -1 }"))
    assert exc.source.endswith("pool.toml: endpoints.east") and exc.key == "target.timeout_s"
    assert "-1" in exc.problem and "\n" not in str(exc)
    exc = refused(tmp_path, azure(target="{ zzz = 1 }"))
    assert exc.key == "target.zzz" and "unknown setting" in exc.problem


def test_tpm_on_anthropic_says_its_tokens_are_counted_apart(tmp_path, env):
    """Anthropic counts input and output tokens apart (its budgets' units are not "tokens"):
    one tpm cannot tell both, and the message says so (not "counts no tokens")."""
    text = azure("claude").replace("azure-openai", "anthropic") + 'models = { "claude-x" = { tpm = 5000 } }\n'
    exc = refused(tmp_path, text)
    one_line(
        exc, "pool.toml", 'endpoints.claude.models."claude-x".tpm', "input-tokens and output-tokens", "5000"
    )
    assert "no tokens" not in exc.problem


@pytest.mark.parametrize(
    ("overrides", "flag", "needle"),
    [
        ({"target": {"url": "https://api.openai.com"}}, "--target", "give each its url there"),
        ({"keys": {"secrets": ["sk-0000000000000001"]}}, "--keys", "give each its keys there"),
    ],
)
def test_target_and_keys_flags_are_refused_with_endpoints(tmp_path, env, overrides, flag, needle):
    exc = refused(tmp_path, azure(), overrides=overrides)
    assert exc.source == "command line" and exc.key == flag
    assert "pool.toml lists [[endpoints]]" in exc.problem and needle in exc.problem


def test_a_preset_flag_other_than_the_first_endpoint_s_names_the_flag(tmp_path, env):
    exc = refused(tmp_path, azure(), preset="openai")
    assert exc.source == "command line" and exc.key == "--preset"
    assert "pool.toml lists [[endpoints]]" in exc.problem and "'openai'" in exc.problem
    # the first endpoint's own preset, named again, is no conflict
    assert load(tmp_path, azure(), preset="azure-openai").runner.preset == "azure-openai"


def test_nothing_on_a_bad_endpoints_file_is_a_traceback(tmp_path, env):
    """Odd values in every field: a ConfigError each, never another exception."""
    odd = ["5", "true", "[]", "{}", '"', '""', "[1, 2]", "{ a = 1 }", "-1", "1e400", '"\\u0007"']
    for field in ("name", "preset", "url", "keys", "models", "api_version", "target"):
        for value in odd:
            base = azure(models='{ "gpt-4o-mini" = "mini" }')
            lines = [ln for ln in base.splitlines() if not ln.startswith(f"{field} =")]
            text = "\n".join([*lines, f"{field} = {value}"]) + "\n"
            try:
                load(tmp_path, text)
            except ConfigError as exc:
                assert "\n" not in str(exc), str(exc)


# ---------------------------------------------------------------- the happy path

POOL = """
[target]
timeout_s = 30
connect_timeout_s = 4

[[endpoints]]
name = "east"
preset = "azure-openai"
url = "https://east-res.openai.azure.com"
keys = "env:AZURE_EAST_KEY"
api_version = "2024-10-21"
models = { "gpt-4o-mini" = { deployment = "mini", tpm = 20000 }, "gpt-4o" = "big" }
target = { timeout_s = 90 }

[[endpoints]]
name = "west"
preset = "azure-openai"
url = "https://west-res.openai.azure.com"
keys = "env:AZURE_WEST_KEY"
models = { "gpt-4o-mini" = { deployment = "mini", tpm = 40000, rpm = 100 } }

[[endpoints]]
name = "openai"
preset = "openai"
url = "https://api.openai.com"
keys = ["sk-openai-000000000001", "sk-openai-000000000002"]

[[endpoints]]
name = "together"
preset = "openai-compatible"
url = "https://api.together.xyz"
keys = ["tg-000000000000001"]
models = { "gpt-4o-mini" = { deployment = "meta-llama/Llama-3.3-70B", rpm = 120, tpm = 12000 } }
"""


def minute(n: int) -> Policy:
    return Policy(n, 60.0, PolicyKind.BUCKET, float(n))


def test_a_pool_loads_with_each_endpoint_s_target_keys_and_models(tmp_path, env):
    cfg = load(tmp_path, POOL)
    es = cfg.engine_settings
    east, west, openai, together = es.endpoints
    assert [e.name for e in es.endpoints] == ["east", "west", "openai", "together"]
    assert [e.preset for e in es.endpoints] == ["azure-openai", "azure-openai", "openai", "openai-compatible"]
    # the first endpoint's preset is the pool's; the run's target is the first endpoint's
    assert cfg.runner.preset == "azure-openai" and es.target.url == east.target.url
    # labels: the endpoint's name for one key, name-1, name-2 for several
    assert [(k.label, k.endpoint.name) for k in es.keys] == [
        ("east", "east"),
        ("west", "west"),
        ("openai-1", "openai"),
        ("openai-2", "openai"),
        ("together", "together"),
    ]
    assert [k.secret for k in es.keys[:2]] == [EAST_KEY, WEST_KEY]
    # each endpoint's URL and how its key travels (its preset's)
    assert east.target.url == "https://east-res.openai.azure.com"
    assert east.target.api_style is ApiStyle.AZURE and east.target.key_header == "api-key"
    assert openai.target.api_style is ApiStyle.PLAIN and openai.target.key_format == "Bearer {key}"
    assert openai.models is None and openai.serves("anything") and not east.serves("o1")
    # both wait for a first answer: openai's headers tell its limits, azure's remaining counts set the told ones
    assert openai.learn_first and east.learn_first


def test_api_version_goes_on_that_endpoint_s_target_only(tmp_path, env):
    east, west, *_ = load(tmp_path, POOL).engine_settings.endpoints
    assert east.target.api_version == "2024-10-21" and west.target.api_version is None


def test_the_file_s_target_applies_to_every_endpoint_under_each_endpoint_s_own(tmp_path, env):
    east, west, openai, together = load(tmp_path, POOL).engine_settings.endpoints
    assert east.target.timeout_s == 90.0  # its own target table wins
    assert {e.target.timeout_s for e in (west, openai, together)} == {30.0}  # the file's [target]
    assert {e.target.connect_timeout_s for e in (east, west, openai, together)} == {4.0}


def test_azure_s_rpm_follows_from_its_tpm_over_10_second_windows(tmp_path, env):
    east, west, *_ = load(tmp_path, POOL).engine_settings.endpoints
    mini = east.route("gpt-4o-mini")
    assert mini.deployment == "mini"
    # 20,000 TPM: 6 RPM per 1,000 TPM = 120 RPM, enforced as 120/6 = 20 in any 10 s
    assert AZURE_RPM_PER_1000_TPM == 6 and AZURE_RPM_WINDOW_S == 10.0
    assert mini.requests == (Policy(20, 10.0),)
    # the TPM told: a per-minute bucket that starts full and refills continuously
    assert mini.budgets == {"tokens": (minute(20000),)}
    # an rpm told is used as told, still over 10 s windows (100/6 -> 16)
    told = west.route("gpt-4o-mini")
    assert told.requests == (Policy(16, 10.0),) and told.budgets == {"tokens": (minute(40000),)}
    # a deployment name alone: limits learned (its preset's start)
    big = east.route("gpt-4o")
    assert big.deployment == "big" and big.requests == () and big.budgets == {}
    assert east.starts == {"tokens": (minute(10000),)}


def test_a_small_azure_tpm_still_allows_a_request(tmp_path, env):
    east = load(tmp_path, azure(models='{ "m" = { tpm = 100 } }')).engine_settings.endpoints[0]
    assert east.route("m").requests == (Policy(1, 10.0),)


def test_openai_compatible_limits_are_told_per_minute_buckets(tmp_path, env):
    together = load(tmp_path, POOL).engine_settings.endpoints[3]
    route = together.route("gpt-4o-mini")
    assert route.deployment == "meta-llama/Llama-3.3-70B"
    assert route.requests == (minute(120),) and route.budgets == {"tokens": (minute(12000),)}


def test_keys_are_not_read_when_not_needed(tmp_path, monkeypatch):
    monkeypatch.delenv("AZURE_EAST_KEY", raising=False)
    path = tmp_path / "pool.toml"
    path.write_text(azure())
    cfg = load_config(str(path), keys_needed=False)
    assert cfg.engine_settings.keys == () and [e.name for e in cfg.engine_settings.endpoints] == ["east"]


# ---------------------------------------------------------------- the real CLI


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            azure(models='{ "gpt-4o-mini" = { tpm = 0 } }'),
            ['endpoints.east.models."gpt-4o-mini".tpm', "got 0"],
        ),
        (azure(key="env:RATEDECK_NO_SUCH_KEY"), ["endpoints.east.keys", "RATEDECK_NO_SUCH_KEY"]),
        (azure() + azure(key="env:AZURE_WEST_KEY"), ["endpoints[1].name", "'east'"]),
    ],
    ids=["tpm-0", "env-unset", "duplicate-name"],
)
def test_the_cli_prints_one_line_and_exits_2(tmp_path, text, needles):
    (tmp_path / "pool.toml").write_text(text)
    env = {**os.environ, "AZURE_EAST_KEY": EAST_KEY, "AZURE_WEST_KEY": WEST_KEY}
    env.pop("RATEDECK_NO_SUCH_KEY", None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    proc = subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "--no-ui", "--config", "pool.toml", "--duration", "1s"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
    )
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pool.toml" in lines[0] and all(n in lines[0] for n in needles), lines[0]


def test_the_pool_in_docs_endpoints_md_loads_as_written(tmp_path, env, monkeypatch):
    """docs/endpoints.md's `pool.toml` (the issue's contract) is what the loader reads."""
    from tests.support.doc_commands import ROOT, named_files

    text = named_files((ROOT / "docs" / "endpoints.md").read_text())["pool.toml"]
    monkeypatch.setenv("OPENAI_KEYS", "sk-openai-000000000001,sk-openai-000000000002")
    es = load(tmp_path, text).engine_settings
    assert [(e.name, e.preset) for e in es.endpoints] == [
        ("east", "azure-openai"),
        ("west", "azure-openai"),
        ("openai", "openai"),
    ]
    assert [k.label for k in es.keys] == ["east", "west", "openai-1", "openai-2"]
    east, west, openai = es.endpoints
    assert east.route("gpt-4o-mini").requests == (Policy(20, 10.0),)  # 20,000 TPM: 120 RPM
    assert west.route("gpt-4o-mini").requests == (Policy(40, 10.0),)  # 40,000 TPM: 240 RPM
    assert openai.models is None


@pytest.mark.parametrize(
    "extra, key",
    [
        ('[keys]\nhost_limits = ["100/1s"]\n', "keys.host_limits"),
        ('[[budgets]]\nname = "all"\nscope = "host"\nlimits = ["100/1s"]\n', "budgets"),
    ],
)
def test_a_limit_for_the_whole_host_is_refused_in_a_pool_of_several_hosts(tmp_path, env, extra, key):
    one_line(refused(tmp_path, azure() + OPENAI + extra), "pool.toml", key, "one host", "several")


def test_an_endpoint_s_prices_are_its_own_and_a_bad_one_names_it(tmp_path, env):
    cfg = load(tmp_path, azure(prices='{ "gpt-4o-mini" = { input = 0.165, output = 0.66 } }') + OPENAI)
    east, openai = cfg.engine_settings.endpoints
    assert east.prices["gpt-4o-mini"].output == 0.66 and not openai.prices
    exc = refused(tmp_path, azure(prices='{ "gpt-4o-mini" = { input = "cheap", output = 1.0 } }'))
    assert (
        exc.key.startswith('endpoints.east.prices."gpt-4o-mini"')
        and "cheap" in str(exc)
        and "\n" not in str(exc)
    )
