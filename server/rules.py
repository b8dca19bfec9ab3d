"""The simulated API's decisions, free of I/O: every call is told what time it is.

`RateRules.decide` answers one request the way the server would, so the engine's
tests can drive it with a fake clock and the aiohttp app stays a thin shell.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from ratedeck.core.policy import Policy, format_policy
from ratedeck.core.secrets import mask_secret

from .audit import WindowAudit
from .settings import ServerSettings, parse_other_load
from .window import SlotRing

MSG_INVALID_KEY = "invalid api key"
MSG_BLOCKED = "too many rate limit errors: blocked"
MSG_RATE_LIMIT = "exceeded rate limit"
MSG_HOST_LIMIT = "exceeded host rate limit"
MSG_INVALID_NONCE = "invalid nonce"
MSG_UNAVAILABLE = "service unavailable"

#: Accepted arrivals of a key's first seconds (a client still learning) are left
#: out of the sustained share; `share_all` counts them too.
SHARE_WARMUP_S = 5.0

#: At most this many accept stamps are kept, over all keys (about 32 bytes each: 32 MB);
#: past it, the rest are counted in `arrivals_dropped`, not kept. (A list, not an
#: `array("d")`: its append is a third of the cost, on the path of every accepted request.)
ARRIVALS_CAP = 1_000_000
#: The 429s whose stamps a key keeps (`stats(arrivals=True)`'s `rejected_ms`): where a run's
#: rare 429s fell among its accepted arrivals.
REJECTED_KEPT = 1000


#: Outcomes of requests that spent a slot: the service processed them.
SPENT = frozenset({"ok", "invalid_nonce", "fault"})


def server_timing(ms: float) -> str:
    """The Server-Timing field for `ms` of server time (never negative)."""
    return f"app;dur={max(0.0, ms):.1f}"


@dataclass(frozen=True, slots=True)
class Decision:
    """One answer: HTTP status, JSON body, extra headers and a short outcome label.

    `outcome` is one of "ok", "invalid_key", "blocked", "rate_limited",
    "cooldown", "host_limited", "invalid_nonce", "fault".
    """

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    outcome: str = "ok"


class SimulatedKey:
    """Everything the server remembers about one API key, counters included.

    `accepted` counts requests that spent a rate-limit slot (answered 200, or 400
    for a bad nonce, or 503 by fault injection); `ok` counts the 200s only.
    `strikes` are the rejections that count toward blocking.
    """

    __slots__ = (
        "index",
        "key",
        "rings",
        "audits",
        "last_nonce",
        "strikes",
        "cooldown_until_ms",
        "cooldown_s",
        "requests",
        "ok",
        "accepted",
        "rejected_429",
        "rejected_host",
        "rejected_nonce",
        "blocked_answers",
        "faults",
        "requests_during_cooldown",
        "escalations",
        "first_accept_ms",
        "share_pairs",
        "share_gap_ms",
        "all_pairs",
        "all_gap_ms",
        "other_next_ms",
        "other_due_ms",
        "other_accepted",
        "arrivals",
        "rejected_at",
    )

    def __init__(self, index: int, key: str, policies: tuple[Policy, ...]) -> None:
        self.index = index
        self.key = key
        self.rings = [SlotRing(p) for p in policies]
        self.audits = [WindowAudit(p) for p in policies]
        self.last_nonce = 0  # the study's server starts here, so a nonce must be >= 1
        self.strikes = 0
        self.cooldown_until_ms = -math.inf
        self.cooldown_s = 0.0
        self.requests = 0
        self.ok = 0
        self.accepted = 0
        self.rejected_429 = 0
        self.rejected_host = 0
        self.rejected_nonce = 0
        self.blocked_answers = 0
        self.faults = 0
        self.requests_during_cooldown = 0
        self.escalations = 0
        # Sustained share: gaps between accepted arrivals i and i+N of the first policy
        # (N its limit), counted once the key has been accepting for SHARE_WARMUP_S.
        self.first_accept_ms: float | None = None
        self.share_pairs = 0
        self.share_gap_ms = 0.0
        self.all_pairs = 0
        self.all_gap_ms = 0.0
        self.other_next_ms = -math.inf  # when the other user's next request tries (settings.other_load)
        self.other_due_ms = -math.inf  # when that request was due (later ones queue behind it)
        self.other_accepted = 0  # its requests that took a slot
        # The server's stamp (ms) of every request that spent a slot, in arrival order
        # (the other user's are not in it); bounded by ARRIVALS_CAP over all keys.
        self.arrivals: list[float] = []
        self.rejected_at: list[float] = []  # the stamps (ms) of its first `REJECTED_KEPT` 429s


class HostState:
    """The limits and counters every key shares."""

    __slots__ = ("rings", "audits", "accepted", "rejected_429", "unknown_key")

    def __init__(self, policies: tuple[Policy, ...]) -> None:
        self.rings = [SlotRing(p) for p in policies]
        self.audits = [WindowAudit(p) for p in policies]
        self.accepted = 0
        self.rejected_429 = 0
        self.unknown_key = 0


class RateRules:
    """Decides each request from the settings and the time it is given.

    Order of checks, as in the study's server: unknown key (401), blocked key
    (429), then the escalation cooldown, the per-key limits, the host limits
    (429), then the slot is spent, then the nonce (400), then fault injection
    (503), else 200. Host-limit rejections do not count toward blocking or
    escalation: they are the host's budget, not the key's.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        seed = settings.seed
        # Offset from the app's latency stream so the two do not mirror each other.
        self._rng = random.Random(None if seed is None else seed + 1)
        self._policy_header = _policy_header(settings)
        self._other = parse_other_load(settings.other_load) if settings.other_load else None
        self.reset()

    def reset(self) -> None:
        """Forget every stamp, nonce, block and counter (settings stay)."""
        policies = self.settings.policies
        self._states = {key: SimulatedKey(i, key, policies) for i, key in enumerate(self.settings.keys)}
        self._host = HostState(self.settings.host_policies)
        self._origin_ms: float | None = None  # the first request's time: the other load counts from it
        self._arrivals_room = ARRIVALS_CAP
        self.arrivals_dropped = 0  # accept stamps not kept once ARRIVALS_CAP was reached

    def is_known(self, api_key: str | None) -> bool:
        """True if `api_key` is one of the valid keys."""
        return api_key in self._states

    def decide(self, api_key: str | None, nonce: Any, now_ms: float, req_id: Any = None) -> Decision:
        """Answer one request that the server timestamps at `now_ms`.

        `nonce` may be an int or the raw query string; anything that is not an
        integer above the key's last accepted nonce is an invalid nonce (when
        nonces are required). `req_id` is echoed in the success body.
        """
        state = self._states.get(api_key)  # type: ignore[arg-type]
        if state is None:
            self._host.unknown_key += 1
            return Decision(401, _error(MSG_INVALID_KEY), {}, "invalid_key")
        settings = self.settings
        if settings.whole_ms_stamps:
            now_ms = math.floor(now_ms)
        if self._origin_ms is None:
            self._origin_ms = now_ms
        if self._other is not None:
            self._other_user(state, now_ms)
        state.requests += 1

        if settings.block_after and state.strikes >= settings.block_after:
            state.blocked_answers += 1
            return Decision(429, _error(MSG_BLOCKED), {}, "blocked")

        if settings.escalation and now_ms < state.cooldown_until_ms:
            state.requests_during_cooldown += 1
            state.escalations += 1
            state.cooldown_s = min(settings.escalation_cap_s, state.cooldown_s * 2)
            state.cooldown_until_ms = now_ms + state.cooldown_s * 1000.0
            return self._reject_key(state, now_ms, state.cooldown_s * 1000.0, "cooldown")

        wait_ms = _wait_for_room(state.rings, now_ms)
        if wait_ms is not None:
            if settings.escalation:
                state.cooldown_s = settings.escalation_base_s
                state.cooldown_until_ms = now_ms + state.cooldown_s * 1000.0
                wait_ms = max(wait_ms, state.cooldown_s * 1000.0)
            return self._reject_key(state, now_ms, wait_ms, "rate_limited")

        host = self._host
        if host.rings:
            wait_ms = _wait_for_room(host.rings, now_ms)
            if wait_ms is not None:
                state.rejected_host += 1
                host.rejected_429 += 1
                return Decision(
                    429,
                    _error(MSG_HOST_LIMIT),
                    self._headers(state, now_ms, wait_ms),
                    "host_limited",
                )

        self._spend(state, now_ms)

        if settings.nonce:
            value = _as_int(nonce)
            if value is None or value <= state.last_nonce:
                state.rejected_nonce += 1
                return Decision(
                    400,
                    _error(MSG_INVALID_NONCE),
                    self._headers(state, now_ms, None),
                    "invalid_nonce",
                )
            state.last_nonce = value

        if settings.error_rate and self._rng.random() < settings.error_rate:
            state.faults += 1
            return Decision(503, _error(MSG_UNAVAILABLE), self._headers(state, now_ms, 1000.0), "fault")

        state.ok += 1
        return Decision(200, {"status": "OK", "req_id": req_id}, self._headers(state, now_ms, None))

    def _other_user(self, state: SimulatedKey, now_ms: float) -> None:
        """Play the other user's requests on this key up to `now_ms`, in time order before
        ours: each takes a slot of the key's windows, and one that finds them full waits for
        the next slot that frees, the ones after it queued behind it (a client that keeps to
        the limit and loses nothing: they get the rate they asked for, and what is left is
        what the windows leave). No cooldown, no stats."""
        other, origin = self._other, self._origin_ms
        assert other is not None and origin is not None
        start, end = origin + other.start_s * 1000.0, origin + other.end_s * 1000.0
        if state.other_due_ms == -math.inf:
            state.other_due_ms = state.other_next_ms = start
        rings = state.rings
        at = state.other_next_ms
        end -= 1e-6  # a due time a rounding error short of `end` is at `end`: not one more
        while at <= now_ms and state.other_due_ms < end:
            wait = _wait_for_room(rings, at)
            if wait is None:
                for ring in rings:
                    ring.take(at)
                state.other_accepted += 1
                state.other_due_ms += other.gap_ms  # the next one's time; never before this one
                at = max(at, state.other_due_ms)
            else:
                at += max(wait, 0.001)
        state.other_next_ms = at

    def _spend(self, state: SimulatedKey, now_ms: float) -> None:
        """Take a slot in every per-key and host ring, and tell the audits."""
        first = state.first_accept_ms
        if first is None:
            state.first_accept_ms = first = now_ms
        # The slot about to be overwritten holds the arrival N accepts ago.
        older = state.rings[0].oldest()
        if older > -math.inf:
            state.all_pairs += 1
            state.all_gap_ms += now_ms - older
            if older >= first + SHARE_WARMUP_S * 1000.0:
                state.share_pairs += 1
                state.share_gap_ms += now_ms - older
        for ring in state.rings:
            ring.take(now_ms)
        for audit in state.audits:
            audit.record(now_ms)
        host = self._host
        for ring in host.rings:
            ring.take(now_ms)
        for audit in host.audits:
            audit.record(now_ms)
        if self._arrivals_room:
            self._arrivals_room -= 1
            state.arrivals.append(now_ms)
        else:
            self.arrivals_dropped += 1
        state.accepted += 1
        host.accepted += 1

    def _reject_key(self, state: SimulatedKey, now_ms: float, wait_ms: float, outcome: str) -> Decision:
        """A 429 that the key earned: it counts toward the block."""
        state.strikes += 1
        state.rejected_429 += 1
        if len(state.rejected_at) < REJECTED_KEPT:
            state.rejected_at.append(now_ms)
        return Decision(429, _error(MSG_RATE_LIMIT), self._headers(state, now_ms, wait_ms), outcome)

    def _headers(self, state: SimulatedKey, now_ms: float, retry_ms: float | None) -> dict[str, str]:
        """Retry-After and RateLimit headers, as far as the settings ask for them."""
        settings = self.settings
        headers: dict[str, str] = {}
        if retry_ms is not None and settings.retry_after:
            # Retry-After is whole seconds (RFC 9110); round up so it is never early.
            headers["Retry-After"] = str(max(1, math.ceil(retry_ms / 1000.0)))
        if settings.ratelimit_headers:
            headers.update(self._limit_headers(state, now_ms))
        return headers

    def _limit_headers(self, state: SimulatedKey, now_ms: float) -> dict[str, str]:
        # Report the tightest policy: fewest free slots, then the longest wait.
        best: tuple[int, float, SlotRing, bool] | None = None
        candidates = [(r, False) for r in state.rings] + [(r, True) for r in self._host.rings]
        for ring, is_host in candidates:
            remaining = ring.remaining(now_ms)
            reset_ms = _next_restore_ms(ring, remaining, now_ms)
            if best is None or (remaining, -reset_ms) < (best[0], -best[1]):
                best = (remaining, reset_ms, ring, is_host)
        assert best is not None  # settings guarantee at least one per-key policy
        remaining, reset_ms, ring, is_host = best
        name = _policy_name(ring, is_host)
        return {
            "RateLimit-Policy": self._policy_header,
            "RateLimit": f'"{name}";r={remaining};t={math.ceil(reset_ms / 1000.0)}',
            "X-RateLimit-Limit": str(ring.limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": f"{reset_ms / 1000.0:.3f}",
        }

    def share(self) -> dict[str, Any]:
        """How much of the limit the accepted traffic used, as the server saw it.

        With N/W the first policy, `sustained` is W / the mean gap between
        accepted arrivals i and i+N of a key, over every key, leaving out each
        key's first `SHARE_WARMUP_S` seconds of accepts (a client still
        learning); `all` counts those too. 1.0 is a window filled to the limit
        all the time; None until there is a pair.
        """
        window_ms = self.settings.policies[0].window_s * 1000.0
        states = self._states.values()
        pairs = sum(s.share_pairs for s in states)
        gap = sum(s.share_gap_ms for s in states)
        all_pairs = sum(s.all_pairs for s in states)
        all_gap = sum(s.all_gap_ms for s in states)
        return {
            "sustained": round(window_ms * pairs / gap, 4) if gap > 0 else None,
            "all": round(window_ms * all_pairs / all_gap, 4) if all_gap > 0 else None,
            "pairs": pairs,
            "warmup_s": SHARE_WARMUP_S,
        }

    def arrivals_ms(self) -> list[list[float]]:
        """Each key's accept stamps in ms on the server's clock, in key order (the order of
        `stats()["keys"]`): every request that spent a slot, as the server stamped it at
        arrival; the other user's (`other_load`) are not in them. Complete unless
        `arrivals_dropped` is above 0. The lists are the server's own: read, do not change."""
        return [state.arrivals for state in self._states.values()]

    def stats(self, arrivals: bool = False) -> dict[str, Any]:
        """Counters and the audit, JSON-ready. Keys appear masked, with their index.

        With `arrivals`, also `arrivals_ms` (`arrivals_ms()`, to the microsecond) and
        `arrivals_dropped`: large (about 14 bytes a stamp in JSON), so only when asked for.
        """
        block_after = self.settings.block_after
        keys = [_key_stats(state, block_after) for state in self._states.values()]
        host = self._host
        counters = (
            "requests",
            "ok",
            "accepted",
            "rejected_429",
            "rejected_host",
            "rejected_nonce",
            "blocked_answers",
            "faults",
            "requests_during_cooldown",
            "escalations",
        )
        totals = {name: sum(row[name] for row in keys) for name in counters}
        host_audit = [_audit_row(a) for a in host.audits]
        audit_ok = all(a.ok for a in host.audits) and all(
            a.ok for state in self._states.values() for a in state.audits
        )
        out: dict[str, Any] = {
            "mode": self.settings.mode,
            "share": self.share(),
            "policies": [format_policy(p) for p in self.settings.policies],
            "host_policies": [format_policy(p) for p in self.settings.host_policies],
            "audit_ok": audit_ok,
            "totals": totals,
            "host": {
                "accepted": host.accepted,
                "rejected_429": host.rejected_429,
                "unknown_key": host.unknown_key,
                "max_in_window": host_audit,
            },
            "keys": keys,
        }
        if arrivals:
            out["arrivals_ms"] = [[round(t, 3) for t in stamps] for stamps in self.arrivals_ms()]
            out["arrivals_dropped"] = self.arrivals_dropped
            out["rejected_ms"] = [[round(t, 3) for t in state.rejected_at] for state in self._states.values()]
        return out


def _error(message: str) -> dict[str, str]:
    return {"status": "error", "error_msg": message}


def _wait_for_room(rings: list[SlotRing], now_ms: float) -> float | None:
    """None if every ring has room (all-or-nothing), else the longest wait in ms."""
    wait: float | None = None
    for ring in rings:
        if not ring.has_room(now_ms):
            ring_wait = ring.wait_ms(now_ms)
            wait = ring_wait if wait is None else max(wait, ring_wait)
    return wait


def _as_int(value: Any) -> int | None:
    """The nonce as an int, or None if it is not a whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _next_restore_ms(ring: SlotRing, remaining: int, now_ms: float) -> float:
    """Milliseconds until one more slot frees: when the oldest in-window stamp leaves."""
    if remaining >= ring.limit:
        return 0.0
    oldest_in_window = ring.stamps[(ring.index + remaining) % ring.limit]
    return max(0.0, oldest_in_window + ring.window_ms - now_ms)


def _policy_name(ring: SlotRing, is_host: bool) -> str:
    name = format_policy(ring.policy)
    return f"host {name}" if is_host else name


def _policy_header(settings: ServerSettings) -> str:
    """RateLimit-Policy (IETF draft): one item per policy, quota q and window w seconds."""
    items = []
    for policy in settings.policies:
        items.append(f'"{format_policy(policy)}";q={policy.limit};w={_seconds(policy.window_s)}')
    for policy in settings.host_policies:
        items.append(f'"host {format_policy(policy)}";q={policy.limit};w={_seconds(policy.window_s)}')
    return ", ".join(items)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


def _audit_row(audit: WindowAudit) -> dict[str, Any]:
    return {
        "policy": format_policy(audit.policy),
        "limit": audit.policy.limit,
        "max_in_window": audit.max_in_window,
    }


def _key_stats(state: SimulatedKey, block_after: int) -> dict[str, Any]:
    return {
        "index": state.index,
        "key": mask_secret(state.key),
        "requests": state.requests,
        "ok": state.ok,
        "accepted": state.accepted,
        "rejected_429": state.rejected_429,
        "rejected_host": state.rejected_host,
        "rejected_nonce": state.rejected_nonce,
        "blocked": bool(block_after) and state.strikes >= block_after,
        "blocked_answers": state.blocked_answers,
        "faults": state.faults,
        "requests_during_cooldown": state.requests_during_cooldown,
        "escalations": state.escalations,
        "other_accepted": state.other_accepted,
        "max_in_window": [_audit_row(a) for a in state.audits],
    }
