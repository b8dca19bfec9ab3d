"""What the gateway logs: a malformed request is one line (its client, its status, why) or
part of a summary, never a stack; only a fault of the gateway's own code logs one; the
access log is off unless asked, one line per request (text or JSON), no secret in it.

Real parts: a gateway on loopback in front of the OpenAI stub, clients on raw sockets,
the log as the `logging` records it (and, for the command, its stderr)."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from ratedeck.gateway.server_log import BadRequests, why_of
from ratedeck.server.stubs.openai import start_openai

from .support import TOKEN, gateway_command, gateway_config, run_async, running_gateway

KEY = "sk-logs-aaaaaaaaaaaaaaaa"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"
HOSTILE = {"header_timeout_s": 0.3, "body_timeout_s": 0.3, "max_body_mb": 1}


def _get(extra: str = "", path: str = "/v1/models") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{AUTH}{extra}\r\n".encode()


def _post(extra: str, body: str = "") -> bytes:
    return f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{AUTH}{extra}\r\n{body}".encode()


#: Heads aiohttp's parser refuses (400), each as a client on the internet may send it.
MALFORMED = {
    "a 128 KiB header": _get("X-Big: " + "a" * 131072 + "\r\n"),
    "1,000 headers": _get("".join(f"X-H{i}: v\r\n" for i in range(1000))),
    "Content-Length with Transfer-Encoding": _post(
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"
    ),
    "two Content-Lengths": _post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
    "a CR in a header": _get("X-A: a\rb\r\n"),
    "a NUL in the path": b"GET /v1/mo\x00dels HTTP/1.1\r\nHost: x\r\n\r\n",
    "a TLS hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
    "HTTP/9.9": b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    "a space in a header's name": _get("X A: b\r\n"),
    "a header with no colon": _get("XA\r\n"),
    "Transfer-Encoding: gzip": _post("Transfer-Encoding: gzip\r\n"),
    "a bad chunk size": _post("Transfer-Encoding: chunked\r\n", "zz\r\nabc\r\n"),
    "a negative Content-Length": _post("Content-Length: -1\r\n"),
    "a 20 KB URL": b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "bare LFs": b"GET / HTTP/1.1\nHost: x\n\n",
    "a folded header": _get("X-A: a\r\n b\r\n"),
    "a bad method": b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
}
#: Requests the gateway's handler refuses, with the status each gets.
REFUSED = {
    "a path that climbs": (_get(path="/v1/../../etc/passwd"), 400),
    "an encoded climb": (_get(path="/v1/%2e%2e/%2e%2e/x"), 400),
    "no token": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 401),
    "a body over the limit": (
        _post("Content-Type: application/json\r\nContent-Length: 5000000\r\n", "{"),
        413,
    ),
    "a body that stops coming": (
        _post("Content-Type: application/json\r\nContent-Length: 100\r\n", "{"),
        408,
    ),
    "a gzip body that is not gzip": (
        _post("Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n", "hello"),
        400,
    ),
}


async def _status(port: int, data: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        line = await asyncio.wait_for(reader.readline(), 5)
        return int(line.split()[1]) if line else 0
    finally:
        writer.close()


async def _hostile_clients(port: int) -> None:
    """Clients that leave no answer to check: one gone mid-body, a slowloris."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("Content-Type: application/json\r\nContent-Length: 100\r\n", "{"))
    await writer.drain()
    writer.transport.abort()  # gone without a word
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at the head's deadline
    writer.close()


def _said(records: list[logging.LogRecord]) -> tuple[int, list[str]]:
    """(bad requests the log accounts for, its lines about them): one per "bad request from"
    line, N per "N more like it" summary."""
    lines = [r.getMessage() for r in records if "bad request" in r.getMessage()]
    counted = 0
    for line in lines:
        if "bad request from " in line:
            counted += 1
        else:
            counted += int(line.split("bad requests: ", 1)[1].split(" more like it", 1)[0].replace(",", ""))
    return counted, lines


# ---------------------------------------------------------------- pure logic


class FakeLoop:
    """A clock only the test moves, and the timers it would fire."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, object]] = []

    def call_at(self, when: float, callback):
        timer = _Timer(when, callback)
        self.timers.append((when, timer))
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = sorted((t for t in self.timers if t[0] <= self.now), key=lambda t: t[0])
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _when, timer in due:
            timer.fire()


class _Timer:
    def __init__(self, when: float, callback) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.callback()


def test_a_kind_is_said_once_then_summed_up_once_per_interval():
    loop, said = FakeLoop(), []
    bad = BadRequests(said.append, 60.0, clock=lambda: loop.now, call_at=loop.call_at)
    for i in range(500):
        bad.note(f"10.0.0.{i % 7}", 400, "Too many headers received")
    bad.note("10.0.0.9", 401, "no valid gateway token")
    assert said == [
        "bad request from 10.0.0.0: 400 Too many headers received",
        "bad request from 10.0.0.9: 401 no valid gateway token",
    ]
    loop.advance(59.0)
    assert len(said) == 2  # nothing more within the interval
    loop.advance(1.0)
    assert said[2:] == [
        "bad requests: 499 more like it (400 Too many headers received) in 60 s, the last from 10.0.0.2"
    ]
    bad.note("10.0.0.5", 400, "Too many headers received")  # the next interval: counted, not said
    loop.advance(60.0)
    assert said[3:] == [
        "bad requests: 1 more like it (400 Too many headers received) in 60 s, the last from 10.0.0.5"
    ]
    loop.advance(60.0)  # a quiet interval: the kind is forgotten...
    bad.note("10.0.0.6", 400, "Too many headers received")
    assert said[4:] == ["bad request from 10.0.0.6: 400 Too many headers received"]  # ...so said at once
    bad.note("10.0.0.6", 400, "Too many headers received")
    bad.flush()  # the stop: what is counted is said, no timer left
    assert said[5:] == [
        "bad requests: 1 more like it (400 Too many headers received), the last from 10.0.0.6"
    ]
    assert all(timer.cancelled for _when, timer in loop.timers)
    assert bad.count == 504


def test_kinds_beyond_the_cap_share_one():
    loop, said = FakeLoop(), []
    bad = BadRequests(said.append, 60.0, clock=lambda: loop.now, call_at=loop.call_at)
    for i in range(1000):
        bad.note("10.0.0.1", 400, f"kind {i}")
    assert len(said) == 65 and said[-1] == "bad request from 10.0.0.1: 400 other"


def test_why_holds_none_of_the_client_s_bytes():
    from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidHeader, LineTooLong

    secret = "sk-not-to-be-logged-xxxxxxxx"
    exc = BadHttpMessage(f"Invalid header value char:\n\n    b'Authorization: Bearer {secret}\\r'\n        ^")
    assert why_of(exc) == "Invalid header value char"
    assert why_of(LineTooLong(f"{secret}aaaa".encode(), 8190)) == "Got more than 8190 bytes when reading"
    assert why_of(BadStatusLine(f"it's {secret}")) == "Bad status line"  # repr'd with double quotes
    assert why_of(InvalidHeader(secret)) == "Invalid HTTP header"
    te = BadHttpMessage(
        "Transfer-Encoding can't be present with Content-Length:\n\n    b'Transfer-Encoding: x'"
    )
    assert why_of(te) == "Transfer-Encoding can't be present with Content-Length"
    assert why_of(BadHttpMessage("\x1b[31mred\x00")) == "?[31mred?"  # no terminal escapes


# ---------------------------------------------------------------- a real gateway


@run_async
async def test_malformed_and_refused_requests_log_a_line_each_and_never_a_stack(caplog):
    caplog.set_level(logging.DEBUG)
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            port = int(gw.url.rsplit(":", 1)[1])
            statuses = {}
            for name, data in MALFORMED.items():
                statuses[name] = [await _status(port, data) for _ in range(2)]  # twice: the 2nd is summed up
            for name, (data, _expected) in REFUSED.items():
                statuses[name] = [await _status(port, data) for _ in range(2)]
            await _hostile_clients(port)
    assert statuses == {
        **{name: [400, 400] for name in MALFORMED},
        **{name: [expected] * 2 for name, (_data, expected) in REFUSED.items()},
    }
    records = caplog.records
    assert not [r for r in records if r.exc_info or r.stack_info], "a stack was logged"
    assert "Traceback" not in caplog.text
    assert not [r for r in records if r.name.startswith("aiohttp") and r.levelno >= logging.WARNING]
    counted, lines = _said(records)
    sent = 2 * (len(MALFORMED) + len(REFUSED))
    assert counted == sent, lines  # each bad request is a line or counted in a summary...
    assert len(lines) < sent  # ...and the repeats are summed up, not said each
    assert all("\n" not in line and len(line) < 200 for line in lines), lines
    for status in (400, 401, 408, 413):
        assert [line for line in lines if f"127.0.0.1: {status} " in line], status
    assert len(stub.ledger.records) == 0  # none of them reached a key


@run_async
async def test_a_fault_of_the_gateway_s_own_code_logs_its_stack(caplog, monkeypatch):
    from ratedeck.gateway.app import GatewayApp

    def broken(self, request):
        raise RuntimeError("a bug of ratedeck's own")

    monkeypatch.setattr(GatewayApp, "_controls", broken)
    caplog.set_level(logging.INFO)
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            assert await _status(int(gw.url.rsplit(":", 1)[1]), _get()) == 500
    stacks = [r for r in caplog.records if r.exc_info]
    assert len(stacks) == 1 and stacks[0].name == "ratedeck.gateway"
    assert "a bug of ratedeck's own" in caplog.text and "Traceback" in caplog.text


@run_async
async def test_the_access_log_is_off_by_default_and_json_lines_when_asked(caplog):
    caplog.set_level(logging.INFO)
    prompt = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def calls(gw) -> None:
        async with aiohttp.ClientSession() as s:
            # A key in the query (some APIs take one there) and in the path: neither is shown.
            async with s.post(f"{gw.url}/v1/chat/completions?key={KEY}", json=prompt, headers=auth) as r:
                assert r.status == 200
            async with s.get(f"{gw.url}/v1/{KEY}/models") as r:
                assert r.status == 401

    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        async with running_gateway(gateway_config("openai", stub.url, [KEY]), **HOSTILE) as gw:
            await calls(gw)
        assert not [r for r in caplog.records if r.name == "ratedeck.gateway.access"]
        async with running_gateway(
            gateway_config("openai", stub.url, [KEY]), access_log="json", **HOSTILE
        ) as gw:
            await calls(gw)
    lines = [r.getMessage() for r in caplog.records if r.name == "ratedeck.gateway.access"]
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert (first["method"], first["path"], first["status"]) == ("POST", "/v1/chat/completions", 200)
    assert first["remote"] == "127.0.0.1" and first["bytes"] > 0 and first["ms"] >= 0
    assert first["time"].endswith("Z")
    assert (second["status"], second["path"]) == (401, "/v1/…****/models")
    for secret in (KEY, TOKEN):
        assert secret not in caplog.text


@run_async
async def test_in_the_console_the_lines_go_to_the_event_log(caplog):
    """The console's gateway (its engine process shares the terminal with the console):
    bad requests are lines of the event log, nothing on stderr."""
    import dataclasses

    from ratedeck.config.settings import GatewaySettings
    from ratedeck.gateway.service import GatewayService

    caplog.set_level(logging.INFO)
    async with await start_openai(keys=[KEY], rpm=1000, tpm=1_000_000) as stub:
        settings = dataclasses.replace(GatewaySettings(), listen="127.0.0.1:0", token=TOKEN, **HOSTILE)
        gw = GatewayService(gateway_config("openai", stub.url, [KEY]), settings, events=True)
        await gw.start()
        try:
            port = int(gw.url.rsplit(":", 1)[1])
            assert await _status(port, MALFORMED["two Content-Lengths"]) == 400
            assert await _status(port, REFUSED["no token"][0]) == 401
            events = [e.text for e in gw.engine.parts.log.rows if "bad request" in e.text]
        finally:
            await gw.stop(drain_timeout_s=1.0)
    assert events == [
        "bad request from 127.0.0.1: 400 Duplicate Content-Length",
        "bad request from 127.0.0.1: 401 no valid gateway token",
    ]
    assert not [r for r in caplog.records if r.name.startswith(("ratedeck.gateway", "aiohttp"))]


def test_the_text_access_line():
    from ratedeck.gateway.server_log import access_line

    fields = {
        "time": "2025-01-02T03:04:05.678Z",
        "remote": "10.1.2.3",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "bytes": 512,
        "ms": 842.0,
    }
    assert (
        access_line(fields, "text")
        == "2025-01-02T03:04:05.678Z 10.1.2.3 POST /v1/chat/completions 200 512 B 842 ms"
    )


# ---------------------------------------------------------------- the command


@pytest.mark.slow
@run_async
async def test_the_command_s_stderr_holds_one_line_per_bad_request_and_no_stack(tmp_path):
    """`ratedeck gateway --no-ui --access-log`: the garbage gets its answers, stderr a line
    per bad request (or a summary) and an access line per answer, and not one stack line."""
    import os
    import re
    import signal

    keys = "sk-cli-logs-aaaaaaaaaaaa,sk-cli-logs-bbbbbbbbbbbb"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "xdg"), GW_KEYS=keys, GW_TOKEN=TOKEN)
    async with await start_openai(keys=keys.split(","), rpm=1000, tpm=1_000_000) as stub:
        proc, url, _first = await gateway_command(
            stub.url,
            *["--access-log", "--header-timeout", "300ms", "--body-timeout", "300ms", "--max-body-mb", "1"],
            cwd=tmp_path,
            env=env,
        )
        port = int(url.rsplit(":", 1)[1])
        statuses = [await _status(port, data) for data in MALFORMED.values()]
        statuses += [await _status(port, data) for data, _expected in REFUSED.values()]
        statuses += [await _status(port, MALFORMED["a TLS hello"]) for _ in range(3)]
        await _hostile_clients(port)
        proc.send_signal(signal.SIGTERM)
        _out, err_bytes = await asyncio.wait_for(proc.communicate(), 30)
    err = err_bytes.decode()
    assert proc.returncode == 0, err
    assert statuses == [400] * len(MALFORMED) + [e for _d, e in REFUSED.values()] + [400] * 3
    assert "Traceback" not in err and 'File "' not in err, err
    lines = err.splitlines()
    said = [line for line in lines if line.startswith("ratedeck: bad request")]
    counted = sum(
        1 if "bad request from" in line else int(line.split("bad requests: ")[1].split(" more")[0])
        for line in said
    )
    assert counted == len(statuses), said
    assert "ratedeck: bad requests: 3 more like it (400 Received HTTPS traffic on an HTTP port)" in err
    access = [line for line in lines if re.match(r"^\d{4}-\d\d-\d\dT\S+Z 127\.0\.0\.1 ", line)]
    assert len(access) == len(statuses), access  # every answer, the parser's 400s too
    assert set(lines) <= set(said) | set(access), [x for x in lines if x not in said and x not in access]
    for secret in (*keys.split(","), TOKEN):
        assert secret not in err
