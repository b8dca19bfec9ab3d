"""Loopback stub servers that play public rate-limited APIs as their documentation describes.

One module per API (github, stripe, binance, kraken), each with
``async def start_<api>(**options) -> Stub``. Each stub binds 127.0.0.1 on an
OS-chosen port, enforces the documented limits (as strictly as the docs allow; where
they are silent, the module docstring says what was chosen), and keeps its own
accounting in ``stub.ledger``, which tests and benchmarks read as the truth.
``stub.allowed_capacity(start, end, key=..., bucket=...)`` and ``stub.share(...)``
answer "how much did the limits allow over the run, and what share did the client
get". Limits default to the documented numbers; pass small ones (and a
``common.FakeClock``) so tests run in well under a second.
"""

from .binance import BinanceState, start_binance
from .common import FakeClock, Ledger, Record, Stub
from .github import GitHubState, start_github
from .kraken import KrakenState, kraken_sign, start_kraken
from .stripe import StripeState, start_stripe

__all__ = [
    "BinanceState",
    "FakeClock",
    "GitHubState",
    "KrakenState",
    "Ledger",
    "Record",
    "StripeState",
    "Stub",
    "kraken_sign",
    "start_binance",
    "start_github",
    "start_kraken",
    "start_stripe",
]
