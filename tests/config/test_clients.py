"""`[[gateway.clients]]` (config/clients.py, issue 42): a gateway's clients, each with its token,
priority, weight and quotas.

Every mistake a user can make in the table is one `ConfigError` naming the file, the key and
the value: through `load_config(path)` on a real TOML file for what the file alone says, through
the gateway command's own resolution (`gateway_settings`: each token read from its `env:VAR` or
`@FILE`, no two alike, none named like `--gateway-token`'s "default" client) for the rest, and
through the real CLI in a child process: one line on stderr, exit 2, no traceback. The happy
path: two clients parsed into the `FlowSpec` values the engine schedules, and docs/gateway.md's
`team.toml` and command as written.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ratedeck.config import load_config
from ratedeck.config.clients import MAX_WEIGHT, parse_clients
from ratedeck.config.load import build_config
from ratedeck.config.settings import GatewaySettings
from ratedeck.core.vocab import Priority
from ratedeck.engine.settings import ConfigError, FlowSpec
from ratedeck.gateway.service import DEFAULT_CLIENT, gateway_clients
from ratedeck.runner.commands.gateway import build_parser, gateway_settings
from ratedeck.runner.commands.run import load_run_config

CHAT, NIGHTLY, GATEWAY = "chat-token-0000000001", "nightly-token-000002", "gateway-token-000003"
#: A pool for the clients: the openai preset (tokens counted, shipped prices) on a port nobody serves.
OPENAI = 'preset = "openai"\n[target]\nurl = "http://127.0.0.1:9"\n[keys]\nsecrets = ["sk-team-0000000000000001"]\n'
#: A pool that counts no tokens: GitHub's REST API (requests and points).
GITHUB = OPENAI.replace('"openai"', '"github"')


def client(name: str = "chat", token: str = "env:CHAT_TOKEN", **extra: str) -> str:
    """One `[[gateway.clients]]` table as TOML; `extra` adds raw `field = value` lines."""
    lines = ["[[gateway.clients]]", f'name = "{name}"', f'token = "{token}"']
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


NIGHTLY_CLIENT = client("nightly", "env:NIGHTLY_TOKEN", priority='"batch"')


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("CHAT_TOKEN", CHAT)
    monkeypatch.setenv("NIGHTLY_TOKEN", NIGHTLY)
    monkeypatch.setenv("GATEWAY_TOKEN", GATEWAY)
    monkeypatch.delenv("RATEDECK_NO_SUCH_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-ratedeck-xdg")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "team.toml"
    path.write_text(text)
    return str(path)


def refused(tmp_path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return info.value


def settings(tmp_path, text: str, *flags: str) -> GatewaySettings:
    """What `ratedeck gateway --config team.toml FLAGS` serves with: the command's own parser,
    loader and token resolution (`gateway_settings`)."""
    args = build_parser().parse_args(["--config", write(tmp_path, text), *flags])
    cfg, _ = load_run_config(args)
    return gateway_settings(args, cfg)


def resolution_refused(tmp_path, text: str, *flags: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, text, *flags)
    return info.value


def one_line(exc: ConfigError, key: str, *needles: str, source: str | None = "team.toml") -> None:
    """The message is one line: the source, the key, and what was wrong (the value)."""
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    if source is not None:
        assert exc.source.endswith(source), (exc.source, text)
    assert exc.key == key, (exc.key, text)
    assert text.startswith(f"{exc.source}: {key}: "), text
    for needle in needles:
        assert needle in exc.problem, (needle, text)


# ---------------------------------------------------------------- mistakes in the file, one line each

#: (id, the config's text, the key named, what the message must say)
MISTAKES = [
    (
        "unknown-field",
        OPENAI + client(prio='"batch"'),
        "gateway.clients[0].prio",
        ["unknown field", "priority"],
    ),
    (
        "unknown-field-second",
        OPENAI + client() + client("nightly", "env:NIGHTLY_TOKEN", tpm="1000"),
        "gateway.clients[1].tpm",
        ["unknown field", "tokens_per_minute"],
    ),
    ("name-space", OPENAI + client("my client"), "gateway.clients[0].name", ["short name", "'my client'"]),
    ("name-long", OPENAI + client("c" * 33), "gateway.clients[0].name", ["up to 32", "c" * 33]),
    ("name-leading-dash", OPENAI + client("-chat"), "gateway.clients[0].name", ["'-chat'"]),
    (
        "name-missing",
        OPENAI + '[[gateway.clients]]\ntoken = "env:CHAT_TOKEN"\n',
        "gateway.clients[0].name",
        ["short name", "None"],
    ),
    (
        "name-not-text",
        OPENAI + '[[gateway.clients]]\nname = 7\ntoken = "env:CHAT_TOKEN"\n',
        "gateway.clients[0].name",
        ["got 7"],
    ),
    (
        "name-duplicate",
        OPENAI + client() + client("chat", "env:NIGHTLY_TOKEN"),
        "gateway.clients[1].name",
        ["'chat' is already the name of gateway.clients[0]"],
    ),
    (
        "token-missing",
        OPENAI + '[[gateway.clients]]\nname = "chat"\n',
        "gateway.clients[0].token",
        ["env:VAR, @FILE or the token itself"],
    ),
    ("token-blank", OPENAI + client(token="   "), "gateway.clients[0].token", ["must be the client's token"]),
    (
        "token-not-text",
        OPENAI + '[[gateway.clients]]\nname = "chat"\ntoken = 12345\n',
        "gateway.clients[0].token",
        ["must be the client's token"],
    ),
    (
        "token-duplicate-literal",
        OPENAI + client(token=CHAT) + client("nightly", CHAT),
        "gateway.clients[1].token",
        ["same as client 'chat'", "each needs its own"],
    ),
    (
        "token-duplicate-as-written",
        OPENAI + client() + client("nightly", "env:CHAT_TOKEN"),
        "gateway.clients[1].token",
        ["same as client 'chat'"],
    ),
    ("priority-unknown", OPENAI + client(priority='"urgent"'), "gateway.clients[0].priority", ["'urgent'"]),
    (
        "priority-number",
        OPENAI + client(priority="1"),
        "gateway.clients[0].priority",
        ["interactive", "got 1"],
    ),
    ("weight-0", OPENAI + client(weight="0"), "gateway.clients[0].weight", ["above 0", "got 0"]),
    ("weight-negative", OPENAI + client(weight="-2"), "gateway.clients[0].weight", ["got -2"]),
    ("weight-bool", OPENAI + client(weight="true"), "gateway.clients[0].weight", ["got True"]),
    ("weight-text", OPENAI + client(weight='"3"'), "gateway.clients[0].weight", ["got '3'"]),
    ("weight-nan", OPENAI + client(weight="nan"), "gateway.clients[0].weight", ["got nan"]),
    ("weight-inf", OPENAI + client(weight="inf"), "gateway.clients[0].weight", ["got inf"]),
    (
        "weight-huge",
        OPENAI + client(weight="2_000_000"),
        "gateway.clients[0].weight",
        ["1,000,000", "got 2000000"],
    ),
    ("rpm-0", OPENAI + client(requests_per_minute="0"), "gateway.clients[0].requests_per_minute", ["got 0"]),
    (
        "rpm-negative",
        OPENAI + client(requests_per_minute="-60"),
        "gateway.clients[0].requests_per_minute",
        ["got -60"],
    ),
    (
        "rpm-fraction",
        OPENAI + client(requests_per_minute="1.5"),
        "gateway.clients[0].requests_per_minute",
        ["whole number", "got 1.5"],
    ),
    (
        "rpm-text",
        OPENAI + client(requests_per_minute='"60"'),
        "gateway.clients[0].requests_per_minute",
        ["got '60'"],
    ),
    (
        "rpm-bool",
        OPENAI + client(requests_per_minute="true"),
        "gateway.clients[0].requests_per_minute",
        ["got True"],
    ),
    ("tpm-0", OPENAI + client(tokens_per_minute="0"), "gateway.clients[0].tokens_per_minute", ["got 0"]),
    (
        "tpm-fraction",
        OPENAI + client(tokens_per_minute="100.5"),
        "gateway.clients[0].tokens_per_minute",
        ["whole number", "got 100.5"],
    ),
    ("usd-0", OPENAI + client(usd_per_day="0"), "gateway.clients[0].usd_per_day", ["above 0", "got 0"]),
    ("usd-negative", OPENAI + client(usd_per_day="-1.5"), "gateway.clients[0].usd_per_day", ["got -1.5"]),
    ("usd-text", OPENAI + client(usd_per_day='"5"'), "gateway.clients[0].usd_per_day", ["got '5'"]),
    ("usd-inf", OPENAI + client(usd_per_day="inf"), "gateway.clients[0].usd_per_day", ["got inf"]),
    (
        "tpm-without-token-budgets",
        GITHUB + client(tokens_per_minute="1000"),
        "gateway.clients[0].tokens_per_minute",
        ["counts no tokens", "requests_per_minute"],
    ),
    (
        "refuse-without-quota",
        OPENAI + client(quota='"refuse"'),
        "gateway.clients[0].quota",
        ['"refuse" needs a quota', "requests_per_minute, tokens_per_minute or usd_per_day"],
    ),
    (
        "quota-unknown",
        OPENAI + client(requests_per_minute="10", quota='"block"'),
        "gateway.clients[0].quota",
        ['"wait" or "refuse"', "got 'block'"],
    ),
    ("quota-bool", OPENAI + client(quota="true"), "gateway.clients[0].quota", ["got True"]),
    ("clients-number", OPENAI + "[gateway]\nclients = 3\n", "gateway.clients", ["list of tables"]),
    ("clients-empty", OPENAI + "[gateway]\nclients = []\n", "gateway.clients", ["list of tables"]),
    ("clients-names", OPENAI + '[gateway]\nclients = ["chat"]\n', "gateway.clients", ["list of tables"]),
    (
        "clients-one-table",
        OPENAI + '[gateway.clients]\nname = "chat"\ntoken = "env:CHAT_TOKEN"\n',
        "gateway.clients",
        ["[[gateway.clients]]"],
    ),
]

#: The one message that falls short of the house style (file, key and value): marked, not hidden.
WRONG: dict[str, str] = {}  # a case whose check is known wrong: marked xfail(strict) with the reason


def _case(case_id: str, *values):
    marks = [pytest.mark.xfail(strict=True, reason=WRONG[case_id])] if case_id in WRONG else []
    return pytest.param(*values, id=case_id, marks=marks)


@pytest.mark.parametrize(("text", "key", "needles"), [_case(m[0], *m[1:]) for m in MISTAKES])
def test_a_mistake_in_the_file_is_one_line_naming_the_key(tmp_path, env, text, key, needles):
    one_line(refused(tmp_path, text), key, *needles)


def test_a_weight_of_the_most_allowed_and_a_small_one_are_taken(tmp_path, env):
    cfg = load_config(
        write(tmp_path, OPENAI + client(weight=f"{MAX_WEIGHT}") + client("b", "x-tok", weight="0.01"))
    )
    assert [c.flow.weight for c in cfg.gateway.clients] == [float(MAX_WEIGHT), 0.01]


def test_build_config_refuses_clients_that_are_not_a_list():
    """A dict as read from TOML, through `build_config`: the key and the source as given."""
    data = {"target": {"url": "http://127.0.0.1:9"}, "keys": {"secrets": ["sk-0000000000000001"]}}
    for clients in (3, "chat", {"name": "chat"}, [3], []):
        with pytest.raises(ConfigError) as info:
            build_config({**data, "gateway": {"clients": clients}}, "team.toml")
        one_line(info.value, "gateway.clients", "list of tables")


def test_build_config_names_the_table_of_a_mistake():
    data = {"target": {"url": "http://127.0.0.1:9"}, "keys": {"secrets": ["sk-0000000000000001"]}}
    clients = [{"name": "chat", "token": "a-token"}, {"name": "nightly", "token": "b-token", "weight": -1}]
    with pytest.raises(ConfigError) as info:
        build_config({**data, "gateway": {"clients": clients}}, "team.toml")
    one_line(info.value, "gateway.clients[1].weight", "got -1")


def test_usd_per_day_needs_prices():
    """`priced=False`: the run has no prices to charge a USD quota by. Every run loads the shipped
    price tables (config/pricing.py), so through a config this never happens; a model with no
    price is refused per request instead (the gateway's 400 model_not_priced)."""
    table = {"name": "chat", "token": "a-token", "usd_per_day": 5}
    with pytest.raises(ConfigError) as info:
        parse_clients([table], "team.toml", counts_tokens=True, priced=False)
    one_line(info.value, "gateway.clients[0].usd_per_day", "no prices", "[prices.")
    (parsed,) = parse_clients([table], "team.toml", counts_tokens=True, priced=True)
    assert parsed.flow.usd_per_day == 5.0


def test_tokens_per_minute_needs_token_budgets_and_requests_per_minute_does_not():
    with pytest.raises(ConfigError) as info:
        parse_clients(
            [{"name": "c", "token": "t", "tokens_per_minute": 10}], "x.toml", counts_tokens=False, priced=True
        )
    one_line(info.value, "gateway.clients[0].tokens_per_minute", "counts no tokens", source="x.toml")
    (c,) = parse_clients(
        [{"name": "c", "token": "t", "requests_per_minute": 10}], "x.toml", counts_tokens=False, priced=True
    )
    assert c.flow.requests_per_minute == 10


# ---------------------------------------------------------------- the command's token resolution

#: (id, the config's text, the command's flags, the key named, what the message must say)
RESOLUTION = [
    (
        "env-unset",
        OPENAI + client(token="env:RATEDECK_NO_SUCH_TOKEN"),
        [],
        "gateway.clients[0].token",
        ["RATEDECK_NO_SUCH_TOKEN", "not set"],
    ),
    (
        "env-unset-second",
        OPENAI + client() + client("nightly", "env:RATEDECK_NO_SUCH_TOKEN"),
        [],
        "gateway.clients[1].token",
        ["RATEDECK_NO_SUCH_TOKEN"],
    ),
    (
        "env-holds-two",
        OPENAI + client(token="env:TWO_TOKENS"),
        [],
        "gateway.clients[0].token",
        ["must hold one token, found 2"],
    ),
    (
        "duplicate-after-env",
        OPENAI + client() + client("nightly", "env:SAME_AS_CHAT"),
        [],
        "gateway.clients[1].token",
        ["same token as 'chat'", "each client needs its own"],
    ),
    (
        "duplicate-literal-and-env",
        OPENAI + client(token=CHAT) + client("nightly", "env:CHAT_TOKEN"),
        [],
        "gateway.clients[1].token",
        ["same token as 'chat'"],
    ),
    (
        "same-as-gateway-token",
        OPENAI + client() + client("nightly", "env:GATEWAY_TOKEN"),
        ["--gateway-token", "env:GATEWAY_TOKEN"],
        "gateway.clients[1].token",
        ["same token as --gateway-token's"],
    ),
    (
        "default-beside-gateway-token",
        OPENAI + client("default"),
        ["--gateway-token", "env:GATEWAY_TOKEN"],
        "gateway.clients[0].name",
        ["'default' is the name of --gateway-token's client"],
    ),
    (
        "default-beside-file-token",
        OPENAI
        + '[gateway]\ntoken = "env:GATEWAY_TOKEN"\n'
        + client()
        + client("default", "env:NIGHTLY_TOKEN"),
        [],
        "gateway.clients[1].name",
        ["'default' is the name of"],
    ),
]


@pytest.fixture
def resolution_env(env, monkeypatch):
    monkeypatch.setenv("TWO_TOKENS", "tok-one-000000001,tok-two-000000002")
    monkeypatch.setenv("SAME_AS_CHAT", CHAT)


@pytest.mark.parametrize(
    ("text", "flags", "key", "needles"), [pytest.param(*r[1:], id=r[0]) for r in RESOLUTION]
)
def test_a_token_mistake_is_one_line_naming_the_client(tmp_path, resolution_env, text, flags, key, needles):
    # The source is not checked here: see test_a_token_mistake_names_the_config_file.
    one_line(resolution_refused(tmp_path, text, *flags), key, *needles, source=None)


def test_a_token_mistake_names_the_config_file(tmp_path, resolution_env):
    exc = resolution_refused(tmp_path, OPENAI + client() + client("nightly", "env:SAME_AS_CHAT"))
    one_line(exc, "gateway.clients[1].token", "same token as 'chat'")


def test_a_client_named_default_is_fine_without_gateway_token(tmp_path, env):
    (only,) = settings(tmp_path, OPENAI + client("default")).clients
    assert only.name == DEFAULT_CLIENT and only.token == CHAT


def test_a_token_file_is_read(tmp_path, env):
    (tmp_path / "chat.token").write_text(CHAT + "\n")
    (only,) = settings(tmp_path, OPENAI + client(token=f"@{tmp_path / 'chat.token'}")).clients
    assert only.token == CHAT


# ---------------------------------------------------------------- a good config

TEAM = (
    OPENAI
    + client(priority='"interactive"')
    + client(
        "nightly",
        "env:NIGHTLY_TOKEN",
        priority='"batch"',
        weight="3",
        requests_per_minute="100",
        tokens_per_minute="100_000",
        usd_per_day="2.5",
        quota='"refuse"',
    )
)


def test_two_clients_are_parsed_into_flows(tmp_path, env):
    cfg = load_config(write(tmp_path, TEAM))
    chat, nightly = cfg.gateway.clients
    assert chat.flow == FlowSpec("chat", Priority.INTERACTIVE)
    assert (chat.flow.weight, chat.flow.quotas, chat.flow.refuse) == (1.0, False, False)
    assert nightly.flow == FlowSpec(
        "nightly",
        Priority.BATCH,
        weight=3.0,
        requests_per_minute=100,
        tokens_per_minute=100_000,
        usd_per_day=2.5,
        refuse=True,
    )
    assert isinstance(nightly.flow.requests_per_minute, int) and isinstance(
        nightly.flow.tokens_per_minute, int
    )
    # Tokens are kept as written until the command resolves them, and never shown.
    assert [c.token for c in cfg.gateway.clients] == ["env:CHAT_TOKEN", "env:NIGHTLY_TOKEN"]
    assert "CHAT_TOKEN" not in repr(chat) and "CHAT_TOKEN" not in repr(cfg.gateway)


def test_a_client_s_defaults_are_standard_weight_1_no_quota_and_wait(tmp_path, env):
    (only,) = load_config(write(tmp_path, OPENAI + client())).gateway.clients
    assert only.flow == FlowSpec("chat") and only.flow.priority == Priority.STANDARD and not only.flow.refuse


def test_the_command_resolves_each_token_and_adds_the_default_client(tmp_path, env):
    resolved = settings(tmp_path, TEAM, "--gateway-token", "env:GATEWAY_TOKEN")
    assert [(c.name, c.token) for c in resolved.clients] == [("chat", CHAT), ("nightly", NIGHTLY)]
    assert resolved.token == GATEWAY
    clients = gateway_clients(resolved)
    assert [(c.name, c.token, c.flow) for c in clients[2:]] == [
        (DEFAULT_CLIENT, GATEWAY, FlowSpec("default"))
    ]
    assert [c.flow.priority for c in clients] == [Priority.INTERACTIVE, Priority.BATCH, Priority.STANDARD]
    for secret in (CHAT, NIGHTLY, GATEWAY):
        assert secret not in repr(resolved) and secret not in repr(clients)


def test_gateway_token_alone_is_one_client(tmp_path, env):
    resolved = settings(tmp_path, OPENAI, "--gateway-token", "env:GATEWAY_TOKEN")
    assert resolved.clients == ()
    assert [(c.name, c.token) for c in gateway_clients(resolved)] == [(DEFAULT_CLIENT, GATEWAY)]


def test_the_team_in_docs_gateway_md_loads_and_its_command_runs_as_written(tmp_path, env, monkeypatch):
    """docs/gateway.md's `team.toml` and the `ratedeck gateway` command beside it, with the token
    variables it sets in front of it (which the docs' own command check leaves out)."""
    from tests.support.doc_commands import ROOT, bash_blocks, check, named_files, prepare_files

    page = (ROOT / "docs" / "gateway.md").read_text()
    section = page[page.index("## Clients: priorities, fair shares and quotas") :]
    section = section[: section.index("\n## ", 5)]
    team = named_files(section)["team.toml"]
    lines = [line for block in bash_blocks(section) for line in block.replace("\\\n", " ").splitlines()]
    commands = [shlex.split(line) for line in lines if " ratedeck gateway " in f" {line} "]
    assert len(commands) == 1, lines
    words = commands[0]
    at = words.index("ratedeck")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_KEYS", "sk-doc-0000000000001,sk-doc-0000000000002")
    monkeypatch.setenv("RATEDECK_TOKEN", "gateway-doc-token-0001")
    for assignment in words[:at]:  # NAME=value in front of the command
        name, _, value = assignment.partition("=")
        monkeypatch.setenv(name, value)
    argv = words[at + 1 :]
    prepare_files(argv, {"team.toml": team}, tmp_path)
    check(argv)  # as tests/project/test_docs.py checks every command on a page
    args = build_parser().parse_args(argv[1:])
    cfg, _ = load_run_config(args)
    flows = {c.name: c.flow for c in gateway_clients(gateway_settings(args, cfg))}
    assert flows == {
        "chat": FlowSpec("chat", Priority.INTERACTIVE),
        "nightly": FlowSpec("nightly", Priority.BATCH, tokens_per_minute=100_000),
        "notebooks": FlowSpec("notebooks", weight=3.0, usd_per_day=20.0, refuse=True),
        DEFAULT_CLIENT: FlowSpec(DEFAULT_CLIENT),
    }


# ---------------------------------------------------------------- the real CLI


def cli(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "team.toml").write_text(text)
    env = {
        **os.environ,
        "CHAT_TOKEN": CHAT,
        "NIGHTLY_TOKEN": NIGHTLY,
        "GATEWAY_TOKEN": GATEWAY,
        "TWO_TOKENS": "tok-one-000000001,tok-two-000000002",
        "SAME_AS_CHAT": CHAT,
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
    }
    env.pop("RATEDECK_NO_SUCH_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "ratedeck.runner.cli", "gateway", "--config", "team.toml", "--no-ui", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
    )


def said_once(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, one line on stderr (returned), nothing secret in it."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ratedeck: "), proc.stderr
    for secret in (CHAT, NIGHTLY, GATEWAY):
        assert secret not in proc.stderr + proc.stdout
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("text", "key", "needles"), [_case(m[0], *m[1:]) for m in MISTAKES])
def test_the_cli_says_a_file_mistake_in_one_line_and_exits_2(tmp_path, text, key, needles):
    line = said_once(cli(tmp_path, text))
    assert line.startswith(f"ratedeck: team.toml: {key}: "), line
    assert all(n in line for n in needles), (needles, line)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "flags", "key", "needles"), [pytest.param(*r[1:], id=r[0]) for r in RESOLUTION]
)
def test_the_cli_says_a_token_mistake_in_one_line_and_exits_2(tmp_path, text, flags, key, needles):
    line = said_once(cli(tmp_path, text, *flags))
    assert f": {key}: " in line, line
    assert all(n in line for n in needles), (needles, line)
