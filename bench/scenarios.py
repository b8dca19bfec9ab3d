"""The bench's scenarios and strategies: what runs against what."""

from __future__ import annotations

from dataclasses import dataclass

from ratedeck.server.settings import SEED_KEYS, generated_keys


@dataclass(frozen=True)
class Scenario:
    """One simulator setup every strategy runs against.

    Attributes:
        name: the stable name used in `--scenarios` and the report.
        summary: one line for the table's heading.
        serve_args: `ratedeck serve` options that start the simulator.
        keys: the API keys the clients use.
        limit / window_s: each key's policy, as the server enforces it.
        nonce: the server requires a strictly increasing nonce per key.
    """

    name: str
    summary: str
    serve_args: tuple[str, ...]
    keys: tuple[str, ...]
    limit: int
    window_s: float
    nonce: bool

    @property
    def capacity_tps(self) -> float:
        """Requests per second all keys allow together."""
        return len(self.keys) * self.limit / self.window_s


MANY_KEYS = 50

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "seed",
            "the seed's server: 5 keys x 20/1s, 0..50 ms each way, nonce, block after 10",
            ("--mode", "seed"),
            SEED_KEYS,
            20,
            1.0,
            True,
        ),
        Scenario(
            "seed+jitter",
            "seed mode with 0..100 ms each way (twice the seed's jitter)",
            ("--mode", "seed", "--latency", "0:100"),
            SEED_KEYS,
            20,
            1.0,
            True,
        ),
        Scenario(
            "many-keys",
            f"standard mode: {MANY_KEYS} keys x 20/1s, 0..5 ms each way, no nonce",
            (
                "--mode",
                "standard",
                "--keys",
                str(MANY_KEYS),
                "--limit",
                "20/1s",
                "--latency",
                "0:5",
                "--no-nonce",
            ),
            generated_keys(MANY_KEYS),
            20,
            1.0,
            False,
        ),
    )
}

#: Strategy name -> what it is, in the order they run.
STRATEGIES: dict[str, str] = {
    "original": "seed's original client: 50 ms interval + ring, 1 in flight/key",
    "improved-async": "seed's improved client on asyncio: ring + 30..50 ms buffer, 1 in flight/key",
    "improved-threads": "seed's improved client on threads (http.client)",
    "aiolimiter": "aiolimiter AsyncLimiter(limit, window) per key, 8 in flight/key",
    "ratedeck": "ratedeck's engine (seed preset, adaptive headroom, even pacing)",
}
