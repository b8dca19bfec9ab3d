"""The probe: a cheap, unlimited endpoint timed lightly to measure the network alone.

A round trip to the rate-limited target carries the server's processing time
with it, and its spread pays for that as if it were network jitter. A probe
to an endpoint that does almost nothing (`/health`, a static file) on its
own connection measures the network's spread directly; the headroom then
uses it (engine/limits/headroom.py, `observe_network`).

Rules:
- off unless `target.probe_url` is set; never derived from the target URL,
  and the config refuses the target's own path (it would spend the budget it
  measures for);
- no key, no parameters: nothing a limit could count against a key;
- one probe in flight, `target.probe_rate` per second (default 10), never
  catching up after a stall; the first `warm` samples back to back, `lanes`
  in flight on as many connections (`client.PROBE_LANES`, 4), so the headroom
  has what it needs to believe the probe within the run's first second instead
  of its third: slots answered before then wait on the first guess, and are
  reused about a second later (virtual, jitter + probe, seeds 17-136: 0.9566
  of sustained efficiency with one in flight, 0.9574 with four);
- only 2xx answers count as samples, and not one that opened its connection
  (the first, and any after the server closed it): its round trip carries the
  TCP and TLS handshakes, and the range would keep it for a minute; a 429 means the endpoint is rate
  limited after all, and the probe stops at once with the problem named;
  20 failures in a row (no answer, other statuses) stop it too;
- its cost is shown: `sent` (the snapshot's `probe_sent`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ratedeck.engine.settings import TargetConfig

from .client import OPENED, PROBE_LANES, probe_get

#: Failed probes in a row (no answer, or not 2xx) after which the probe gives up.
MAX_FAILURES = 20

GetFn = Callable[[], Awaitable[int]]  # one probe: its HTTP status, or OPENED (raises on no answer)


class Probe:
    """Polls `url` at `rate_hz`, one at a time after the first `warm` samples, and reports
    each 2xx round trip.

    `get` replaces the HTTP request (the simulator's `probe()` on virtual
    time, or the HTTP transport's, set up as its traffic: proxy, TLS);
    without it the probe has its own aiohttp session with one connection,
    apart from the traffic's pool (the same client as the traffic's, so
    both round trips carry the same client costs).
    """

    def __init__(
        self,
        url: str,
        rate_hz: float,
        get: GetFn | None = None,
        timeout_s: float = 1.0,
        warm: int = 0,
        lanes: int = PROBE_LANES,
    ):
        self.url = url
        self.rate_hz = rate_hz
        self.warm = warm  # samples taken back to back at the start
        self.lanes = max(1, lanes)  # GETs in flight at once while warming (`get` allows as many)
        self.timeout_s = timeout_s
        self.sent = 0
        self.answered = 0  # 2xx samples reported
        self.failed = 0
        self.opened = 0  # GETs that opened their connection: not samples
        self._in_flight = 0
        self.stopped: str | None = None  # why the probe gave up, if it did
        self._close = None
        if get is None:
            get, self._close = probe_get(TargetConfig(), url, timeout_s)
        self._get = get

    async def run(
        self,
        clock: Callable[[], float],
        observe: Callable[[float, float], None],
        problem: Callable[[str], None],
    ) -> None:
        """Probe until cancelled or given up: `observe(rtt_s, now)` per sample, `problem(text)` on giving up."""
        helpers = [
            asyncio.ensure_future(self._warm_lane(clock, observe))
            for _ in range(self.lanes - 1 if self.warm else 0)
        ]
        try:
            await self._main_lane(clock, observe, problem)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _main_lane(
        self,
        clock: Callable[[], float],
        observe: Callable[[float, float], None],
        problem: Callable[[str], None],
    ) -> None:
        """The lane that paces, counts failures and gives up."""
        interval = 1.0 / self.rate_hz
        next_t = clock()
        failures = opened = 0
        while True:
            now = clock()
            if next_t > now:
                await asyncio.sleep(next_t - now)
            warming = self.answered + self._in_flight < self.warm
            next_t = max(next_t + (0.0 if warming else interval), clock())
            status = await self._sample(clock, observe)
            if status == OPENED:  # it opened the connection: the handshake is in its round trip
                opened += 1
                if opened >= MAX_FAILURES:
                    return self._give_up(
                        problem,
                        f"the probe URL closed its connection after each of {opened} answers in a row "
                        "(every round trip carried a handshake); probing stopped",
                    )
                continue
            if status == 429:
                return self._give_up(
                    problem, "the probe URL answered 429: it is rate limited; probing stopped"
                )
            if status is not None and 200 <= status < 300:
                failures = opened = 0
                continue
            failures += 1
            if failures >= MAX_FAILURES:
                what = f"HTTP {status}" if status is not None else "no answer"
                return self._give_up(
                    problem, f"the probe URL failed {failures} times in a row ({what}); probing stopped"
                )

    async def _warm_lane(self, clock: Callable[[], float], observe: Callable[[float, float], None]) -> None:
        """Another GET in flight until the warm samples are in; it leaves judging failures to the
        main lane, and ends at the first one (or after as many opened connections in a row)."""
        opened = 0
        while self.answered + self._in_flight < self.warm and opened < MAX_FAILURES:
            status = await self._sample(clock, observe)
            if status == OPENED:
                opened += 1
            elif status is None or not 200 <= status < 300:
                return
            else:
                opened = 0

    async def _sample(
        self, clock: Callable[[], float], observe: Callable[[float, float], None]
    ) -> int | None:
        """One GET: its status (None: no answer), a 2xx not opening its connection observed."""
        start = clock()
        self.sent += 1
        self._in_flight += 1
        try:
            status = await self._get()
        except asyncio.CancelledError:
            raise
        except Exception:
            status = None
        finally:
            self._in_flight -= 1
        end = clock()
        if status is not None and status != OPENED and 200 <= status < 300:
            self.answered += 1
            observe(end - start, end)
        elif status == OPENED:
            self.opened += 1
        elif status != 429:  # a 429 stops the probe (`_main_lane`)
            self.failed += 1
        return status

    def _give_up(self, problem: Callable[[str], None], why: str) -> None:
        """Stop probing for good, saying why (`stopped`, and `problem(why)`)."""
        self.stopped = why
        problem(why)

    async def close(self) -> None:
        if self._close is not None:
            await self._close()
