"""Messages that need several calls, and the entry throttle that keeps goodput up.

A message is done only when all of its `calls` succeed; one call that expires,
is buried or is refused fails the whole message, and every attempt already
spent on it is wasted. Past capacity this makes goodput (messages completed
per second) fall instead of levelling off: with n parallel calls each call
wins a slot with probability about capacity / (arrival x n), and the message
needs all n. The remedy is to admit messages at the entry no faster than
capacity / n; `MessageWorkload` does that and handles the excess by queueing
(the source waits), shedding (counted and written to a file) or sampling.

How calls travel: each call is an ordinary engine `Request`, so limiter,
retries, TTL and accounting all apply per call. A call is created when its
message is admitted (parallel: all n at once) or when the previous call
succeeded (sequential), so each call's TTL runs from its own creation. A call
that finds the engine's main queue full (backpressure on) is refused at once:
it is counted as generated and shed, and its message fails. When a message
fails, its calls that were not sent yet are cancelled by moving their
deadline into the past: the worker or the ticker expires them without a send,
so the engine's request accounting stays balanced at every instant.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

from ratedeck.core.throttle import parse_throttle
from ratedeck.core.vocab import Excess, MessagePattern
from ratedeck.engine.jsonl import JsonLines
from ratedeck.engine.limits.waker import Waker
from ratedeck.engine.request import Request
from ratedeck.engine.settings import EngineSettings
from ratedeck.engine.snapshot import MessageStats

from .workload import Workload, read_jsonl

if TYPE_CHECKING:
    from ratedeck.engine.ports import Source, SourceSink

PATTERNS = tuple(MessagePattern)
EXCESS = tuple(Excess)


class Message:
    """One message in progress: its calls and how far they got."""

    __slots__ = ("id", "arrived_at", "params", "next_call", "ok", "open", "failed", "spent", "calls")

    def __init__(self, id: int, arrived_at: float, params: dict | None = None):
        self.id = id
        self.arrived_at = arrived_at
        self.params = params  # given to every call of the message
        self.next_call = 0  # calls created so far
        self.ok = 0  # calls succeeded
        self.open = 0  # calls created and not finished
        self.failed = False
        self.spent = 0  # attempts of finished calls (wasted if the message fails)
        self.calls: list[Request] = []


class MessageCounts:
    """Where the messages went: arrived == completed + failed + shed + backlog + in
    progress; the attempts they wasted; completions per second (goodput)."""

    __slots__ = (
        "arrived",
        "completed",
        "failed",
        "shed",
        "calls_wasted",
        "calls_cancelled",
        "goodput",
        "_second",
    )

    def __init__(self, series_len: int):
        self.arrived = self.completed = self.failed = self.shed = 0
        self.calls_wasted = 0  # attempts spent on messages that failed
        self.calls_cancelled = 0  # calls of failed messages expired before any send
        self.goodput: deque[float] = deque(maxlen=series_len)
        self._second = 0  # completions this second

    def complete(self) -> None:
        self.completed += 1
        self._second += 1

    def close_second(self) -> None:
        self.goodput.append(float(self._second))
        self._second = 0


class Sampler:
    """Takes `fraction` of the arrivals, evenly: an accumulator, not a coin."""

    __slots__ = ("fraction", "_acc")

    def __init__(self, fraction: float):
        self.fraction = fraction
        self._acc = 0.0

    def take(self) -> bool:
        self._acc += self.fraction
        if self._acc < 1.0:
            return False
        self._acc -= 1.0
        return True


class ShedLog:
    """Shed messages as JSONL lines in `path` (none without one), written once a second."""

    __slots__ = ("path", "_lines", "_out")

    def __init__(self, path: str | None):
        self.path = path or None
        self._lines: list[str] = []  # written once a second (or when the source ends)
        self._out = JsonLines(self.path, "shed messages to") if self.path else None

    def add(self, line: dict) -> None:
        if self.path:
            self._lines.append(json.dumps(line))

    def flush(self, sink: SourceSink) -> None:
        out = self._out
        if out is None or not self._lines:
            return
        if not out.write_lines(self._lines) and out.problem:
            sink.problem(out.problem)  # later lines are counted, not written
        self._lines.clear()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


class MessageWorkload:
    """Messages of `calls` calls arriving at `rate` per second, behind an entry throttle.

    A `Source` like `Workload`, with an entry throttle (`set_throttle`) and
    its own part of the snapshot (`stats`) and per-second series (`close_second`),
    which the engine calls when it builds a snapshot and once a second.

    Attributes:
        calls: calls each message needs (n).
        pattern: "parallel" (all calls at once) or "sequential" (each call
            after the previous one succeeded).
        throttle_mode: "off", "auto" (live capacity / n) or "fixed".
        excess: what happens to a message the throttle cannot admit now:
            "queue" (held in a bounded backlog; when that is full the source
            waits), "shed" (dropped, counted, one JSONL line in `shed_path`)
            or "sample" (only `sample_fraction` of arrivals are taken, the rest
            shed; a taken message the throttle cannot admit is shed too).
    """

    clients = False  # the user's own work: its graveyard goes where the run puts it

    def __init__(
        self,
        rate: float,
        *,
        calls: int = 1,
        pattern: str = "parallel",
        throttle: str | float = "off",
        excess: str = "queue",
        sample_fraction: float = 1.0,
        shed_path: str | None = None,
        backlog_max: int = 1000,
        poisson: bool = False,
        total: int | None = None,
        items=None,
        rng: random.Random | None = None,
        series_len: int = 300,
    ):
        if calls < 1:
            raise ValueError(f"calls must be at least 1, got {calls}")
        if pattern not in PATTERNS:
            raise ValueError(f"pattern must be parallel or sequential, got {pattern!r}")
        if excess not in EXCESS:
            raise ValueError(f"excess must be queue, shed or sample, got {excess!r}")
        self.rate = float(rate)
        self.calls = calls
        self.pattern = pattern
        self.throttle_mode, self.throttle_fixed = parse_throttle(throttle)
        self.excess = excess
        self.sampler = Sampler(sample_fraction)
        self.shed_log = ShedLog(shed_path)
        self.backlog_max = backlog_max
        self.poisson = poisson
        self.total = total
        self.items = items
        self.fed = False  # messages always arrive at their rate (the entry throttle paces them)
        self.rng = rng or random.Random()
        self.cancel_failed = True
        self.exhausted = False
        self.counts = MessageCounts(series_len)
        self.backlog: deque[Message] = deque()
        self.in_progress: dict[int, Message] = {}
        self._sink: SourceSink | None = None
        self._waker = Waker()
        self._next_id = 0

    @classmethod
    def from_config(cls, cfg: EngineSettings, rng: random.Random) -> MessageWorkload:
        m, w = cfg.messages, cfg.workload
        if m is None:
            raise ValueError("a message workload needs a [messages] section")
        items = read_jsonl(w.file) if w.file else None
        return cls(
            cfg.arrival_rate / m.calls if w.rate is None else cfg.arrival_rate,
            calls=m.calls,
            pattern=m.pattern,
            throttle=m.throttle,
            excess=m.excess,
            sample_fraction=m.sample_fraction,
            shed_path=m.shed_path,
            backlog_max=m.backlog_max,
            poisson=w.arrival == "poisson",
            total=w.total,
            items=items,
            rng=rng,
        )

    # ------------------------------------------------------------ steering
    @property
    def job(self) -> bool:
        """Never measured as a job: a message's calls are not the limits' units (no makespan)."""
        return False

    @property
    def job_total(self) -> None:
        return None  # messages, not jobs: their own counts (MessageStats)

    @property
    def job_models(self) -> None:
        return None

    def set_rate(self, rate: float) -> None:
        self.rate = float(rate)
        self.poke()

    def set_throttle(self, value: str | float) -> None:
        """ "off", "auto" or a fixed rate in messages/s; raises ValueError otherwise."""
        self.throttle_mode, self.throttle_fixed = parse_throttle(value)
        self.poke()

    def poke(self) -> None:
        self._waker.poke()

    # ------------------------------------------------------------ the throttle
    def throttle_rate(self, sink: SourceSink | None = None, now: float | None = None) -> float:
        """Messages per second the entry admits; 0 with the throttle off (no limit).

        "auto" admits what the keys that can send now allow (the engine's live
        capacity, headroom included) divided by the calls a message needs.
        """
        if self.throttle_mode == "fixed":
            return self.throttle_fixed
        if self.throttle_mode == "off":
            return 0.0
        sink = sink or self._sink
        if sink is None or sink.loop is None:
            return 0.0
        now = sink.clock() if now is None else now
        return sink.live_capacity(now) / self.calls

    # ------------------------------------------------------------ the loop
    async def run(self, sink: SourceSink) -> None:
        self._sink = sink
        loop = sink.loop
        next_arrival = sink.clock()
        next_admit = sink.clock()
        try:
            while not sink.stopping:
                now = sink.clock()
                if self.total is not None and self.counts.arrived >= self.total and not self.backlog:
                    break
                mode = self.throttle_mode
                limit = self.throttle_rate(sink, now)
                # 1. admit from the backlog when the throttle has room
                if self.backlog and (mode == "off" or (limit > 0 and now >= next_admit)):
                    if mode == "auto" and self._backed_up(sink, limit):
                        next_admit = now + 1.0 / limit  # let the call queue drain first
                        continue
                    if not self._room(sink):
                        await sink.queues.wait_space(max(1, sink.queue_max - self._first_calls() + 1))
                        continue
                    self._admit(sink, self.backlog.popleft(), now)
                    if limit > 0:
                        next_admit = max(next_admit + 1.0 / limit, now - 0.05)
                    continue
                # 2. arrivals
                can_arrive = self.rate > 0 and (self.total is None or self.counts.arrived < self.total)
                stalled = len(self.backlog) >= self.backlog_max  # backpressure on the source
                if can_arrive and not stalled and now >= next_arrival:
                    params = None
                    if self.items is not None:
                        params = next(self.items, None)
                        if params is None:
                            self.total = self.counts.arrived  # the file ran out
                            continue
                    msg = self._arrive(now, params)
                    if msg is not None:
                        if mode == "off":
                            self._admit(sink, msg, now)
                        elif self.excess == "queue":
                            self.backlog.append(msg)  # admitted in step 1, at the throttle's pace
                        elif (
                            limit > 0
                            and now >= next_admit
                            and self._room(sink)
                            and not (mode == "auto" and self._backed_up(sink, limit))
                        ):
                            self._admit(sink, msg, now)
                            next_admit = max(next_admit + 1.0 / limit, now - 0.05)
                        else:
                            self._shed(msg, now, "throttle")
                    gap = self.rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
                    # After a stall (rate 0, backlog full) do not burst to catch up.
                    next_arrival = max(next_arrival + gap, now - 0.05)
                    continue
                # 3. sleep until the next thing can happen (or a poke: rate, throttle, stop)
                wake = []
                if can_arrive and not stalled:
                    wake.append(next_arrival)
                if self.backlog and limit > 0:
                    wake.append(next_admit)
                elif self.backlog and mode == "auto":
                    # auto with no live capacity: re-check when a gate opens
                    # a resumed key does not poke the workload: look again soon
                    opens = sink.next_gate_open(now)
                    wake.append(opens if opens is not None else now + 0.5)
                await self._sleep(loop, min(wake) if wake else None, sink)
        finally:
            self.exhausted = not sink.stopping
            self.shed_log.flush(sink)
            self.shed_log.close()
        sink.source_done()

    def _room(self, sink: SourceSink) -> bool:
        """Whether the main queue takes this message's first calls without refusing one."""
        if not sink.backpressure:
            return True
        return len(sink.queues.main) + self._first_calls() <= max(sink.queue_max, self._first_calls())

    def _backed_up(self, sink: SourceSink, limit: float) -> bool:
        """More calls queued than the keys send in a quarter second (auto only).

        Admitting at exactly capacity never drains calls queued earlier (after
        a spell with the throttle off, or a pause), and calls that wait too
        long expire and fail their messages; so auto holds back until they go.
        """
        return len(sink.queues) > max(self.calls, limit * self.calls * 0.25)

    def _first_calls(self) -> int:
        return self.calls if self.pattern == "parallel" else 1

    async def _sleep(
        self, loop: asyncio.AbstractEventLoop | None, until: float | None, sink: SourceSink
    ) -> None:
        # With auto, pausing/resuming a key or a closing gate changes the rate:
        # the engine pokes the workload on commands; gates are caught above.
        await self._waker.wait(loop, until)

    # ------------------------------------------------------------ message life
    def _arrive(self, now: float, params: dict | None) -> Message | None:
        """A message arrives; returns it unless sampling sheds it at once."""
        self._next_id += 1
        self.counts.arrived += 1
        msg = Message(self._next_id, now, params)
        if self.excess == "sample" and not self.sampler.take():
            self._shed(msg, now, "sample")
            return None
        return msg

    def _admit(self, sink: SourceSink, msg: Message, now: float) -> None:
        self.in_progress[msg.id] = msg
        first = self.calls if self.pattern == "parallel" else 1
        for _ in range(first):
            if msg.failed:
                break
            self._submit_call(sink, msg)

    def _submit_call(self, sink: SourceSink, msg: Message) -> None:
        params = dict(msg.params or {}, message=msg.id, call=msg.next_call)
        req = sink.new_request(params, intended_at=msg.arrived_at)
        req.on_done = partial(self._call_done, msg)
        msg.next_call += 1
        msg.open += 1
        msg.calls.append(req)
        if sink.backpressure and len(sink.queues.main) >= sink.queue_max:
            # No room: refused at once, as a rate-limited dependency would refuse it.
            sink.refuse(req)
            return
        sink.submit(req)

    def _call_done(self, msg: Message, req: Request, where: str) -> None:
        msg.open -= 1
        sink = self._sink
        if msg.failed:
            self.counts.calls_wasted += req.attempts
            if req.attempts == 0 and where == "expired":
                self.counts.calls_cancelled += 1
        elif where == "succeeded":
            msg.ok += 1
            msg.spent += req.attempts
            if msg.ok == self.calls:
                self._complete(msg)
            elif self.pattern == "sequential" and sink is not None and not sink.stopping:
                self._submit_call(sink, msg)
        else:
            self._fail(msg, req)

    def _complete(self, msg: Message) -> None:
        self.counts.complete()
        self.in_progress.pop(msg.id, None)
        msg.calls = []

    def _fail(self, msg: Message, req: Request) -> None:
        msg.failed = True
        self.counts.failed += 1
        self.in_progress.pop(msg.id, None)
        self.counts.calls_wasted += msg.spent + req.attempts
        # Cancel what was not sent yet: a past deadline makes the worker (or
        # the ticker) expire it without a send. Calls in flight finish as they
        # will; their attempts are counted as wasted when they do.
        for other in msg.calls:
            if self.cancel_failed and other is not req:
                other.deadline = float("-inf")
        msg.calls = []

    def _shed(self, msg: Message, now: float, reason: str) -> None:
        self.counts.shed += 1
        if self.shed_log.path:
            sink = self._sink
            arrived = sink.wall_time(msg.arrived_at) if sink is not None else msg.arrived_at
            self.shed_log.add(
                {"message": msg.id, "reason": reason, "calls": self.calls, "arrived_at": round(arrived, 3)}
            )

    # ------------------------------------------------------------ engine hooks
    def close_second(self) -> None:
        """Roll the goodput series; the engine calls this once a second."""
        self.counts.close_second()
        if self._sink is not None:
            self.shed_log.flush(self._sink)

    def stats(self, elapsed_s: float) -> MessageStats:
        """This run's message counts, for the snapshot."""
        c = self.counts
        return MessageStats(
            calls_per_message=self.calls,
            pattern=MessagePattern(self.pattern),
            generated=c.arrived,
            completed=c.completed,
            failed=c.failed,
            shed=c.shed,
            queued=len(self.backlog),
            in_progress=len(self.in_progress),
            calls_wasted=c.calls_wasted,
            calls_cancelled=c.calls_cancelled,
            goodput_tps=c.completed / elapsed_s if elapsed_s > 0 else 0.0,
            current_goodput=c.goodput[-1] if c.goodput else 0.0,
            goodput_series=tuple(c.goodput),
            throttle_mode=self.throttle_mode,
            throttle_rate=round(self.throttle_rate(), 3),
            excess=Excess(self.excess),
        )


def source_from_config(cfg: EngineSettings, rng: random.Random) -> Source:
    """The engine's work source: messages when `[messages]` is configured, else plain requests."""
    if cfg.messages is not None:
        return MessageWorkload.from_config(cfg, rng)
    return Workload.from_config(cfg, rng)
