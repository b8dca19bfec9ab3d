"""The `ratedeck ...` commands a page states, and a check that each parses and loads as written.

Used by tests/project/test_docs.py (every docs page) and tests/project/test_readme.py (the README's usage).
`checkers()` is the one place that knows where each subcommand's parser lives.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parents[2]
#: What a `@FILE` key file or a workload file gets when a command names one that a page does not give.
KEY_LINES = "key-000 c2VjcmV0\nkey-001 c2VjcmV0\n"
WORKLOAD_LINE = '{"n": 1}\n'


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def commands(text: str) -> list[list[str]]:
    """Every `ratedeck ...` command in the text's bash blocks, as argv after `ratedeck`.

    Lines continued with a backslash are joined; comments, `&` and the parts of
    `a && b` or `a | b` that are not ratedeck are left out.
    """
    out = []
    for block in bash_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            part: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", "||", "|", ";", "&"):
                    if part[:1] == ["ratedeck"]:
                        out.append(part[1:])
                    part = []
                else:
                    part.append(word)
    return out


def named_files(text: str) -> dict[str, str]:
    """Files a page gives whole: a line "`NAME.toml`:" (or .json, .jsonl) and the code block after it."""
    return dict(re.findall(r"`([\w.-]+\.(?:toml|jsonl?))`:\n\n```\w*\n(.*?)```", text, re.S))


def prepare_files(argv: list[str], given: dict[str, str], where: Path) -> None:
    """Create what the command reads and the page leaves to the reader: configs, keys, workloads."""
    for word in argv:
        name = word[1:] if word.startswith("@") else word
        if "/" in name or name.startswith("-") or (where / name).exists():
            continue
        if name in given:
            (where / name).write_text(given[name])
        elif word.startswith("@") or name.endswith((".keys", ".txt")):
            (where / name).write_text(KEY_LINES)
        elif name.endswith(".jsonl"):
            (where / name).write_text(WORKLOAD_LINE)
        elif name.endswith(".toml"):
            (where / name).write_text("")


def _seconds(argv: list[str]) -> list[str]:
    """`--duration 30s` as the ratedeck command hands it to the bench: plain seconds."""
    from ratedeck.core.numbers import parse_duration

    return [
        repr(parse_duration(word)) if i and argv[i - 1] == "--duration" else word
        for i, word in enumerate(argv)
    ]


def checkers() -> dict[str | None, Callable[[list[str]], object]]:
    """Subcommand (None: a run) -> a check that parses its argv with the real parser and
    loads what it names; raises on any problem. The parsers' homes are named only here."""
    import argparse

    from ratedeck.bench import parse_args as bench_args
    from ratedeck.config import PRESETS, load_config
    from ratedeck.runner.cli import build_parser
    from ratedeck.runner.commands.enqueue import build_parser as enqueue_parser
    from ratedeck.runner.commands.replay import build_parser as replay_parser
    from ratedeck.runner.commands.run import load_run_config
    from ratedeck.runner.replay import parse_endings
    from ratedeck.runner.sweep import build_parser as sweep_parser
    from ratedeck.runner.sweep import check_args as sweep_check
    from ratedeck.runner.thresholds import parse_all
    from ratedeck.server.serve import add_serve_arguments, settings_from_args

    def run(argv: list[str]) -> object:
        cfg, _ = load_run_config(build_parser().parse_args(argv))
        parse_all(cfg.runner.fail_on)
        return cfg

    def serve(argv: list[str]) -> object:
        p = argparse.ArgumentParser(prog="ratedeck serve")
        add_serve_arguments(p)
        return settings_from_args(p.parse_args(argv))

    def replay(argv: list[str]) -> object:
        args = replay_parser().parse_args(argv)
        if args.only:
            parse_endings(args.only)
        return load_run_config(args)

    def enqueue(argv: list[str]) -> object:
        args = enqueue_parser().parse_args(argv)
        return load_config(args.config, args.preset, {"run": {"store": args.store}})

    def sweep(argv: list[str]) -> object:
        return sweep_check(sweep_parser().parse_args(argv))

    def config(argv: list[str]) -> object:
        assert argv[0] in ("path", "show"), argv
        return run(argv[1:]) if argv[0] == "show" else None

    def gateway(argv: list[str]) -> object:
        from ratedeck.gateway.service import check_gateway
        from ratedeck.runner.commands.gateway import build_parser as gateway_parser
        from ratedeck.runner.commands.gateway import gateway_settings

        args = gateway_parser().parse_args(argv)
        cfg, _ = load_run_config(args)
        return check_gateway(cfg, gateway_settings(args, cfg))

    def presets(argv: list[str]) -> object:
        assert all(name in PRESETS for name in argv), argv
        return argv

    def completion(argv: list[str]) -> object:
        assert argv in (["bash"], ["zsh"]), argv
        return argv

    def status(argv: list[str]) -> object:
        from ratedeck.runner.commands.status import build_parser as status_parser

        return status_parser().parse_args(argv)

    return {
        None: run,
        "serve": serve,
        "bench": lambda argv: bench_args(_seconds(argv)),
        "replay": replay,
        "enqueue": enqueue,
        "sweep": sweep,
        "config": config,
        "gateway": gateway,
        "presets": presets,
        "completion": completion,
        "status": status,
    }


def check(argv: list[str]) -> object:
    """Parse and load one command (argv after `ratedeck`); raises AssertionError naming it."""
    table = checkers()
    name = argv[0] if argv and argv[0] in table else None
    try:
        return table[name](argv[1:] if name else argv)
    except SystemExit as exc:  # argparse's own error (already printed on stderr)
        raise AssertionError(f"ratedeck {shlex.join(argv)}: exit {exc.code}") from None
    except Exception as exc:
        raise AssertionError(f"ratedeck {shlex.join(argv)}: {type(exc).__name__}: {exc}") from exc
