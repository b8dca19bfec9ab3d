"""The docs pages' promises: every command they state parses and loads as written, the
example config loads, the README links every page, and the bench tables are what their
saved reports render (never hand-edited)."""

import re

import pytest

from tests.support.doc_commands import ROOT, check, commands, named_files, prepare_files

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def page(name: str) -> str:
    return (DOCS / name).read_text()


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory with no user config and the keys' variables the pages name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("MY_KEYS", "GH_TOKENS", "STRIPE_KEYS", "OPENAI_KEYS", "ANTHROPIC_KEYS"):
        monkeypatch.setenv(name, "first-key-0000001,second-key-000002")
    for name in ("AZURE_EAST_KEY", "AZURE_WEST_KEY"):  # docs/endpoints.md: one key per Azure resource
        monkeypatch.setenv(name, f"{name.lower()}-00001")
    monkeypatch.setenv("RATEDECK_TOKEN", "a-gateway-token-0001")  # docs/gateway.md
    return tmp_path


def test_the_docs_pages_are_there():
    names = {p.name for p in PAGES}
    for expected in (
        "configuration.md",
        "report.md",
        "exit-codes.md",
        "prometheus.md",
        "results-and-replay.md",
        "durability.md",
        "many-processes.md",
        "how-it-stays-under-the-limit.md",
        "benchmarks.md",
    ):
        assert expected in names


def test_the_readme_links_every_page():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", readme))
    assert {p.name for p in PAGES} - linked == set()
    assert "config-reference.md" in linked


def test_links_between_pages_resolve():
    """Every relative link to a page (or the README) names a file that exists, or the generated reference."""
    generated = {"config-reference.md", "config.schema.json"}
    for path in [*PAGES, ROOT / "README.md"]:
        for target in re.findall(r"\]\(([\w./-]+\.(?:md|json))(?:#[\w-]+)?\)", path.read_text()):
            resolved = (path.parent / target).resolve()
            assert resolved.exists() or resolved.name in generated, f"{path.name}: {target}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_command_on_a_page_parses_and_loads(path, sandbox):
    text = path.read_text()
    given = named_files(text)
    for argv in commands(text):
        prepare_files(argv, given, sandbox)
        check(argv)


def test_commands_are_found_on_the_pages_that_state_them():
    """The extraction itself: a page with commands yields them, subcommands included."""
    found = {p.name: [argv[:1] for argv in commands(p.read_text())] for p in PAGES}
    assert ["enqueue"] in found["durability.md"] and ["--no-ui"] in found["durability.md"]
    assert ["replay"] in found["results-and-replay.md"]
    assert ["serve"] in found["many-processes.md"] and ["enqueue"] in found["many-processes.md"]
    assert found["benchmarks.md"].count(["bench"]) >= 6
    assert ["serve"] in found["simulator.md"] and ["sweep"] in found["simulator.md"]


def test_a_wrong_command_on_a_page_fails(sandbox):
    with pytest.raises(AssertionError, match="--no-such-flag"):
        check(["--no-ui", "--no-such-flag"])
    with pytest.raises(AssertionError, match="bench"):
        check(["bench", "--scenarios", "no-such-scenario"])
    with pytest.raises(AssertionError, match="serve"):
        check(["serve", "--limit", "twenty"])


def test_config_reference_loads(sandbox):
    """The example config in docs/configuration.md loads as written."""
    from ratedeck.config import load_config

    section = page("configuration.md")
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    (sandbox / "requests.jsonl").write_text('{"symbol": "ABC"}\n')
    (sandbox / "ratedeck.toml").write_text(block)
    cfg = load_config("ratedeck.toml")
    es = cfg.engine_settings
    assert [k.label for k in es.keys] == ["k1", "k2"] and es.keys[1].policies[0].limit == 10
    assert es.host_policies and es.pools == {"read": 8, "write": 2} and es.messages.calls == 3


def test_the_benchmark_tables_are_rendered_from_their_reports():
    """Stale tables fail: regenerate with `python -m ratedeck.bench.docs docs/benchmarks.md`."""
    from ratedeck.bench.docs import blocks, render_page

    text = page("benchmarks.md")
    names = blocks(text)
    assert names and all((DOCS / "bench" / f"{n}.json").is_file() for n in names)
    assert {p.stem for p in (DOCS / "bench").glob("*.json")} == set(names)  # no report left unused
    assert render_page(text, DOCS) == text, "stale: run python -m ratedeck.bench.docs docs/benchmarks.md"


def test_each_table_names_the_command_that_made_it():
    """The command above each table is the one its report recorded."""
    from ratedeck.bench.docs import blocks, command, load_report

    text = page("benchmarks.md")
    stated = {" ".join(["ratedeck", *argv]) for argv in commands(text)}
    for name in blocks(text):
        assert command(load_report(DOCS / "bench" / f"{name}.json")) in stated, name


def test_a_changed_report_makes_the_page_stale(tmp_path):
    import json
    import shutil

    from ratedeck.bench.docs import main, render_page

    shutil.copytree(DOCS / "bench", tmp_path / "bench")
    (tmp_path / "benchmarks.md").write_text(page("benchmarks.md"))
    assert main(["--check", str(tmp_path / "benchmarks.md")]) == 0
    report = tmp_path / "bench" / "seed.json"
    data = json.loads(report.read_text())
    data["scenarios"][0]["rows"][0]["ok_per_s"] += 1.0
    report.write_text(json.dumps(data))
    assert main(["--check", str(tmp_path / "benchmarks.md")]) == 1
    assert main([str(tmp_path / "benchmarks.md")]) == 0  # renders it again
    rendered = (tmp_path / "benchmarks.md").read_text()
    assert render_page(rendered, tmp_path) == rendered and rendered != page("benchmarks.md")


def test_a_marker_naming_a_missing_report_is_one_line(tmp_path, capsys):
    from ratedeck.bench.docs import main

    (tmp_path / "p.md").write_text("<!-- bench:nothing -->\n<!-- /bench:nothing -->\n")
    assert main([str(tmp_path / "p.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing.json" in err


def test_docs_bench_files_are_reports(tmp_path):
    from ratedeck.bench.docs import load_report

    for path in sorted((DOCS / "bench").glob("*.json")):
        data = load_report(path)
        assert data["scenarios"] and data["command"].startswith("ratedeck bench "), path.name
        assert f"--report docs/bench/{path.name}" in data["command"], path.name
