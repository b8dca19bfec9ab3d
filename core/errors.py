"""The one error base a user of ratedeck can catch."""

from __future__ import annotations


class RatedeckError(Exception):
    """Anything ratedeck refuses or cannot do, with a message fit to show a user.

    `ConfigError` (bad settings), the library's `CallError` family and the
    CLI's usage errors all derive from it, so `except RatedeckError` catches
    every problem ratedeck reports on purpose and nothing else.
    """
