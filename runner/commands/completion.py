"""`ratedeck completion bash|zsh`: a shell completion script, from the commands' own parsers."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from ratedeck.core.exits import ExitCode

from ..cli import build_parser as run_parser
from . import COMMANDS, command_module
from .common import fail

USAGE = (
    "usage: ratedeck completion bash|zsh\n\n"
    'bash: eval "$(ratedeck completion bash)" in ~/.bashrc; zsh: eval "$(ratedeck completion zsh)"'
)
#: The commands whose flags are completed after their name, each from its module's `build_parser()`.
#: serve and bench are optional here: a script without their flags beats no script.
_WITH_FLAGS = {
    "serve": True,
    "bench": True,
    "sweep": False,
    "replay": False,
    "enqueue": False,
    "status": False,
}


def main(argv: list[str]) -> int:
    if argv in (["bash"], ["zsh"]):
        sys.stdout.write(completion_script(argv[0]))
        return ExitCode.OK
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return ExitCode.OK
    return fail("completion: say which shell: 'ratedeck completion bash' or 'ratedeck completion zsh'")


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags a parser's help names."""
    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", parser.format_help())))


def completion_script(shell: str) -> str:
    """A bash completion function for `ratedeck` (zsh loads it through bashcompinit)."""
    subflags: dict[str, list[str]] = {}
    for name, optional in _WITH_FLAGS.items():
        try:
            subflags[name] = _flags(importlib.import_module(command_module(name)).build_parser())
        except Exception:
            if not optional:
                raise
    run_flags = _flags(run_parser())
    cases = "\n".join(f'        {name}) words="{" ".join(flags)}" ;;' for name, flags in subflags.items())
    script = f"""# ratedeck {shell} completion: eval "$(ratedeck completion {shell})"
_ratedeck() {{
    local cur prev words
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    case "$prev" in
        --config|--report|--graveyard|--results|--workload|--save-config|--keys)
            COMPREPLY=( $(compgen -f -- "$cur") ); return ;;
        --method) COMPREPLY=( $(compgen -W "GET POST" -- "$cur") ); return ;;
        --headroom) COMPREPLY=( $(compgen -W "adaptive" -- "$cur") ); return ;;
        --preset) COMPREPLY=( $(compgen -W "study" -- "$cur") ); return ;;
        --theme) COMPREPLY=( $(compgen -W "ratedeck-dark ratedeck-light ratedeck-high-contrast" -- "$cur") ); return ;;
    esac
    if [ "$COMP_CWORD" -eq 1 ] && [[ "$cur" != -* ]]; then
        COMPREPLY=( $(compgen -W "{" ".join(COMMANDS)}" -- "$cur") ); return
    fi
    words="{" ".join(run_flags)}"
    case "${{COMP_WORDS[1]}}" in
        config)
            if [ "$COMP_CWORD" -eq 2 ]; then COMPREPLY=( $(compgen -W "path show" -- "$cur") ); return; fi
            [ "${{COMP_WORDS[2]}}" = path ] && words="--themes" ;;
        completion) COMPREPLY=( $(compgen -W "bash zsh" -- "$cur") ); return ;;
        replay|enqueue)
            if [[ "$cur" != -* ]]; then COMPREPLY=( $(compgen -f -- "$cur") ); return; fi ;;
    esac
    case "${{COMP_WORDS[1]}}" in
{cases}
    esac
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
}}
complete -o default -F _ratedeck ratedeck
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script
