"""Every exit code of the `ratedeck` commands, declared once.

The commands return these; `ratedeck --help` lists them (`SHORT`), and the
table of docs/exit-codes.md is generated from `MEANING` and `ORDER`
(`python -m ratedeck.config.docs --write`).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a `ratedeck` command's exit status says."""

    OK = 0
    FAILED = 1  # nothing worked: no answer, every key refused, or no success
    USAGE = 2  # bad input, found before anything started
    UNBALANCED = 3  # a request was lost from the accounting
    OUTPUT = 4  # an output could not be written
    COST_CAP = 5  # --max-cost stopped admission: work was left unsent
    THRESHOLD = 99  # a --fail-on threshold held (99, as k6 uses for thresholds)
    INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


#: When several codes apply to one run, the first of these that applies is the code.
ORDER: tuple[ExitCode, ...] = (
    ExitCode.UNBALANCED,
    ExitCode.OUTPUT,
    ExitCode.FAILED,
    ExitCode.COST_CAP,
    ExitCode.THRESHOLD,
    ExitCode.INTERRUPTED,
)

#: Each code in a few words, for `ratedeck --help`.
SHORT: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "nothing worked (no answer, every key refused, or no success)",
    ExitCode.USAGE: "bad input",
    ExitCode.UNBALANCED: "accounting mismatch",
    ExitCode.OUTPUT: "an output not written",
    ExitCode.COST_CAP: "the --max-cost cap left work unsent",
    ExitCode.THRESHOLD: "a --fail-on threshold held",
    ExitCode.INTERRUPTED: "stopped at once by a second Ctrl-C, or interrupted while starting",
}

#: Each code in full: when a run or a command ends with it.
MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "the run ended and every request is accounted for",
    ExitCode.FAILED: "nothing worked: the target never answered (the summary names the causes), the server"
    " refused every key, or no request succeeded and some failed",
    ExitCode.USAGE: "bad input, before the run: config, flags, an output path, a malformed `--fail-on` or"
    " unknown field in it, a metrics port in use",
    ExitCode.UNBALANCED: "the accounting does not balance (a request was lost); always fails a run",
    ExitCode.OUTPUT: "an output could not be written (graveyard, results, report)",
    ExitCode.COST_CAP: "the `--max-cost` cap stopped admission before the job was done: what was in flight"
    " finished, the rest was not sent (a store keeps it pending for the next run)",
    ExitCode.THRESHOLD: "a threshold failed (as k6)",
    ExitCode.INTERRUPTED: "stopped at once by a second Ctrl-C, or interrupted while starting",
}


def first_of(codes: list[ExitCode] | tuple[ExitCode, ...]) -> ExitCode:
    """The code of a run that met all of `codes`: the first of `ORDER` among them, else OK."""
    for code in ORDER:
        if code in codes:
            return code
    return ExitCode.OK


def help_line() -> str:
    """The codes as `ratedeck --help` lists them: "0 ok, 1 nothing worked (...), ..."."""
    return ", ".join(f"{int(code)} {SHORT[code]}" for code in ExitCode)
