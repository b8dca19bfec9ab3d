"""Where a request's path ends (`ports.Endings`), and how the run knows it is over.

The request path hands every request that reached its final place to
`RunEnd.finish`, which tells the request's caller and every finish watcher
(a results file, a store's journal, the makespan meter). The run is over
(`finished`) when the source is exhausted and nothing is queued or in
flight, when every key was refused, or when no key can learn a limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import TYPE_CHECKING

from ratedeck.core.vocab import Ending, EventKind

if TYPE_CHECKING:
    from ratedeck.engine.ports import EventSink, FinishWatcher, Source
    from ratedeck.engine.request import DoneCallback, Request

    from .keys import KeyRing


class RunEnd:
    """The end of every request's path and of the run (`ports.Endings`, `ports.ProblemSink`).

    `finished` is set on the loop (`start`) once the run is over; `problems`
    lists what the run could not do, each said once in the event log.
    """

    __slots__ = ("keys", "queues", "source", "event", "watchers", "problems", "no_limit_text", "finished")

    def __init__(self, *, keys: KeyRing, queues: Sized, source: Source, events: EventSink) -> None:
        self.keys = keys
        self.queues = queues
        self.source = source
        self.event = events.event
        # Called with (request, ending) for every request that ends: after the request's own on_done.
        self.watchers: list[DoneCallback] = []
        self.problems: list[str] = []
        self.no_limit_text = ""  # set when no limit was given and the server advertises none
        self.finished: asyncio.Event | None = None  # made on the loop in start()

    def start(self) -> None:
        self.finished = asyncio.Event()

    def watch(self, watcher: FinishWatcher) -> None:
        """Tell `watcher` of every request that ends (`ports.FinishWatcher`)."""
        self.watchers.append(watcher.finished)

    def finish(self, req: Request, ending: Ending) -> None:
        """`req` reached its final place: tell its caller, then every finish watcher."""
        req.ending = ending
        if req.on_done is not None:
            req.on_done(req, ending)
        for watch in self.watchers:
            watch(req, ending)
        self.check_finished()

    def check_finished(self) -> None:
        if (
            self.source.exhausted
            and not len(self.queues)
            and self.finished is not None
            and not self.keys.in_flight()
        ):
            self.finished.set()

    def key_refused(self) -> None:
        """A key was refused for good; when it was the last, the run is over (`finished`) at once:
        generating on would only queue work no key can send."""
        if self.keys.all_refused and self.finished is not None and not self.finished.is_set():
            self.event(EventKind.ERROR, "every key was refused by the server: nothing can be sent; stopping")
            self.finished.set()

    def no_limit(self, text: str) -> None:
        """No limit was given and the server advertises none: the run cannot pace itself; it stops."""
        if not self.no_limit_text:
            self.no_limit_text = text
            self.problem(text)
            if self.finished is not None:
                self.finished.set()

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            self.event(EventKind.ERROR, text)
