"""A process that used pyreqwest exits cleanly: its client's thread is left time to let go of
its requests and connections before the interpreter finalizes (`ReqwestWire.close`).

Without that wait a run like this one aborted at exit ("PyGILState_Release ... finalizing",
SIGABRT) in 5 to 7 runs of 30 on this box; the test runs it 15 times."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import asyncio
from ratedeck.config import load_config
from ratedeck.engine import RateDeck
from ratedeck.server.app import start_server
from ratedeck.server.settings import study_settings


async def main():
    server = await start_server(study_settings())
    cfg = load_config(preset="study", overrides={"target": {"url": f"{server.url}/api/request"}})
    async with RateDeck(cfg) as deck:
        answers = await asyncio.gather(*(deck.call({"order": i}) for i in range(50)))
    assert [a.status for a in answers] == [200] * 50
    print("closed")  # the simulator is left open: its sockets go as the interpreter finalizes


asyncio.run(main())
"""


@pytest.mark.slow
def test_a_process_that_closed_its_reqwest_client_exits_cleanly(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    codes = []
    for _ in range(15):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert "closed" in proc.stdout, proc.stderr
        codes.append((proc.returncode, proc.stderr[-300:]))
    assert [code for code, _ in codes] == [0] * 15, [err for code, err in codes if code]
