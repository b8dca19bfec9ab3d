"""HttpTransport.send: a signing hook that raises ends the attempt before anything is sent."""

from __future__ import annotations

import asyncio

from ratedeck.engine.http.outcome import CLIENT_ERROR
from ratedeck.engine.http.transport import HttpTransport
from ratedeck.engine.request import Request
from ratedeck.engine.settings import KeySpec, TargetConfig

KEY = KeySpec(label="k1", secret="key-000000000001", policies=())
URL = "http://127.0.0.1:9/api"  # never reached: nothing here is sent


def _boom(_inp):
    raise RuntimeError("the hook's message, which may hold key-000000000001")


def test_a_signing_hook_that_raises_is_an_answered_client_error_naming_only_its_type():
    async def main():
        target = TargetConfig(url=URL, key_header="Authorization", signing=f"{__name__}:_boom")
        t = HttpTransport(target, URL, 1)
        try:
            return await t.send(KEY, Request(1, 0.0, 10.0), None), t.stats()
        finally:
            await t.close()

    out, _stats = asyncio.run(main())
    assert out.kind is CLIENT_ERROR and out.status is None
    assert out.error == f"not signed: {__name__}:_boom raised RuntimeError"
