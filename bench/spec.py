"""What one child process is asked to run, as plain JSON-ready data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ratedeck.core.loops import LoopName


@dataclass(frozen=True)
class RunSpec:
    """One strategy run against one running simulator.

    Attributes:
        strategy: a name from `strategies.STRATEGIES`, or a micro job
            ("bare-aiohttp", "engine-max", "scale-keys", "scale-queue").
        url: the simulator's `/api/request` URL.
        keys: the API keys to use.
        limit / window_s: each key's policy (limit requests per window_s).
        nonce: send a per-key increasing nonce.
        offered_tps: arrival rate of new requests (every strategy gets the same).
        duration_s: how long new requests arrive and are sent.
        ttl_s: a request older than this is dropped (expired).
        in_flight: requests in flight per key, for strategies that allow several.
        loop: "uvloop" or "asyncio" for the asyncio strategies.
        seed: seed for the arrival gaps.
        extra: job-specific settings (queue depth for "scale-queue", ...).
    """

    strategy: str
    url: str
    keys: tuple[str, ...]
    limit: int
    window_s: float
    nonce: bool
    offered_tps: float
    duration_s: float
    ttl_s: float = 1.0
    in_flight: int = 8
    loop: LoopName = "uvloop"
    seed: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def policy_text(self) -> str:
        window = self.window_s
        if float(window).is_integer():
            return f"{self.limit}/{int(window)}s"
        return f"{self.limit}/{round(window * 1000)}ms"

    def to_json(self) -> dict:
        out = asdict(self)
        out["keys"] = list(self.keys)
        return out

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        data = dict(data)
        data["keys"] = tuple(data["keys"])
        return cls(**data)
