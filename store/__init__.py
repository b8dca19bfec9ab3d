"""Durable and shared work: the store interface (`base`) and its implementations.

`open_store(url)` gives a `WorkStore` for `sqlite:PATH` or `redis://...`, None
for `memory` (the default: no store on the engine's path at all).
"""

from .base import Finished, Job, StoreCounts, StoreError, WorkStore
from .open import open_store

__all__ = ["Finished", "Job", "StoreCounts", "StoreError", "WorkStore", "open_store"]
