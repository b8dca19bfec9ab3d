"""A short, bounded throughput check of the simulated API.

    python -m ratedeck.server.loadcheck --seconds 3 --connections 32

Starts `ratedeck serve` (standard mode, zero latency, a limit too high to bite)
in a child process, so client and server do not share a core, then drives it
from keep-alive connections with a minimal HTTP/1.1 client: a full aiohttp
client costs more CPU per request than the server does and would measure itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from ratedeck.core.loops import loop_factory

from .settings import generated_keys


@dataclass(frozen=True)
class LoadResult:
    """How many answers came back in how long, by HTTP status."""

    answers: int
    seconds: float
    statuses: dict[int, int]

    @property
    def per_second(self) -> float:
        """Answers per second over the whole run."""
        return self.answers / self.seconds if self.seconds else 0.0


async def drive(url: str, keys: list[str], seconds: float, connections: int) -> LoadResult:
    """Send GET /api/request over `connections` keep-alive connections for `seconds`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    statuses: collections.Counter[int] = collections.Counter()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def one_connection(number: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        key = keys[number % len(keys)]
        sent = 0
        try:
            while loop.time() < deadline:
                sent += 1
                writer.write(
                    f"GET /api/request?api_key={key}&nonce={sent}&req_id={number}-{sent} "
                    f"HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                statuses[int(head[9:12])] += 1
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
        finally:
            writer.close()

    started = loop.time()
    await asyncio.gather(*(one_connection(i) for i in range(connections)))
    elapsed = loop.time() - started
    return LoadResult(sum(statuses.values()), elapsed, dict(statuses))


def main(argv: list[str] | None = None) -> int:
    """Start a zero-latency server in a child process, load it, print answers per second."""
    parser = argparse.ArgumentParser(prog="python -m ratedeck.server.loadcheck")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--keys", type=int, default=5)
    args = parser.parse_args(argv)

    command = [
        sys.executable,
        "-m",
        "ratedeck.server.serve",
        "--mode",
        "standard",
        "--port",
        "0",
        "--latency",
        "0",
        "--limit",
        "1000/1ms",
        "--keys",
        str(args.keys),
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        url = line.split()[2] if line.startswith("ratedeck serve:") else ""
        if not url:
            print(f"server did not start: {line!r}", file=sys.stderr)
            return 1
        with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
            result = runner.run(drive(url, list(generated_keys(args.keys)), args.seconds, args.connections))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    print(
        f"{result.answers} answers in {result.seconds:.2f} s over {args.connections} connections: "
        f"{result.per_second:,.0f} requests/s; statuses {result.statuses}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
