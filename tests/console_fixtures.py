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
from ratedeck.core.vocab import Excess, MessagePattern
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
from ratedeck.engine.snapshot import Event, GateRow, KeyRow, LatencySummary, MessageStats, Snapshot

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


def key_rows() -> tuple[KeyRow, ...]:
    """Six busy keys, all active."""
    rows = []
    for index, (label, secret) in enumerate(SECRETS.items()):
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
            )
        )
    return tuple(rows)


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
        latency=LatencySummary(mean=48.2, p50=44.0, p90=71.5, p99=118.0, max=402.0),
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
    return dataclasses.replace(snap, events=snap.events + (Event(150.0, "pause", "k2 paused by operator"),))


def cooldown_snapshot() -> Snapshot:
    """k4 rejected with Retry-After: cooling with 3.5 s left, 429 counted."""
    snap = with_key_state(
        main_snapshot(), "k4", state="cooling", cooldown_left_s=3.5, in_flight=0, rejected_429=4
    )
    return dataclasses.replace(
        snap, events=snap.events + (Event(180.0, "cooldown", "k4 got 429, Retry-After 5s: cooling"),)
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


def empty_snapshot() -> Snapshot:
    """Before the first request: no keys, no series."""
    return Snapshot(phase="starting")


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
        return dataclasses.replace(
            self.base,
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
            keys=tuple(self._key(row) for row in self.base.keys),
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


def make_app(
    base: Snapshot | None = None,
    *,
    host: FakeHost | None = None,
    profile_path: str | Path = "ratedeck-profile.toml",
    **kwargs: object,
) -> RatedeckApp:
    """A console over a `FakeHost`, with the refresh timer effectively off."""
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
