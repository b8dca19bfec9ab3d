"""Ctrl-C while the command starts: one line and exit 130, whatever was importing."""

from __future__ import annotations

import pytest

from ratedeck.core.exits import ExitCode
from ratedeck.runner import cli


def _raise(exc: BaseException):
    def run(argv):
        raise exc

    return run


def test_a_ctrl_c_while_a_dataclass_is_defined_is_an_interrupt_not_a_traceback(monkeypatch, capsys):
    # Python wraps an exception raised in `__set_name__` (a dataclass's fields) in a RuntimeError.
    wrapped = RuntimeError("Error calling __set_name__ on 'Field' instance 'latency' in 'KeyRow'")
    wrapped.__cause__ = KeyboardInterrupt()
    monkeypatch.setattr(cli, "_main", _raise(wrapped))
    assert cli.main([]) == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "ratedeck: interrupted\n"


def test_a_plain_ctrl_c_while_starting_is_an_interrupt(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_main", _raise(KeyboardInterrupt()))
    assert cli.main([]) == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "ratedeck: interrupted\n"


def test_any_other_runtime_error_is_not_taken_for_an_interrupt(monkeypatch):
    monkeypatch.setattr(cli, "_main", _raise(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main([])
