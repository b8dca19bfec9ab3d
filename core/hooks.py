"""A user's hook named as "module:function": imported once, checked callable, errors that say why."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """The function `spec` ("module:function") names; ValueError naming `what` and the cause."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f'the {what} must be a hook "module:function", got {spec!r}')
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load the {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"the {what} {spec!r} is not a function")
    return fn  # type: ignore[no-any-return]
