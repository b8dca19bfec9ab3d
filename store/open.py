"""The store factory: `open_store(url)` picks an implementation of `base.WorkStore`."""

from __future__ import annotations

from .base import StoreError, WorkStore

MEMORY = "memory"


def open_store(url: str) -> WorkStore | None:
    """The store `url` names: None for `memory` (the engine's own queues), else a `WorkStore`.

    `sqlite:PATH` (created if missing; its directory must exist and be
    writable), `redis://host:port/db`, `redis+cluster://host:port,host:port` (a Redis Cluster:
    any one reachable node finds the rest). Raises `StoreError` with one line
    naming the problem.
    """
    text = url.strip()
    if text == MEMORY:
        return None
    if text.startswith("sqlite:"):
        from .sqlite import SqliteStore

        return SqliteStore.open(text.removeprefix("sqlite:"))
    if text.lower().startswith(("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")):
        import importlib.util

        if importlib.util.find_spec("redis") is None:  # an optional extra: ratedeck[redis]
            raise StoreError("needs the redis package: pip install 'ratedeck[redis]'")
        from .redis import RedisStore  # type: ignore[import-not-found,unused-ignore]

        return RedisStore.open(text)
    raise StoreError(
        "not a store; use memory, sqlite:PATH or redis://host:port/db (a cluster: redis+cluster://host:port,...)"
    )
