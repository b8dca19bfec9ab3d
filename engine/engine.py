"""The engine: its lifecycle (start, run, stop), its commands (`apply`) and its snapshot.

Every request ends in exactly one place (`Ending`): succeeded, uncertain,
expired, graveyard or shed; while the run lasts it is queued (main or DLQ) or in
flight. The engine runs on one asyncio loop; a front end reaches it through
a host (`ratedeck.host`), which pulls snapshots and pushes commands.

Its parts are built once, in order, by the composition root (`build.py`),
each handed the few capabilities it uses (`ports.py`), never the engine.
A request's path, one direction: a `Source` submits it to the intake
(`path/intake.py`, the `SourceSink`) -> `WorkQueues` -> a `KeyWorker` takes
it when its limits have a slot and launches it into the `RequestPath` -> the
`Transport` answers -> the key learns from the answer (`KeyLimits.learn`) ->
`settle.decide` says what it means -> the path counts it, pauses whom it
must, and retries the request or hands its end to the run's end
(`path/ending.py`), which tells the request's caller and the finish watchers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ratedeck.core.errors import RatedeckError
from ratedeck.core.numbers import readable
from ratedeck.core.vocab import EventKind, Phase

from .build import EngineParts, build_parts
from .commands import (
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
from .observe.loop_watch import LOOP_LAG_WARN_EVERY_S, LOOP_LAG_WARN_MS
from .ports import Cooldown, FinishWatcher, SharedState, Source, Transport
from .settings import EngineSettings, HoldsEngineSettings, engine_settings

if TYPE_CHECKING:
    from ratedeck.engine.path.worker import KeyWorker
    from ratedeck.engine.snapshot import Snapshot

__all__ = ["LOOP_LAG_WARN_EVERY_S", "LOOP_LAG_WARN_MS", "Engine", "UnknownKey", "engine_clock", "loop_name"]


def engine_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The engine's one clock: the loop's own time, unless that time is coarse.

    uvloop's `time()` is whole milliseconds, cached once per loop turn: a
    send stamped with it can be stamped early by a busy turn, which eats
    into the headroom. It counts on the same monotonic clock, so timers set
    with `call_at` still agree with `time.monotonic()`. Standard and test
    (virtual time) loops keep their own `time()`.
    """
    if isinstance(loop, asyncio.BaseEventLoop):
        return loop.time
    return time.monotonic


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """ "uvloop" or "asyncio": the loop's family, as the report names it."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


class UnknownKey(RatedeckError, ValueError):
    """A command named a key id that does not exist."""


class Engine:
    """Runs one configured workload against one target through a `Transport`.

    Use `start()` on a running loop (or `await run()`), steer it with
    `apply(command)`, read it with `snapshot()`, end it with `await stop()`.

    `cooldown` is how a server's delay is honoured (`ports.Cooldown`): by
    default it closes the budget's gate for every sender (`path.SharedGates`).
    `retry_errors` false hands errors other than rate limits back at once
    (a library caller). The parts are `parts` (`build.EngineParts`): a host reads
    and steers them there (or through the ports they implement), never through the engine.
    """

    def __init__(
        self,
        cfg: EngineSettings | HoldsEngineSettings,
        transport: Transport,
        *,
        source: Source | None = None,
        rng: random.Random | None = None,
        shared_state: SharedState | None = None,
        cooldown: Cooldown | None = None,
        retry_errors: bool = True,
    ):
        self.cfg = cfg = engine_settings(cfg)
        self.parts: EngineParts = build_parts(
            cfg,
            transport,
            source=source,
            rng=rng,
            shared_state=shared_state,
            cooldown=cooldown,
            retry_errors=retry_errors,
        )
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------ what hosts call besides
    @property
    def finished(self) -> asyncio.Event | None:
        """Set when the run's work is done (a job's last request ended); None before `start`."""
        return self.parts.ends.finished

    def event(self, kind: EventKind, text: str) -> None:
        """One line in the run's event log (the console's and the report's)."""
        self.parts.log.event(kind, text)

    def watch(self, watcher: FinishWatcher) -> None:
        """Tell `watcher` of every request that ends (`ports.FinishWatcher`)."""
        self.parts.ends.watch(watcher)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start workers, the source and the ticker on the running loop."""
        p = self.parts
        run = p.run
        loop = run.loop = asyncio.get_running_loop()
        run.clock = engine_clock(loop)
        run.started_at = run.clock()
        run.wall_offset = time.time() - run.started_at
        p.loop.start(run.started_at, loop_name(loop))
        p.log.start(run.clock, run.started_at)
        p.path.start(loop, run.clock, run.started_at, run.wall_offset)
        for lim in p.keys.all_limiters():
            lim.align(run.wall_offset, run.started_at)  # fixed windows turn at the clock's minutes
        p.ends.start()
        run.phase = Phase.RUNNING
        self._tasks = [loop.create_task(w.run(), name=f"key-{w.label}") for w in p.keys.workers]
        self._tasks.append(loop.create_task(p.source.run(p.intake), name="source"))
        self._tasks.append(loop.create_task(self._tick(), name="ticker"))
        if p.cluster is not None:
            p.cluster.start()
        if p.probe is not None:
            probing = p.probe.run(run.clock, p.headroom.observe_network, p.ends.problem)
            self._tasks.append(loop.create_task(probing, name="probe"))
        capacity = readable(self.cfg.capacity_tps)
        p.log.event(EventKind.INFO, f"started: {len(p.keys)} keys, capacity {capacity}/s")
        if p.keys.discovering:
            # No limit given: one request per key to learn what the server advertises.
            p.log.event(EventKind.INFO, "no limit given: one request in flight per key until the server says")
            p.intake.limits_discovered()

    async def run(self, duration_s: float | None = None) -> Snapshot:
        """Start, run until `duration_s` passes or the workload is done, then stop."""
        self.start()
        finished = self.parts.ends.finished
        assert finished is not None
        try:
            if duration_s is None:
                await finished.wait()
            else:
                try:
                    await asyncio.wait_for(finished.wait(), duration_s)
                except TimeoutError:
                    pass
        finally:
            snap = await self.stop()
        return snap

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Stop generating and sending, let in-flight attempts finish (bounded).

        Queued requests stay queued and in-flight ones that did not finish in
        time stay in flight: both are reported, never dropped.
        """
        p = self.parts
        run = p.run
        if run.ended_at is not None:
            return self.snapshot()
        run.stopping = True
        run.phase = Phase.DRAINING
        p.queues.release_space()
        for w in p.keys.workers:
            w.poke()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if p.cluster is not None:
            await p.cluster.close()
        if p.probe is not None:
            await p.probe.close()
        timeout = self.cfg.drain_s if drain_timeout_s is None else drain_timeout_s
        if p.path.sends:
            _done, pending = await asyncio.wait(set(p.path.sends.values()), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        self._expire_queued(run.clock())
        run.ended_at = run.clock()
        p.loop.stop()
        run.phase = Phase.STOPPED
        p.source.close_second()  # flush what the source still holds (shed lines)
        self._flush_graveyard()
        recorder = p.path.recorder
        if recorder is not None and (problem := recorder.close()):
            p.ends.problem(problem)
        p.log.event(EventKind.INFO, "stopped")
        return self.snapshot()

    # ------------------------------------------------------------ ticking
    async def _tick(self) -> None:
        """Ten times a second: expire queued requests, sample depths and the pace of a job; each second roll series."""
        p = self.parts
        clock = p.run.clock
        next_second = p.run.started_at + 1.0
        while True:
            due = clock() + 0.1
            await asyncio.sleep(0.1)
            now = clock()
            p.loop.note_lag(now - due, now)
            self._expire_queued(now)
            p.metrics.sample_depths(p.queues.fresh(), p.queues.retries())
            p.progress.tick(now)
            p.keys.resize_in_flight(bool(len(p.queues)))
            while now >= next_second:
                p.metrics.close_second()
                for worker in p.keys:
                    worker.stats.latency.fold()
                p.source.close_second()
                next_second += 1.0
                self._flush_graveyard()
            p.ends.check_finished()

    def _expire_queued(self, now: float) -> None:
        for req in self.parts.queues.drain_expired(now):
            self.parts.path.expire(req)

    def _flush_graveyard(self) -> None:
        problem = self.parts.graveyard.flush()
        if problem:
            self.parts.ends.problem(problem)

    # ------------------------------------------------------------ control
    def apply(self, cmd: Command) -> None:
        """Apply one command now. Raises `UnknownKey` for a key id that does not exist,
        ValueError for a value the engine cannot take."""
        match cmd:
            case PauseKey(key=key):
                self._worker(key).paused = True
                self.event(EventKind.PAUSE, f"{key} paused")
            case ResumeKey(key=key):
                w = self._worker(key)
                w.paused = False
                w.poke()
                self.event(EventKind.PAUSE, f"{key} resumed")
            case PauseAll():
                for w in self.parts.keys.workers:
                    w.paused = True
                self.event(EventKind.PAUSE, "all keys paused")
            case ResumeAll():
                for w in self.parts.keys.workers:
                    w.paused = False
                    w.poke()
                self.event(EventKind.PAUSE, "all keys resumed")
            case SetHeadroom(ms=ms):
                headroom = self.parts.headroom
                if ms is None:
                    headroom.set_adaptive()
                    self.event(EventKind.SETTING, "headroom adaptive")
                else:
                    if not ms >= 0 or ms == float("inf"):
                        raise ValueError(f"headroom must be a finite number of ms, 0 or more, got {ms}")
                    headroom.set_fixed(ms)
                    self.event(EventKind.SETTING, f"headroom fixed at {headroom.value_ms:g} ms")
                self._poke_all()
            case SetBackpressure(on=on):
                self.parts.intake.backpressure = on
                if not on:
                    self.parts.queues.release_space()
                self.parts.source.poke()
                self.event(EventKind.SETTING, f"backpressure {'on' if on else 'off'}")
            case SetArrivalRate(rate=rate):
                if not rate >= 0 or rate == float("inf"):
                    raise ValueError(f"arrival rate must be a finite number, 0 or more, got {rate}")
                self.parts.source.set_rate(rate)
                self.event(EventKind.SETTING, f"arrival rate {readable(rate)}/s")
            case SetThrottle(mode_or_rate=value):
                self.parts.source.set_throttle(value)
                self.event(EventKind.SETTING, f"entry throttle {value}")
            case _:
                raise TypeError(f"not a command: {cmd!r}")
        # Pausing or resuming keys changes what an auto throttle may admit.
        self.parts.source.poke()

    def _worker(self, key: str) -> KeyWorker:
        try:
            return self.parts.keys.by_label[key]
        except KeyError:
            raise UnknownKey(f"no key {key!r}; keys are {', '.join(self.parts.keys.by_label)}") from None

    def _poke_all(self) -> None:
        for w in self.parts.keys.workers:
            w.poke()

    # ------------------------------------------------------------ reading
    def snapshot(self) -> Snapshot:
        """An immutable picture of everything, consistent because it is built on the loop."""
        return self.parts.snapshots.build()
