"""A jitter proxy: a TCP forwarder on 127.0.0.1 that delays every chunk each way.

The live scenarios put it between a client and the simulator, so the
network's delay is real time on real sockets rather than the simulator's own
model. Each chunk read from one side is held for a uniform draw in
[low, high] ms, then written to the other side; a chunk never overtakes the
one before it on the same connection and direction (TCP keeps order), so its
release is `max(previous release, arrival + draw)`.

Run it in its own process (`python -m ratedeck.bench.jitter`) so that its CPU
counts neither for the client nor for the server; it stops by itself after
`--max-s` seconds, so no run outlives its bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from collections.abc import Callable

READ_BYTES = 65536


def release_at(previous: float, arrival: float, delay: float) -> float:
    """When a chunk that arrived at `arrival` and drew `delay` goes out, in order after `previous`."""
    return max(previous, arrival + delay)


class JitterProxy:
    """Forwards connections to `target` with a uniform one-way delay in [low_s, high_s].

    Attributes:
        holds: (arrival, release, sent) loop times of the first `keep` chunks,
            for tests and checks: `sent - arrival` is what a chunk was held.
        port: the listening port once `start()` has returned.
    """

    def __init__(
        self,
        target: tuple[str, int],
        low_s: float,
        high_s: float,
        seed: int = 1,
        keep: int = 0,
        draw: Callable[[float, float], float] | None = None,
    ) -> None:
        if not 0 <= low_s <= high_s:
            raise ValueError(f"delay: expected 0 <= low <= high, got {low_s}:{high_s}")
        self.target = target
        self.low_s, self.high_s = low_s, high_s
        self._draw = draw or random.Random(seed).uniform
        self.keep = keep
        self.holds: list[tuple[float, float, float]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.target)
        except OSError:
            c_writer.close()
            return
        ways = (self._pump(c_reader, s_writer), self._pump(s_reader, c_writer))
        tasks = [asyncio.ensure_future(w) for w in ways]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
            for writer in (c_writer, s_writer):
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: read, and schedule each chunk's write at its release, in order.

        One loop timer per chunk, no task or queue: the proxy stays cheap beside the
        client it measures. Releases strictly increase, so the timers fire in order.
        """
        loop = asyncio.get_running_loop()
        last = 0.0
        while data := await reader.read(READ_BYTES):
            now = loop.time()
            last = release_at(last + 1e-6, now, self._draw(self.low_s, self.high_s))
            loop.call_at(last, self._write, writer, data, now, last)
        # the last chunk's write is due at `last`; close after it
        wait = last - loop.time()
        if wait > 0:
            await asyncio.sleep(wait + 0.001)

    def _write(self, writer: asyncio.StreamWriter, data: bytes, arrival: float, release: float) -> None:
        if writer.is_closing():
            return
        writer.write(data)
        if len(self.holds) < self.keep:
            self.holds.append((arrival, release, asyncio.get_running_loop().time()))


def parse_ms_range(text: str) -> tuple[float, float]:
    """`"5:45"` -> (0.005, 0.045) seconds; ValueError with the text for bad input."""
    try:
        low, high = (float(part) / 1000.0 for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--delay: expected low:high in ms, got {text!r}") from None
    if not 0 <= low <= high:
        raise ValueError(f"--delay: expected 0 <= low <= high, got {text!r}")
    return low, high


async def _serve(args: argparse.Namespace) -> None:
    host, _, port = args.target.rpartition(":")
    low, high = parse_ms_range(args.delay)
    proxy = JitterProxy((host or "127.0.0.1", int(port)), low, high, seed=args.seed)
    await proxy.start()
    print(f"jitter proxy: http://127.0.0.1:{proxy.port}", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(args.max_s)
    await proxy.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ratedeck.bench.jitter")
    p.add_argument("--target", required=True, help="host:port to forward to")
    p.add_argument("--delay", default="5:45", help="one-way delay, low:high ms (default 5:45)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-s", type=float, default=60.0, help="stop after this many seconds")
    args = p.parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except ValueError as exc:
        print(f"jitter proxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
