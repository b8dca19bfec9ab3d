"""A hostile HTTP target on loopback, for the fault matrix (tests/runner/test_faults.py).

`FaultServer` runs in a background thread with its own loop:

- an aiohttp app on one port, the mode taken from the path
  (`http://127.0.0.1:PORT/<mode>`): ok, hang, slow, trickle, status/<code>,
  garbage, garbage500, huge, huge200, echo, echo500, redirect-other,
  redirect-same, redirect-loop, badpolicy, badratelimit, badretry,
  strictquery, mixed;
- a raw TCP server on another port for answers that break HTTP itself:
  malformed, reset, close, short, junk;
- an "other origin" app that records every request it gets, so a test can
  prove a key never travelled to it.

`url(mode)` picks the right port. Nothing here is clever on purpose: each
mode is a few lines a reader can check.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import socket
import struct
import threading
from urllib.parse import quote, quote_plus, urlsplit

from aiohttp import web

STATUSES = (400, 401, 403, 404, 418, 429, 500, 502, 503, 504)
RAW_MODES = ("malformed", "reset", "close", "short", "junk")
MIXED = (
    "ok",
    "status/500",
    "status/429",
    "status/404",
    "garbage500",
    "echo",
    "redirect-other",
    "badpolicy",
    "badratelimit",
    "slowhang",
)


def key_forms(secret: str) -> list[str]:
    """Every form a key could be echoed in: raw, URL/form-encoded, base64."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        text = enc(raw).decode()
        forms |= {text, text.rstrip("=")}
    return sorted(forms)


class FaultServer:
    """Start with `start()`, stop with `stop()`; `other_seen` lists what the other origin got."""

    def __init__(self) -> None:
        self.port = self.raw_port = self.other_port = 0
        self.other_seen: list[str] = []
        self.hits: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._rng = random.Random(7)

    # ------------------------------------------------------------ addresses
    def url(self, mode: str) -> str:
        port = self.raw_port if mode in RAW_MODES else self.port
        return f"http://127.0.0.1:{port}/{mode}"

    @property
    def other_origin(self) -> str:
        return f"http://127.0.0.1:{self.other_port}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FaultServer:
        self._thread = threading.Thread(target=self._run, name="fault-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{mode:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        other = web.Application()
        other.router.add_route("*", "/{tail:.*}", self._other)
        other_runner = web.AppRunner(other, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await other_runner.setup()
        await web.TCPSite(other_runner, "127.0.0.1", 0).start()
        self.other_port = other_runner.addresses[0][1]
        raw = await asyncio.start_server(self._raw, "127.0.0.1", 0)
        self.raw_port = raw.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        raw.close()
        await runner.cleanup()
        await other_runner.cleanup()

    # ------------------------------------------------------------ the HTTP modes
    async def _other(self, request: web.Request) -> web.Response:
        self.other_seen.append(f"{request.method} {request.raw_path} {dict(request.headers)}")
        return web.json_response({"status": "OK", "stolen": True})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        self.hits[mode] = self.hits.get(mode, 0) + 1
        if mode == "mixed":
            mode = self._rng.choice(MIXED)
        return await self._answer(mode, request)

    async def _answer(self, mode: str, request: web.Request) -> web.StreamResponse:
        ok = {"status": "OK"}
        if mode == "ok":
            return web.json_response(ok)
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "slowhang":
            await asyncio.sleep(3)
            return web.json_response(ok)
        if mode == "slow":
            await asyncio.sleep(0.4)
            return web.json_response(ok)
        if mode == "trickle":
            resp = web.StreamResponse(status=200, headers={"Content-Length": "100"})
            await resp.prepare(request)
            for _ in range(100):
                await resp.write(b"x")
                await asyncio.sleep(0.2)
            return resp
        if mode.startswith("status/"):
            code = int(mode.split("/", 1)[1])
            headers = {"Retry-After": "1"} if code in (429, 503) else {}
            return web.Response(status=code, text=f"status {code} from the fault server", headers=headers)
        if mode == "garbage":
            return web.Response(body=os.urandom(2000), content_type="application/json")
        if mode == "garbage500":
            return web.Response(status=500, body=os.urandom(2000) + b"\xff\xfe\x00")
        if mode == "huge":
            return web.Response(status=500, body=b"E" * (4 << 20))
        if mode == "huge200":
            return web.Response(body=b"{" + b" " * (4 << 20) + b"}", content_type="application/json")
        if mode in ("echo", "echo500"):
            return web.Response(status=400 if mode == "echo" else 500, text=self._echo(request))
        if mode == "redirect-other":
            secret = _key_of(request)
            location = f"{self.other_origin}/steal?api_key={quote(secret, safe='')}&k={secret}"
            return web.Response(status=302, headers={"Location": location})
        if mode == "redirect-same":
            return web.Response(status=302, headers={"Location": "/ok"})
        if mode == "redirect-loop":
            return web.Response(status=307, headers={"Location": "/redirect-loop"})
        if mode == "badpolicy":
            return web.json_response(ok, headers={"RateLimit-Policy": '"a";q=20;w=1;x=1.1.1'})
        if mode == "badratelimit":
            return web.Response(status=429, text="slow down", headers={"RateLimit": '"p";r=0;t=1.2.3'})
        if mode == "badretry":
            return web.Response(status=503, text="busy", headers={"Retry-After": "soon-ish, 12abc"})
        if mode == "strictquery":
            # The configured query (?a=1) and ours merged into one query string.
            raw = request.raw_path
            good = raw.count("?") == 1 and request.query.get("a") == "1" and _key_of(request)
            return web.json_response(ok) if good else web.Response(status=400, text=f"bad query {raw}")
        return web.Response(status=404, text=f"no mode {mode}")

    def _echo(self, request: web.Request) -> str:
        """The request back, the key in every form a server might echo it in.

        The raw key sits past character 190, so a cut at 200 before masking
        would leave a prefix of it.
        """
        secret = _key_of(request)
        lines = ["x" * 190 + secret]
        lines.append(f"url: {request.url}")
        lines.append(f"raw path: {request.raw_path}")
        lines += [f"{k}: {v}" for k, v in request.headers.items()]
        lines += [f"form: {form}" for form in key_forms(secret)]
        lines.append("basic: " + base64.b64encode(f"user:{secret}".encode()).decode())
        return "\n".join(lines)

    # ------------------------------------------------------------ the raw modes
    async def _raw(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
        mode = urlsplit(path).path.strip("/")
        self.hits[mode] = self.hits.get(mode, 0) + 1
        sock = writer.get_extra_info("socket")
        try:
            if mode == "malformed":
                writer.write(b"HTTP/1.1 2OO Okay?\r\nContent-Length: x\r\n\r\n{}")
            elif mode == "junk":
                writer.write(os.urandom(512))
            elif mode == "short":
                writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"status":')
            elif mode == "reset" and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()


def _key_of(request: web.Request) -> str:
    bearer = request.headers.get("Authorization", "")
    bearer = bearer[7:] if bearer.startswith("Bearer ") else ""
    return request.query.get("api_key") or request.headers.get("X-Api-Key") or bearer


if __name__ == "__main__":  # a manual look: python tests/support/fault_server.py
    import time

    with FaultServer() as server:
        print(server.url("ok"), server.url("malformed"), server.other_origin, flush=True)
        time.sleep(3600)
