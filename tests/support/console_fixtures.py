"""Fixed inputs for console tests: snapshots, a fake engine host, a test app.

Everything here is deterministic (no wall time, no randomness) so snapshot
tests render the same screen every run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ratedeck.console.app import RatedeckApp
from ratedeck.core.secrets import mask_secret
from ratedeck.core.vocab import Excess, MessagePattern, OutcomeKind
from ratedeck.engine.commands import (
    Command,
    PauseAll,
    PauseKey,
    ResumeAll,
    ResumeKey,
    SetArrivalRate,
    SetBackpressure,
    SetHeadroom,
    SetThrottle,
)
from ratedeck.engine.snapshot import (
    BatchRow,
    BudgetRow,
    ClientRow,
    ClientView,
    ClusterView,
    ErrorRow,
    Event,
    GateRow,
    KeyRow,
    LatencySummary,
    LoopLag,
    MemberRow,
    MessageStats,
    Progress,
    QuotaRow,
    Snapshot,
)
from ratedeck.host.protocol import RunFacts

# 32-character secrets: tests assert none of these ever reaches the screen.
SECRETS = {
    "k1": "A7f3Kq9ZrT2mXw8LbN4pVc6HdJ1sYe5G",
    "k2": "Qm2Rt7Wz9Xb4Nc8Vk3Lp6Hs1Jd5Fg0Ty",
    "k3": "Zx9Cv8Bn7Mq6Wa5Es4Rd3Tf2Yg1Uh0Ij",
    "k4": "Pl0Ok9Ij8Uh7Yg6Tf5Rd4Es3Wa2Qz1Xc",
    "k5": "Hn4Bg7Vf2Cd9Xs5Za1Qw8Er3Ty6Ui0Op",
    "k6": "Jk3Lm8Np2Qr7St1Uv6Wx0Yz5Ab9Cd4Ef",
}

REFRESH_OFF = 3600.0  # refresh "effectively off": tests never wait on the timer


def _series(n: int, base: float, swing: float, period: float, phase: float = 0.0) -> tuple[float, ...]:
    return tuple(
        round(base + swing * math.sin(i / period + phase) + 0.3 * swing * math.sin(i / 3.7), 1)
        for i in range(n)
    )


# The per-key fields the console asks the engine for, with what they mean:
# `fingerprint`: first 6 hex digits of sha256(secret), stable across runs;
# `server_remaining` / `server_limit` / `server_reset_in_s`: the server's own
# count from its last answer's headers (None when it sent none); `latency`:
# this key's send->answer distribution; `recent_errors`: this key's last
# failed attempts, newest last. Those the engine already has are not redeclared.
_PROPOSED_KEY_FIELDS = (
    ("fingerprint", str, ""),
    ("server_remaining", int | None, None),
    ("server_limit", int | None, None),
    ("server_reset_in_s", float | None, None),
    ("latency", LatencySummary | None, None),
    ("recent_errors", tuple, ()),
)
_KEY_FIELDS = {field.name for field in dataclasses.fields(KeyRow)}
ReportedKeyRow = dataclasses.make_dataclass(
    "ReportedKeyRow",
    [
        (name, kind, dataclasses.field(default=default))
        for name, kind, default in _PROPOSED_KEY_FIELDS
        if name not in _KEY_FIELDS
    ],
    bases=(KeyRow,),
    frozen=True,
    slots=True,
)


LAST_ERRORS = {
    "k2": (503, "503: <html><body>Service Unavailable</body></html>"),
    "k4": (429, '429: {"error":"rate limit exceeded","key":"…Ye5G","retry_after":5}'),
    "k6": (None, "timeout: no answer within 10.0s"),
}


def key_rows() -> tuple[KeyRow, ...]:
    """Six busy keys, all active; k2, k4 and k6 have had failures."""
    rows = []
    for index, (label, secret) in enumerate(SECRETS.items()):
        status, error = LAST_ERRORS.get(label, (200, ""))
        rows.append(
            KeyRow(
                label=label,
                masked=mask_secret(secret),
                state="active",
                in_flight=3 + index % 3,
                sent=4_210 + 37 * index,
                succeeded=4_180 + 35 * index,
                rejected_429=index % 2,
                window_used=18 + index % 3,
                window_limit=20,
                last_latency_ms=41.5 + 3.25 * index,
                errors={"k2": 3, "k4": 4, "k6": 6}.get(label, index % 2),
                last_status=200 if label != "k6" else None,
                last_error=error,
            )
        )
    return tuple(rows)


def error_rows() -> tuple[ErrorRow, ...]:
    """Failed attempts by status and cause, consistent with main_snapshot's counters."""
    return (
        ErrorRow(None, OutcomeKind.TIMEOUT, "timeout", 6, "no answer within 10.0s", "k6", 112.2),
        ErrorRow(
            503,
            OutcomeKind.SERVER_ERROR,
            "server error",
            3,
            "<html><body>Service Unavailable</body></html>",
            "k2",
            95.0,
        ),
        ErrorRow(
            429,
            OutcomeKind.RATE_LIMITED,
            "rate limited",
            3,
            '{"error":"rate limit exceeded","key":"…Ye5G","retry_after":5}',
            "k4",
            31.0,
        ),
    )


def events() -> tuple[Event, ...]:
    return (
        Event(0.0, "info", "engine started: 6 keys, capacity 120/s"),
        Event(2.4, "setting", "headroom learned: 25 ms → 30 ms"),
        Event(31.0, "cooldown", "k4 got 429 with Retry-After 5s; k4 cooling"),
        Event(36.0, "cooldown", "k4 cooldown over"),
        Event(74.5, "graveyard", "request 18211 to graveyard after 5 attempts"),
        Event(112.2, "error", "k6: timeout after 10.0s (retrying)"),
    )


def main_snapshot() -> Snapshot:
    """A healthy run three minutes in: near capacity, a little DLQ traffic."""
    return Snapshot(
        elapsed_s=183.4,
        phase="running",
        capacity_tps=120.0,
        live_capacity_tps=120.0,
        throughput_tps=113.6,
        current_tps=117.0,
        generated=21_292,
        succeeded=20_834,
        expired=12,
        graveyard=3,
        shed=0,
        main_depth=412,
        dlq_depth=7,
        in_flight=24,
        sent=21_400,
        rejected_429=3,
        rejected_other=0,
        failed=9,
        retried=12,
        main_max=1_000,
        main_peak=655,
        main_avg=380.2,
        dlq_peak=19,
        dlq_avg=4.1,
        headroom_ms=30.0,
        headroom_adaptive=True,
        headroom_min_ms=25.0,
        headroom_max_ms=35.0,
        backpressure=True,
        arrival_rate=125.0,
        latency=LatencySummary(mean=48.2, p50=44.0, p90=71.5, p99=118.0, max=402.0, p999=260.0, count=20_834),
        latency_total=LatencySummary(mean=160.0, p50=120.0, p90=300.0, p99=820.0, max=1_900.0, count=20_834),
        queue_wait=LatencySummary(mean=110.0, p50=80.0, p90=240.0, p99=700.0, max=1_800.0, count=21_000),
        errors=error_rows(),
        tps_series=_series(180, 112.0, 8.0, 9.0),
        p50_series=_series(180, 44.0, 5.0, 7.0, 1.0),
        p99_series=_series(180, 115.0, 25.0, 11.0, 2.0),
        keys=key_rows(),
        events=events(),
    )


def with_key_state(snap: Snapshot, label: str, **changes: object) -> Snapshot:
    keys = tuple(dataclasses.replace(row, **changes) if row.label == label else row for row in snap.keys)
    return dataclasses.replace(snap, keys=keys)


def paused_snapshot() -> Snapshot:
    """k2 paused by the operator."""
    snap = with_key_state(main_snapshot(), "k2", state="paused", in_flight=0)
    return dataclasses.replace(
        snap, live_capacity_tps=100.0, events=snap.events + (Event(150.0, "pause", "k2 paused by operator"),)
    )


def cooldown_snapshot() -> Snapshot:
    """k4 rejected with Retry-After: cooling with 3.5 s left, 429 counted."""
    snap = with_key_state(
        main_snapshot(), "k4", state="cooling", cooldown_left_s=3.5, in_flight=0, rejected_429=4
    )
    return dataclasses.replace(
        snap,
        live_capacity_tps=100.0,
        events=snap.events + (Event(180.0, "cooldown", "k4 got 429, Retry-After 5s: cooling"),),
    )


def swelling_snapshot() -> Snapshot:
    """Backpressure off and arrivals far above capacity: the main queue swells."""
    snap = main_snapshot()
    return dataclasses.replace(
        snap,
        backpressure=False,
        arrival_rate=260.0,
        main_depth=2_412,
        main_peak=2_412,
        main_avg=1_104.0,
        generated=snap.generated + 2_000,
        events=snap.events + (Event(120.0, "setting", "backpressure off"),),
    )


def gates_snapshot() -> Snapshot:
    """The server closed k1's gate (Retry-After 5s) and, escalating, the host's.

    As in the engine, a key's cooldown is the longest of its own gate and the
    host gate, so every key is cooling; k4's gate closed once earlier and is
    open again.
    """
    snap = main_snapshot()
    keys = tuple(
        dataclasses.replace(
            row, state="cooling", in_flight=0, cooldown_left_s=3.2 if row.label == "k1" else 1.0
        )
        for row in snap.keys
    )
    gates = tuple(
        GateRow(label, 3.2, "429, asked to wait 5s", 2, 0)
        if label == "k1"
        else GateRow(label, 0.0, "429, asked to wait 2s", 1, 0)
        if label == "k4"
        else GateRow(label, 0.0, "", 0, 0)
        for label in SECRETS
    ) + (GateRow("host", 1.0, "503, asked to wait 4s", 3, 1),)
    return dataclasses.replace(
        snap,
        keys=keys,
        gates=gates,
        live_capacity_tps=0.0,
        current_tps=0.0,
        in_flight=0,
        main_depth=snap.main_depth + snap.in_flight,  # nothing sends while the gates are shut
        events=snap.events
        + (
            Event(179.4, "cooldown", "k1 cooling down 5.0s: 429, asked to wait 5s"),
            Event(180.0, "cooldown", "host cooling down 4.0s: 503, asked to wait 4s"),
            Event(180.0, "error", "host: the server escalated its penalty to 4.0s"),
        ),
    )


def open_gates() -> tuple[GateRow, ...]:
    """A gate per key and the host's, none ever closed (a calm run)."""
    return tuple(GateRow(label, 0.0, "", 0, 0) for label in (*SECRETS, "host"))


def message_snapshot() -> Snapshot:
    """Messages of 4 calls each behind an auto throttle: goodput near capacity / 4."""
    snap = main_snapshot()
    return dataclasses.replace(
        snap,
        arrival_rate=31.0,
        gates=open_gates(),
        messages=MessageStats(
            calls_per_message=4,
            pattern=MessagePattern.PARALLEL,
            generated=5_260,
            completed=5_096,
            failed=3,
            shed=41,
            queued=96,
            in_progress=24,
            calls_wasted=9,
            goodput_tps=27.8,
            current_goodput=29.0,
            goodput_series=_series(180, 28.0, 2.0, 9.0, 0.5),
            throttle_mode="auto",
            throttle_rate=29.3,
            excess=Excess.QUEUE,
        ),
        events=snap.events + (Event(160.0, "setting", "entry throttle auto"),),
    )


def cluster_view() -> ClusterView:
    """Three members on one Redis (the first is this one), one of them cut off from it."""
    return ClusterView(
        members=(
            MemberRow(
                "deck-a:4121:9f3c", "running", 38.0, 21_400, 20_834, 3, 412, 7, 24, 20_950, 21_010, "ok"
            ),
            MemberRow(
                "deck-b:977:01aa", "running", 41.0, 19_870, 19_512, 0, 388, 2, 22, 19_700, 19_790, "ok"
            ),
            MemberRow(
                "deck-c.example.internal:31337:be07",
                "draining",
                0.0,
                8_204,
                8_001,
                1,
                0,
                0,
                0,
                8_150,
                8_260,
                "unreachable",
            ),
        ),
        waiting=1_234,
        claimed=12,
        uncertain=2,
        graveyard=3,
        read_at_s=183.0,
    )


def cluster_snapshot() -> Snapshot:
    """A member of a `--store redis://...` run: the store's gate among the gates, the cluster view,
    and enough other lines (client cost, failure causes) that the limiter panel must give some up."""
    snap = main_snapshot()
    return dataclasses.replace(
        snap,
        gates=(*open_gates(), GateRow("store", 0.0, "", 0, 0)),
        cpu_s=26.0,
        failures=(("timed out", 6), ("connection reset", 3)),
        cluster=cluster_view(),
    )


def client_bound_snapshot() -> Snapshot:
    """main_snapshot where the client is the limit: its loop's timers fire 25 ms late at p99
    (a busy callback, not a full core: 14% of one), below its capacity; the round trip's spread
    is measured, so the headroom's basis takes one line."""
    snap = main_snapshot()
    return dataclasses.replace(
        snap,
        cpu_s=26.0,
        rtt_spread_ms=12.0,
        loop_lag_ms=48.0,
        lag=LoopLag(p50_ms=3.4, p99_ms=25.0, core_share=0.14, limit="loop late p99 25 ms"),
    )


def job_snapshot() -> Snapshot:
    """main_snapshot as a job of 50,000 requests fed from a file, 20,849 of them ended."""
    snap = main_snapshot()
    done = snap.succeeded + snap.expired + snap.graveyard + snap.shed + snap.uncertain
    return dataclasses.replace(snap, fed=True, progress=Progress(50_000, done, eta_s=262.4, least_s=243.0))


def empty_snapshot() -> Snapshot:
    """Before the first request: no keys, no series."""
    return Snapshot(phase="starting")


# An OpenAI-like run: a tokens budget per key (per_min learned from x-ratelimit-limit-tokens).
BINDING = {"k1": "tokens", "k2": "tokens", "k3": "requests", "k4": "tokens", "k5": "tokens"}


def token_budget_snapshot() -> Snapshot:
    """main_snapshot as an LLM run: every key has a tokens budget and names the unit that binds
    it; k6 was refused for good with OpenAI's 429 insufficient_quota."""
    snap = main_snapshot()
    keys = []
    budgets = []
    for index, row in enumerate(snap.keys):
        if row.label == "k6":
            row = dataclasses.replace(
                row,
                state="blocked",
                in_flight=0,
                refused_status=429,
                refused_message="You exceeded your current quota, please check your plan and billing details.",
            )
        keys.append(dataclasses.replace(row, binding=BINDING.get(row.label, "")))
        budgets.append(
            BudgetRow(
                "tokens",
                row.label,
                used=24_000 + 1_150 * index,
                limit=30_000,
                unit="tokens",
                per_min=30_000.0,
                reserved=88_400 + 3_100 * index,
                settled=80_100 + 2_700 * index,
            )
        )
    return dataclasses.replace(snap, keys=tuple(keys), budgets=tuple(budgets))


def fingerprint_of(secret: str) -> str:
    """What the console asks the engine to report: sha256(secret)[:6]."""
    import hashlib

    return hashlib.sha256(secret.encode()).hexdigest()[:6]


def reported_snapshot() -> Snapshot:
    """main_snapshot with the per-key fields the console proposes (ReportedKeyRow):
    fingerprints for every key, the server's remaining count for k1..k3, per-key
    latency, and k4's recent errors."""
    snap = main_snapshot()
    keys = []
    for index, row in enumerate(snap.keys):
        fields = {field.name: getattr(row, field.name) for field in dataclasses.fields(KeyRow)}
        extra: dict[str, object] = {"fingerprint": fingerprint_of(SECRETS[row.label])}
        if index < 3:
            extra.update(server_remaining=2 - index % 3, server_limit=20, server_reset_in_s=0.4 + 0.1 * index)
        # k1 was told 25/1s and learned the server's 20/1s from rejections
        extra.update(
            told_limit="25/1s" if index == 0 else "20/1s", learned_limit="20/1s" if index == 0 else None
        )
        # k1's estimate: lowered by a 429 at 25, and someone else used 38% of its last window
        if index == 0:
            extra.update(
                limit_estimate="20/1s",
                estimate_reason="lowered by a 429 at 25",
                estimate_moved_ago_s=12.3,
                estimate_climb="additive",
                shared_share=0.38,
            )
        extra["latency"] = LatencySummary(
            mean=45.0 + index,
            p50=43.0 + index,
            p90=70.0,
            p99=110.0 + 4 * index,
            max=390.0,
            count=row.succeeded,
        )
        if row.label == "k4":
            extra["recent_errors"] = (
                ErrorRow(
                    429,
                    OutcomeKind.RATE_LIMITED,
                    "rate limited",
                    1,
                    '{"error":"rate limit exceeded"}',
                    "k4",
                    29.5,
                ),
                ErrorRow(
                    429,
                    OutcomeKind.RATE_LIMITED,
                    "rate limited",
                    1,
                    '{"error":"rate limit exceeded","key":"…Ye5G","retry_after":5}',
                    "k4",
                    31.0,
                ),
            )
        keys.append(ReportedKeyRow(**{**fields, **extra}))
    return dataclasses.replace(snap, keys=tuple(keys), gates=open_gates())


def many_keys_snapshot(count: int = 500) -> Snapshot:
    """A fleet of keys: every tenth cooling, every 25th paused, every 50th blocked."""
    rows = []
    for index in range(1, count + 1):
        state = "active"
        if index % 50 == 0:
            state = "blocked"
        elif index % 25 == 0:
            state = "paused"
        elif index % 10 == 0:
            state = "cooling"
        secret = f"{index:04d}" + "x" * 24 + f"{(index * 7919) % 10000:04d}"
        rows.append(
            KeyRow(
                label=f"k{index}",
                masked=mask_secret(secret),
                state=state,
                cooldown_left_s=1.5 + index % 7 if state == "cooling" else 0.0,
                in_flight=0 if state != "active" else index % 4,
                sent=1_000 + (index * 37) % 900,
                succeeded=980 + (index * 37) % 880,
                rejected_429=(index * 13) % 7 if index % 3 == 0 else 0,
                window_used=(index * 3) % 21,
                window_limit=20,
                last_latency_ms=30.0 + (index * 17) % 90,
                errors=(index * 13) % 7 if index % 3 == 0 else 0,
                last_status=429 if index % 3 == 0 else 200,
                last_error='429: {"error":"rate limit exceeded"}' if index % 3 == 0 else "",
            )
        )
    snap = main_snapshot()
    per_key = 0.3  # slow keys (18/min): a fleet of them makes the run's capacity
    live = per_key * sum(1 for row in rows if row.state == "active")
    return dataclasses.replace(snap, keys=tuple(rows), capacity_tps=per_key * count, live_capacity_tps=live)


def all_blocked_snapshot() -> Snapshot:
    """The server refused every key for good: nothing can be sent."""
    snap = main_snapshot()
    keys = tuple(
        dataclasses.replace(row, state="blocked", in_flight=0, last_status=403, last_error="403: key revoked")
        for row in snap.keys
    )
    return dataclasses.replace(
        snap,
        keys=keys,
        live_capacity_tps=0.0,
        current_tps=0.0,
        events=snap.events + (Event(182.0, "error", "k6 blocked by the server: 403 key revoked"),),
    )


def _jitter(n: int, base: float, swing: float, seed: int) -> tuple[float, ...]:
    """Deterministic noise around `base` (no randomness: tests render the same every run)."""
    return tuple(
        round(base + swing * math.sin(i * 2.399 + seed) * math.cos(i * 0.7 + seed), 1) for i in range(n)
    )


DEMO_DIP = range(70, 82)  # seconds when k3 was cooling in the demo


def demo_live_capacity(n: int = 125) -> tuple[float, ...]:
    """Live capacity per second of the demo: 98.1/s, 78.5/s while k3 cooled down."""
    return tuple(78.5 if second in DEMO_DIP else 98.1 for second in range(n))


def demo_snapshot() -> Snapshot:
    """What `ratedeck` shows out of the box after two minutes: five seed keys of
    20/1s on the embedded simulator, steady at the limit; p50 wobbles between
    52.2 and 52.6 ms (a log scale keeps that flat)."""
    labels = ("k1", "k2", "k3", "k4", "k5")
    keys = tuple(
        KeyRow(
            label=label,
            masked="…" + "JYA69F5OEEM9XGYSJ5JE"[4 * index : 4 * index + 4],
            state="active",
            in_flight=1,
            sent=2_440 + index,
            succeeded=2_436 + index,
            window_used=19,
            window_limit=20,
            last_latency_ms=52.4 + index / 10,
            last_status=200,
        )
        for index, label in enumerate(labels)
    )
    n = 125
    live = demo_live_capacity(n)
    tps = tuple(min(cap, value) for cap, value in zip(live, _jitter(n, 97.0, 3.0, 1), strict=True))
    return Snapshot(
        elapsed_s=125.3,
        phase="running",
        capacity_tps=100.0,
        live_capacity_tps=98.1,
        throughput_tps=96.9,
        current_tps=97.0,
        generated=12_230,
        succeeded=12_190,
        main_depth=35,
        in_flight=5,
        sent=12_195,
        main_max=50,
        main_peak=50,
        main_avg=31.0,
        headroom_ms=38.0,
        rtt_spread_ms=62.0,
        headroom_adaptive=True,
        headroom_min_ms=21.0,
        headroom_max_ms=100.0,
        backpressure=True,
        arrival_rate=100.0,
        latency=LatencySummary(mean=52.5, p50=52.4, p90=85.0, p99=97.6, max=104.0, p999=101.0, count=12_190),
        latency_total=LatencySummary(mean=400.0, p50=380.0, p90=520.0, p99=610.0, max=900.0, count=12_190),
        queue_wait=LatencySummary(mean=340.0, p50=330.0, p90=460.0, p99=540.0, max=800.0, count=12_195),
        tps_series=tps,
        p50_series=_jitter(n, 52.4, 0.2, 2),
        p99_series=_jitter(n, 97.5, 1.5, 3),
        keys=keys,
        events=(
            Event(0.0, "info", "started: 5 keys, capacity 100/s"),
            Event(0.0, "info", "embedded simulator: http://127.0.0.1:41473/api/request"),
            Event(1.2, "setting", "headroom learned: 100 ms → 60 ms"),
            Event(9.8, "setting", "headroom learned: 60 ms → 38 ms"),
        ),
        gates=tuple(GateRow(label, 0.0, "", 0, 0) for label in labels),
    )


class FakeHost:
    """An `EngineHost` that serves a fixed snapshot and applies commands to itself.

    Paused keys, headroom (value and adaptive flag), backpressure, arrival
    rate and the entry throttle are kept here so the next `snapshot()`
    reflects every command. `advance(s)` moves time on: elapsed grows and
    closed gates count down. `commands` records what was sent; `stop_calls`
    counts `stop()`.
    """

    def __init__(self, base: Snapshot | None = None, config_extra: dict | None = None) -> None:
        self.base = base if base is not None else main_snapshot()
        self.paused = {row.label for row in self.base.keys if row.state == "paused"}
        self.headroom_ms = self.base.headroom_ms
        self.headroom_adaptive = self.base.headroom_adaptive
        self.backpressure = self.base.backpressure
        self.arrival_rate = self.base.arrival_rate
        base_messages = self.base.messages
        self.throttle_mode = base_messages.throttle_mode if base_messages else "off"
        self.throttle_fixed = (
            base_messages.throttle_rate if base_messages and base_messages.throttle_mode == "fixed" else 0.0
        )
        self.elapsed_s = self.base.elapsed_s
        self.gates = self.base.gates
        self.events: list[Event] = list(self.base.events)
        self.commands: list[Command] = []
        self.stop_calls = 0
        self.stopped = False
        self.config_extra = config_extra or {}

    def _event(self, kind: str, text: str) -> None:
        self.events.append(Event(self.elapsed_s, kind, text))

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: the run ages and every closed gate counts down."""
        self.elapsed_s += seconds
        self.gates = tuple(
            dataclasses.replace(gate, left_s=round(max(0.0, gate.left_s - seconds), 1)) for gate in self.gates
        )

    def throttle_rate(self) -> float:
        m = self.base.messages
        if self.throttle_mode == "fixed":
            return self.throttle_fixed
        if self.throttle_mode == "auto" and m is not None:
            if m.throttle_mode == "auto":
                return m.throttle_rate
            return round(self.base.capacity_tps / m.calls_per_message, 3)
        return 0.0

    def send(self, command: Command) -> None:
        self.commands.append(command)
        match command:
            case PauseKey(key):
                self.paused.add(key)
                self._event("pause", f"{key} paused by operator")
            case ResumeKey(key):
                self.paused.discard(key)
                self._event("pause", f"{key} resumed by operator")
            case PauseAll():
                self.paused = {row.label for row in self.base.keys if row.state != "blocked"}
                self._event("pause", "all keys paused by operator")
            case ResumeAll():
                self.paused.clear()
                self._event("pause", "all keys resumed by operator")
            case SetHeadroom(ms):
                self.headroom_adaptive = ms is None
                if ms is not None:
                    self.headroom_ms = ms
                self._event("setting", f"headroom {'adaptive' if ms is None else f'{ms:g} ms'}")
            case SetBackpressure(on):
                self.backpressure = on
                self._event("setting", f"backpressure {'on' if on else 'off'}")
            case SetArrivalRate(rate):
                self.arrival_rate = rate
                self._event("setting", f"arrival rate {rate:g}/s")
            case SetThrottle(value):
                # As the engine: a plain request run has no throttle to set.
                if self.base.messages is None or self.base.messages.calls_per_message <= 1:
                    self._event("error", "the entry throttle needs a message workload")
                elif value in ("off", "auto"):
                    self.throttle_mode = value
                else:
                    self.throttle_mode, self.throttle_fixed = "fixed", float(value)
                self._event("setting", f"entry throttle {value}")

    def _key(self, row: KeyRow) -> KeyRow:
        if row.state == "cooling":
            left = max(
                (gate.left_s for gate in self.gates if gate.name in (row.label, "host")),
                default=row.cooldown_left_s,
            )
            row = dataclasses.replace(row, cooldown_left_s=left, state="cooling" if left > 0 else "active")
        if row.label in self.paused:
            return dataclasses.replace(row, state="paused", cooldown_left_s=0.0)
        if row.state == "paused":
            return dataclasses.replace(row, state="active")
        return row

    def snapshot(self) -> Snapshot:
        keys = tuple(self._key(row) for row in self.base.keys)
        # As the engine: only keys that can send now count (equal keys here).
        live = self.base.live_capacity_tps
        if keys:
            base_active = sum(1 for row in self.base.keys if row.state == "active")
            per_key = live / base_active if base_active else self.base.capacity_tps / len(keys)
            live = per_key * sum(1 for row in keys if row.state == "active")
        return dataclasses.replace(
            self.base,
            live_capacity_tps=live,
            phase="stopped" if self.stopped else self.base.phase,
            elapsed_s=self.elapsed_s,
            gates=self.gates,
            messages=(
                dataclasses.replace(
                    self.base.messages, throttle_mode=self.throttle_mode, throttle_rate=self.throttle_rate()
                )
                if self.base.messages is not None
                else None
            ),
            keys=keys,
            headroom_ms=self.headroom_ms,
            headroom_adaptive=self.headroom_adaptive,
            backpressure=self.backpressure,
            arrival_rate=self.arrival_rate,
            events=tuple(self.events[-100:]),
        )

    def effective_config(self) -> dict:
        return {
            "limiter": {"headroom_ms": self.headroom_ms, "headroom_adaptive": self.headroom_adaptive},
            "queue": {"backpressure": self.backpressure, "main_max": self.base.main_max},
            "workload": {"arrival_rate": self.arrival_rate},
            **self.config_extra,
        }

    async def stop(self) -> Snapshot:
        self.stop_calls += 1
        self.stopped = True
        return self.snapshot()

    # The rest of an `EngineHost`: a fake has nothing to cut short and no counts beyond its snapshot.
    server_stats: dict | None = None
    aborted = False
    facts = RunFacts()

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        self.stop_calls += 1
        self.stopped = True
        return self.snapshot()

    def abort(self) -> Snapshot:
        self.aborted = True
        self.stopped = True
        return self.snapshot()


class ReplayHost:
    """Plays a snapshot's per-second series a second at a time, as a running
    engine publishes them, with each second's live capacity from `live`.

    `step()` moves one second on; `replay(app)` steps through every second,
    pulling a snapshot after each, so the console builds its history as it
    would while watching the run.
    """

    def __init__(self, base: Snapshot, live: tuple[float, ...]) -> None:
        self.host = FakeHost(base)
        self.base = base
        self.live = live
        self.second = 0
        self.commands = self.host.commands

    def step(self) -> None:
        self.second = min(self.second + 1, len(self.base.tps_series))

    def snapshot(self) -> Snapshot:
        snap = self.host.snapshot()
        n = self.second
        return dataclasses.replace(
            snap,
            elapsed_s=n + self.base.elapsed_s % 1,
            tps_series=snap.tps_series[:n],
            p50_series=snap.p50_series[:n],
            p99_series=snap.p99_series[:n],
            live_capacity_tps=self.live[min(n, len(self.live) - 1)],
        )

    def replay(self, app: RatedeckApp) -> None:
        while self.second < len(self.base.tps_series):
            self.step()
            app.pull_snapshot()

    def send(self, command: Command) -> None:
        self.host.send(command)

    def effective_config(self) -> dict:
        return self.host.effective_config()

    async def stop(self) -> Snapshot:
        await self.host.stop()
        return self.snapshot()


def make_app(
    base: Snapshot | None = None,
    *,
    host: FakeHost | None = None,
    profile_path: str | Path = "ratedeck-profile.toml",
    **kwargs: object,
) -> RatedeckApp:
    """A console over a `FakeHost`, with the refresh timer effectively off."""
    kwargs.setdefault("keys_refresh_s", 0.0)  # tests see every pull in the table
    return RatedeckApp(
        host if host is not None else FakeHost(base),
        profile_path=str(profile_path),
        refresh_s=REFRESH_OFF,
        **kwargs,  # type: ignore[arg-type]
    )


def screen_text(app: RatedeckApp) -> str:
    """The running app's screen as plain text (what a terminal would show)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def async_test(test):
    """Run an `async def` test on a fresh event loop (no asyncio plugin needed)."""
    import asyncio
    import functools

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def gateway_clients_snapshot() -> Snapshot:
    """main_snapshot's run as a gateway with three named clients in an LLM pool (shares in
    tokens): chat (interactive), nightly (batch, a tokens_per_minute quota nearly spent, some
    requests refused past it) and tools (standard, weight 3)."""
    rows = (
        ClientRow(
            "chat", "interactive", 1.0, waiting=0, answered=412, wait_p50_ms=12.0, wait_p99_ms=840.0,
            share=0.18, served=61_200.0, sent=412,
        ),
        ClientRow(
            "nightly", "batch", 1.0, waiting=37, answered=1_580, wait_p50_ms=2_400.0, wait_p99_ms=31_000.0,
            share=0.34, served=1_904_000.0, sent=1_590, refused=4,
            quotas=(QuotaRow("tokens_per_minute", 100_000.0, 8_000.0),),
        ),
        ClientRow(
            "tools", "standard", 3.0, waiting=5, answered=906, wait_p50_ms=45.0, wait_p99_ms=1_200.0,
            share=0.48, served=310_000.0, sent=910, quotas=(QuotaRow("usd_per_day", 50.0, 31.5),),
        ),
    )  # fmt: skip
    clients = ClientView(
        waiting=42,
        answered=2_898,
        wait_p50_ms=38.0,
        wait_p99_ms=24_000.0,
        statuses=((200, 2_880), (429, 4), (499, 14)),
        rows=rows,
        unit="tokens",
    )
    return dataclasses.replace(main_snapshot(), clients=clients)


def gateway_batches() -> tuple[BatchRow, ...]:
    """Three batches of the Batch APIs, in the snapshot's order (not final first): nightly's
    OpenAI batch in progress (260 of 600 lines ended, 1m20s left), a tools' Anthropic batch
    cancelling, and a chat batch completed with 3 of its 120 lines failed."""
    return (
        BatchRow("batch_6a1f0c2e9d4b7a35", "openai", "nightly", "in_progress", 600, 260, 0, eta_s=80.0),
        BatchRow("msgbatch_01HQ7Z3KX2c4e8f1", "anthropic", "tools", "cancelling", 200, 120, 0, eta_s=None),
        BatchRow("batch_0b9e77d1c5a2f480", "openai", "chat", "completed", 120, 120, 3),
    )


def gateway_batches_snapshot() -> Snapshot:
    """gateway_clients_snapshot's gateway (three named clients) serving three batches
    (`gateway_batches`)."""
    snap = gateway_clients_snapshot()
    assert snap.clients is not None
    return dataclasses.replace(snap, clients=dataclasses.replace(snap.clients, batches=gateway_batches()))
