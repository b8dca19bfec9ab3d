"""The console's host: the engine in a child process, steered through a pipe."""

import dataclasses
import time

import pytest

from ratedeck.config import ConfigError, load_config
from ratedeck.engine.commands import PauseKey, SetHeadroom
from ratedeck.host.process_host import ProcessHost


def wait_for(host, predicate, timeout=20.0):
    """Poll published snapshots until `predicate` holds (bounded; fails loudly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = host.snapshot()
        if predicate(snap):
            return snap
        time.sleep(0.05)
    raise AssertionError(f"condition not reached; last snapshot phase={host.snapshot().phase}")


@pytest.mark.slow
def test_commands_reach_the_child_and_stop_returns_the_final_snapshot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    host = ProcessHost(load_config())
    host.start()
    try:
        wait_for(host, lambda s: s.succeeded > 20)
        host.send(PauseKey("k3"))
        host.send(SetHeadroom(42))
        snap = wait_for(host, lambda s: s.keys[2].state == "paused" and not s.headroom_adaptive)
        assert snap.headroom_ms == 42
        assert host.effective_config()["engine"]["headroom"] == 42
    finally:
        final = host.stop_blocking()
    assert final.phase == "stopped" and final.balance() == 0 and final.succeeded > 20
    assert host.server_stats["totals"]["rejected_429"] == 0  # the embedded simulator's own count


@pytest.mark.slow
def test_a_start_failure_in_the_child_is_raised_in_the_parent():
    # Settings the config loader would refuse, put in after loading: only the child finds out.
    cfg = dataclasses.replace(load_config(), server={"mode": "study", "latency_in_ms": [5, 1]})
    host = ProcessHost(cfg)
    with pytest.raises(ConfigError, match="server"):
        host.start()


def _session_on_a_thread(cfg, transport):
    """A `Session` started on a loop of its own thread (as a front end sees a host); its loop."""
    import asyncio
    import threading

    from ratedeck.host.session import Session

    session = Session(cfg, transport)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(session.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    return session, loop, thread


@pytest.mark.parametrize("how", ["stop_blocking", "abort"])
def test_an_in_process_session_stops_from_another_thread_as_every_host_does(how):
    """`Session` has the whole `EngineHost` face: `stop_blocking` drains and `abort` stops
    at once from a thread other than the engine's loop; both return the final snapshot."""
    from ratedeck.server.settings import study_settings
    from ratedeck.server.simulated import SimulatedTransport

    cfg = load_config(overrides={"engine": {"graveyard_path": ""}})
    session, loop, thread = _session_on_a_thread(cfg, SimulatedTransport(study_settings()))
    try:
        wait_for(session, lambda s: s.succeeded > 5)
        final = session.abort() if how == "abort" else session.stop_blocking()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert final.phase == "stopped" and final.balance() == 0 and final.succeeded > 5
    assert session.aborted is (how == "abort")
    assert session.facts.answers is None  # the simulated transport counts no answers
    with pytest.raises(RuntimeError, match="not started"):
        type(session)(cfg).send(PauseKey("k1"))
