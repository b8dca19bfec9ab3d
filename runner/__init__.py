"""The `ratedeck` command and what it runs (headless, sweep, report, plots).

A Ctrl-C while the command is still importing its modules (the first few
tenths of a second) ends it quietly with exit 130, not with a
KeyboardInterrupt traceback: when this package is imported as the start of
the `ratedeck` command, SIGINT is routed to `quiet_startup_interrupt` until
`cli.main` takes over. Imported any other way (a program, the tests), it
changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys

#: ExitCode.INTERRUPTED, written out: the handler must work before any other import has
#: run (tests/runner/test_cli_conventions.py holds the two equal).
INTERRUPTED = 130


def quiet_startup_interrupt(signum, frame):  # pragma: no cover - exercised in a subprocess
    """Exit at once: only imports run before `cli.main`, nothing is open or half written.

    Not `SystemExit`: the signal may land inside one of importlib's own
    callbacks, which print an exception raised there and carry on.
    """
    try:
        sys.stderr.write("ratedeck: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(INTERRUPTED)


def _started_as_the_command() -> bool:
    argv = getattr(sys, "orig_argv", None) or []
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return "ratedeck.runner.cli" in argv or script in ("ratedeck", "ratedeck.exe")


if _started_as_the_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, quiet_startup_interrupt)
