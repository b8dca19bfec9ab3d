"""What the simulated API enforces: keys, limits, latency, penalties and faults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ratedeck.core.numbers import parse_duration
from ratedeck.core.policy import Policy, format_policy, parse_policy
from ratedeck.core.study_server import STUDY, STUDY_KEYS, current_name

MODES = (STUDY, "standard")

#: The largest count one policy may have: the limiter keeps one slot per request.
MAX_POLICY_LIMIT = 1_000_000


def generated_keys(count: int) -> tuple[str, ...]:
    """Deterministic fake keys for standard mode: "key-000", "key-001", ..."""
    if count < 1:
        raise ValueError(f"keys: need at least one key, got {count}")
    width = max(3, len(str(count - 1)))
    return tuple(f"key-{i:0{width}d}" for i in range(count))


@dataclass(frozen=True)
class ServerSettings:
    """Everything the simulated API enforces, fixed for the server's lifetime.

    Attributes:
        mode: "study" (behaves like the study's server) or "standard"; "seed"
            is an old name for "study" (`from_dict` takes it and says so).
            The mode picks the defaults in `from_dict`; behaviour comes from the
            other fields only.
        keys: the valid API keys.
        policies: per-key window limits; a request must fit all of them.
        latency_in_ms / latency_out_ms: (low, high) whole milliseconds, drawn
            uniformly (inclusive) before the decision and before the answer.
        processing_ms: (low, high) whole milliseconds of server time, drawn
            uniformly between the arrival stamp (the decision) and the answer,
            for requests that spent a slot (a rejection is answered at once,
            as a gateway in front of the service would). It moves no stamp:
            only the way in does.
        server_timing: send `Server-Timing: app;dur=X` (X in ms, the time from
            the arrival stamp to the answer) on every answer to a known key.
        health: serve `GET /health`: no key, no limit, no processing; the same
            network latency each way. A probe's target.
        block_after: rate-limit rejections after which a key is blocked for the
            server's lifetime; 0 never blocks.
        nonce: require an integer nonce strictly above the key's last accepted one.
        retry_after: send Retry-After (whole seconds) on 429 and 503 answers.
        ratelimit_headers: send RateLimit-Policy / RateLimit (IETF draft) and
            X-RateLimit-Limit / -Remaining / -Reset.
        escalation: a rejected key sits out a cooldown; each request during it
            is rejected and doubles the cooldown, up to `escalation_cap_s`.
        host_policies: limits shared by all keys together, on top of per-key ones.
        error_rate: fraction of accepted requests answered 503 (fault injection).
        seed: seed for the random latency and fault draws; None is unseeded.
        whole_ms_stamps: truncate decision times to whole milliseconds, as the
            study's server does (it stamps with int(time * 1000)).
        other_load: another user of every key, "8/1s@10s-30s": 8 requests per second, evenly
            spaced, from 10 s to 30 s after the server's first request. They take the key's
            slots (its windows and RateLimit counts see them); one that finds the windows
            full waits for the next slot to free (the rest queue behind it), so they get
            the rate they ask for. They never cool a key down and are not in the stats
            (`other_accepted` apart); "" for none.
    """

    mode: str = "standard"
    keys: tuple[str, ...] = field(default_factory=lambda: generated_keys(5))
    policies: tuple[Policy, ...] = (Policy(20, 1.0),)
    latency_in_ms: tuple[int, int] = (0, 50)
    latency_out_ms: tuple[int, int] = (0, 50)
    processing_ms: tuple[int, int] = (0, 0)
    server_timing: bool = False
    health: bool = False
    block_after: int = 0
    nonce: bool = False
    retry_after: bool = True
    ratelimit_headers: bool = True
    escalation: bool = False
    escalation_base_s: float = 1.0
    escalation_cap_s: float = 16.0
    host_policies: tuple[Policy, ...] = ()
    error_rate: float = 0.0
    seed: int | None = None
    whole_ms_stamps: bool = False
    other_load: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.keys:
            raise ValueError("keys: need at least one key")
        for key in self.keys:
            if not isinstance(key, str) or not key:
                raise ValueError(f"keys: every key must be a non-empty string, got {key!r}")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("keys: the keys must be distinct")
        if not self.policies:
            raise ValueError("policies: need at least one per-key limit")
        for name in ("policies", "host_policies"):
            for policy in getattr(self, name):
                if not isinstance(policy, Policy):
                    raise ValueError(f"{name}: expected Policy objects, got {policy!r}")
                if policy.limit > MAX_POLICY_LIMIT:
                    raise ValueError(
                        f"{name}: {format_policy(policy)} allows more than {MAX_POLICY_LIMIT:,} "
                        "requests per window; the simulator keeps a slot per request"
                    )
        for name in ("latency_in_ms", "latency_out_ms", "processing_ms"):
            _check_latency(name, getattr(self, name))
        if not isinstance(self.block_after, int) or self.block_after < 0:
            raise ValueError(f"block_after: must be a whole number >= 0, got {self.block_after!r}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate: must be between 0 and 1, got {self.error_rate!r}")
        if self.escalation_base_s <= 0:
            raise ValueError(f"escalation_base_s: must be above 0 seconds, got {self.escalation_base_s!r}")
        if self.escalation_cap_s < self.escalation_base_s:
            raise ValueError(
                f"escalation_cap_s: must be at least escalation_base_s "
                f"({self.escalation_base_s}), got {self.escalation_cap_s!r}"
            )
        if self.other_load:
            parse_other_load(self.other_load)
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed: must be a whole number, got {self.seed!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerSettings:
        """Build settings from a TOML-style table; missing fields take the mode's defaults.

        Policies are strings ("20/1s"), latencies two-element lists, `keys` a list
        of strings or a count of keys to generate. Raises ValueError naming the
        bad field and value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"server settings: expected a table, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{unknown[0]}: unknown server setting; known ones are {', '.join(sorted(known))}"
            )
        mode = current_name("mode", data.get("mode", "standard"))
        base = study_settings() if mode == STUDY else standard_settings()
        changes: dict[str, Any] = {"mode": mode}
        for name, value in data.items():
            if name == "mode":
                continue
            changes[name] = _convert_field(name, value)
        return replace(base, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The inverse of `from_dict`: plain strings, numbers, booleans and lists."""
        out = asdict(self)
        out["keys"] = list(self.keys)
        out["policies"] = [format_policy(p) for p in self.policies]
        out["host_policies"] = [format_policy(p) for p in self.host_policies]
        out["latency_in_ms"] = list(self.latency_in_ms)
        out["latency_out_ms"] = list(self.latency_out_ms)
        out["processing_ms"] = list(self.processing_ms)
        if self.seed is None:
            del out["seed"]  # TOML has no null
        return out


@dataclass(frozen=True, slots=True)
class OtherLoad:
    """Another user's requests on every key: `policy` spread evenly from `start_s` to `end_s`."""

    policy: Policy
    start_s: float
    end_s: float

    @property
    def gap_ms(self) -> float:
        return self.policy.window_s * 1000.0 / self.policy.limit


def parse_other_load(text: str) -> OtherLoad:
    """ "8/1s@10s-30s" as an `OtherLoad`; raises ValueError naming `other_load`."""
    rate, at, span = text.partition("@")
    start, dash, end = span.partition("-")
    if not at or not dash:
        raise ValueError(f"other_load: {text!r} is not a load; write N/W@START-END, like 8/1s@10s-30s")
    try:
        policy = parse_policy(rate.strip())
        start_s = parse_duration(start.strip(), low_open=False)
        end_s = parse_duration(end.strip())
    except ValueError as exc:
        raise ValueError(f"other_load: {exc}") from None
    if end_s <= start_s:
        raise ValueError(f"other_load: {text!r} ends before it starts")
    return OtherLoad(policy, start_s, end_s)


def study_settings() -> ServerSettings:
    """Exactly the study's server: 5 fixed keys, 20/1s, 0..50 ms each way,
    blocked after 10 rejections, strictly increasing nonce, no Retry-After."""
    return ServerSettings(
        mode=STUDY,
        keys=STUDY_KEYS,
        policies=(Policy(20, 1.0),),
        latency_in_ms=(0, 50),
        latency_out_ms=(0, 50),
        block_after=10,
        nonce=True,
        retry_after=False,
        ratelimit_headers=False,
        escalation=False,
        host_policies=(),
        error_rate=0.0,
        whole_ms_stamps=True,
    )


def standard_settings() -> ServerSettings:
    """A well-behaved modern API: generated keys, 20/1s, 0..50 ms each way,
    Retry-After and RateLimit headers, no nonce, no blocking."""
    return ServerSettings()


def _check_latency(name: str, value: Any) -> None:
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or value[0] < 0 or value[0] > value[1]:
        raise ValueError(
            f"{name}: expected (low, high) whole milliseconds with 0 <= low <= high, got {value!r}"
        )


def _convert_field(name: str, value: Any) -> Any:
    """Turn one TOML value into the dataclass field's type, or say what is wrong."""
    if name == "keys":
        if isinstance(value, int) and not isinstance(value, bool):
            return generated_keys(value)
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise ValueError(f"keys: expected a list of keys or a count, got {value!r}")
    if name in ("policies", "host_policies"):
        if isinstance(value, (str, Policy)):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f'{name}: expected a list of limits like ["20/1s"], got {value!r}')
        try:
            return tuple(p if isinstance(p, Policy) else parse_policy(p) for p in value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if name in ("latency_in_ms", "latency_out_ms", "processing_ms"):
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise ValueError(f"{name}: expected [low, high] whole milliseconds, got {value!r}")
    if name in (
        "nonce",
        "retry_after",
        "ratelimit_headers",
        "escalation",
        "whole_ms_stamps",
        "server_timing",
        "health",
    ):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected true or false, got {value!r}")
        return value
    if name == "other_load":
        if not isinstance(value, str):
            raise ValueError(f'other_load: expected text like "8/1s@10s-30s", got {value!r}')
        return value
    if name in ("block_after", "seed"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name}: expected a whole number, got {value!r}")
        return value
    if name in ("error_rate", "escalation_base_s", "escalation_cap_s"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        return float(value)
    return value
