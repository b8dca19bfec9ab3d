"""The HTTP clients side by side: CPU per request of each, on the same loopback server.

    python -m ratedeck.bench.http_clients [REQUESTS] [CONCURRENCY]

A server that answers every request at once with the same small answer runs in
its own process (so its CPU counts for no client); each client then runs in a
fresh process of its own, one after another, sending REQUESTS GETs with
CONCURRENCY at a time, and reports the CPU its process spent per request
(every thread: pyreqwest's runtime thread counts) and its requests per second.

- `aiohttp`: a `ClientSession` as a user writes it (a `ClientTimeout`);
- `pyreqwest`: a pyreqwest `Client` as a user writes it;
- `ratedeck-aiohttp` and `ratedeck-reqwest`: ratedeck's own transport
  (`HttpTransport.send`, the answer read, counted and classified) on each
  client (`target.http_client`).

The box is shared: only the ratios between rows of one run hold.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import uvloop

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: application/json\r\n\r\n{"ok": true}'
CASES = ("aiohttp", "pyreqwest", "ratedeck-aiohttp", "ratedeck-reqwest")


class _Answering(asyncio.Protocol):
    """Answers each request head it reads (pipelined ones too) with `ANSWER`."""

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        heads = self.buf.count(b"\r\n\r\n")
        if heads:
            self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4 :]
            self.transport.write(ANSWER * heads)


async def _serve(port: int, max_s: float) -> None:
    server = await asyncio.get_running_loop().create_server(_Answering, "127.0.0.1", port)
    async with server:
        await asyncio.sleep(max_s)


async def _client(case: str, url: str, n: int, concurrency: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) for `n` GETs of `url`, `concurrency` at a time."""
    per_worker = n // concurrency
    if case == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

            async def one(i: int) -> None:
                async with session.get(f"{url}?id={i}") as resp:
                    await resp.read()

            return await _timed(one, per_worker, concurrency)
    if case == "pyreqwest":
        from pyreqwest.client import ClientBuilder

        async with ClientBuilder().build() as client:

            async def one(i: int) -> None:
                resp = await client.get(f"{url}?id={i}").build().send()
                await resp.bytes()

            return await _timed(one, per_worker, concurrency)
    from ratedeck.engine.http.transport import HttpTransport
    from ratedeck.engine.request import Request
    from ratedeck.engine.settings import KeySpec, TargetConfig

    target = TargetConfig(url=url, id_param="id", http_client=case.removeprefix("ratedeck-"))
    transport = HttpTransport(target, url, concurrency)
    key = KeySpec("k1", "key-000000000001", ())
    try:

        async def one(i: int) -> None:
            out = await transport.send(key, Request(i, 0.0, 1e9), None)
            assert out.status == 200, out.error

        return await _timed(one, per_worker, concurrency)
    finally:
        await transport.close()


async def _timed(one, per_worker: int, concurrency: int) -> tuple[float, float]:
    async def worker(w: int) -> None:
        for j in range(per_worker):
            await one(w * per_worker + j)

    await asyncio.gather(*(worker(w) for w in range(min(concurrency, 4))))  # connections up, imports done
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return time.process_time() - cpu0, time.perf_counter() - wall0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--serve":
        uvloop.run(_serve(int(argv[1]), float(argv[2])))
        return 0
    if argv and argv[0] == "--client":
        case, url, n, concurrency = argv[1], argv[2], int(argv[3]), int(argv[4])
        cpu, wall = uvloop.run(_client(case, url, n, concurrency))
        print(f"{cpu:.6f} {wall:.6f}")
        return 0
    n = int(argv[0]) if argv else 20_000
    concurrency = int(argv[1]) if len(argv) > 1 else 50
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "ratedeck.bench.http_clients", "--serve", str(port), "600"]
    )
    try:
        time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/v1/x"
        print(f"{n:,} GETs, {concurrency} at a time, one loopback server in its own process (uvloop)")
        print(f"{'client':18} {'µs CPU/req':>10} {'req/s':>8}")
        for case in CASES:
            args = [
                sys.executable,
                "-m",
                "ratedeck.bench.http_clients",
                "--client",
                case,
                url,
                str(n),
                str(concurrency),
            ]
            done = subprocess.run(args, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                print(f"{case:18} failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            cpu, wall = (float(x) for x in done.stdout.split())
            print(f"{case:18} {cpu / n * 1e6:10.1f} {n / wall:8.0f}")
    finally:
        server.kill()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
