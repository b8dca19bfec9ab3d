"""The subcommands of `ratedeck`: the table, and one module each, imported only when it runs.

Every module here has `main(argv) -> int` (argv after the subcommand's name); those whose
flags shell completion lists also have `build_parser()`. `run` is the command with no name
(the console, or headless with --no-ui); `common` is what they all share. Importing this
package loads no subcommand: `ratedeck --help` and a run stay quick to start.
"""

from __future__ import annotations

from ratedeck.core.exits import help_line

#: Every subcommand: its module here, and its one line for `ratedeck --help`.
TABLE: dict[str, tuple[str, str]] = {
    "serve": ("serve", "the simulator: a rate-limited API to play against"),
    "bench": ("bench", "benchmarks: ratedeck against peer limiters, on the simulator"),
    "gateway": (
        "gateway",
        "a local HTTP server in front of the target: point any program's base URL at it, ratedeck paces it",
    ),
    "sweep": ("sweep", "goodput against arrival rate for messages of several calls"),
    "replay": ("replay", "send the requests of a graveyard or results file again (FILE [run flags])"),
    "enqueue": (
        "enqueue",
        "add a JSONL workload's lines to a store as jobs (--store URL FILE); 'ratedeck --store URL' works them",
    ),
    "status": (
        "status",
        "a store's jobs by state: pending, sending, done, uncertain, graveyard (--store URL)",
    ),
    "config": (
        "config",
        "'config path': the user config file; 'config show [flags]': the config in force, keys masked",
    ),
    "completion": ("completion", "'completion bash' or 'completion zsh': a shell completion script"),
    "presets": (
        "presets",
        "the built-in presets for real APIs (github, stripe, binance, kraken, openai, anthropic) and what each sets",
    ),
}
COMMANDS = {name: text for name, (_, text) in TABLE.items()}
SUBCOMMANDS = tuple(COMMANDS)
#: The module of the command with no name.
RUN = "run"

EXIT_CODES = help_line()


def command_module(name: str) -> str:
    """The module that runs subcommand `name`, or the run itself for `RUN`."""
    return f"{__name__}.{TABLE[name][0] if name in TABLE else RUN}"


def epilog() -> str:
    """The end of `ratedeck --help`: every command with its one line, then the exit codes."""
    width = max(len(name) for name in COMMANDS) + 2
    lines = ["commands:", f"  {'(none)':<{width}}run: the console, or headless with --no-ui"]
    lines += [f"  {name:<{width}}{text}" for name, text in COMMANDS.items()]
    lines += [
        "",
        "Each command takes --help. With no --config, $XDG_CONFIG_HOME/ratedeck/config.toml"
        " (~/.config/ratedeck/config.toml) is read when present.",
        f"Exit codes: {EXIT_CODES}.",
    ]
    return "\n".join(lines)
