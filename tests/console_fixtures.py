"""Fixed inputs for console tests: snapshots, a fake engine host, a test app.

Everything here is deterministic (no wall time, no randomness) so snapshot
tests render the same screen every run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ratedeck.console.app import RatedeckApp
from ratedeck.engine.commands import (
    Command,
    PauseAll,
    PauseKey,
    ResumeAll,
    ResumeKey,
    SetArrivalRate,
    SetBackpressure,
    SetHeadroom,
)
from ratedeck.engine.masking import mask_secret
from ratedeck.engine.snapshot import Event, KeyRow, LatencySummary, Snapshot

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
    snap = with_key_state(main_snapshot(), "k4", state="cooling", cooldown_left_s=3.5, in_flight=0,
                          rejected_429=4)
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


def empty_snapshot() -> Snapshot:
    """Before the first request: no keys, no series."""
    return Snapshot(phase="starting")


class FakeHost:
    """An `EngineHost` that serves a fixed snapshot and applies commands to itself.

    Paused keys, headroom (value and adaptive flag), backpressure and arrival
    rate are kept here so the next `snapshot()` reflects every command.
    `commands` records what was sent; `stop_calls` counts `stop()`.
    """

    def __init__(self, base: Snapshot | None = None, config_extra: dict | None = None) -> None:
        self.base = base if base is not None else main_snapshot()
        self.paused = {row.label for row in self.base.keys if row.state == "paused"}
        self.headroom_ms = self.base.headroom_ms
        self.headroom_adaptive = self.base.headroom_adaptive
        self.backpressure = self.base.backpressure
        self.arrival_rate = self.base.arrival_rate
        self.events: list[Event] = list(self.base.events)
        self.commands: list[Command] = []
        self.stop_calls = 0
        self.stopped = False
        self.config_extra = config_extra or {}

    def _event(self, kind: str, text: str) -> None:
        self.events.append(Event(self.base.elapsed_s, kind, text))

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

    def _key(self, row: KeyRow) -> KeyRow:
        if row.label in self.paused:
            return dataclasses.replace(row, state="paused", cooldown_left_s=0.0)
        if row.state == "paused":
            return dataclasses.replace(row, state="active")
        return row

    def snapshot(self) -> Snapshot:
        return dataclasses.replace(
            self.base,
            phase="stopped" if self.stopped else self.base.phase,
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
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
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
