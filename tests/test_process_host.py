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
    cfg = dataclasses.replace(load_config(), server={"mode": "seed", "latency_in_ms": [5, 1]})
    host = ProcessHost(cfg)
    with pytest.raises(ConfigError, match="server"):
        host.start()
