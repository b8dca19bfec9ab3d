"""Messages of several calls and the entry throttle, on virtual time against the simulator's rules."""

import asyncio
import json

import pytest

from ratedeck.config import ConfigError, load_config
from ratedeck.engine.commands import PauseKey, ResumeKey, SetThrottle
from ratedeck.engine.engine import Engine
from ratedeck.server.settings import ServerSettings, generated_keys
from ratedeck.server.simulated import SimulatedTransport, run_virtual

CAPACITY = 100.0  # 5 keys x 20/1s


def message_engine(
    *, rate, calls=3, pattern="parallel", throttle="off", excess="queue", server=None, engine=None, **messages
):
    """An engine running messages against a quick simulator (0..10 ms each way)."""
    server = server or ServerSettings(
        mode="standard", keys=generated_keys(5), latency_in_ms=(0, 10), latency_out_ms=(0, 10), seed=3
    )
    cfg = load_config(
        preset=None,
        overrides={
            "keys": {"secrets": list(server.keys), "limits": ["20/1s"]},
            "target": {"nonce_param": ""},
            "engine": {
                "graveyard_path": "",
                "headroom_initial_ms": 20.0,
                "backpressure": False,
                **(engine or {}),
            },
            "workload": {"rate": rate, "arrival": "poisson"},
            "messages": {
                "calls": calls,
                "pattern": pattern,
                "throttle": throttle,
                "excess": excess,
                "shed_path": "",
                **messages,
            },
            "run": {"seed": 5},
        },
    )
    return Engine(cfg, SimulatedTransport(server, seed=7))


def steady(snap):
    series = snap.messages.goodput_series[1:]
    return sum(series) / len(series)


def message_balance(s):
    return s.messages.balance()


def test_a_message_completes_only_when_every_call_succeeds():
    # One answer in five is a 503 and a call gets a single attempt: a message of
    # three calls then completes with probability 0.8^3 (about half).
    server = ServerSettings(
        mode="standard",
        keys=generated_keys(5),
        latency_in_ms=(0, 10),
        latency_out_ms=(0, 10),
        error_rate=0.2,
        retry_after=False,
        seed=3,
    )
    engine = message_engine(rate=20, server=server, engine={"max_attempts": 1})
    snap = run_virtual(engine.run(10))
    assert snap.graveyard > 0 and snap.messages.failed > 0
    share = snap.messages.completed / (snap.messages.completed + snap.messages.failed)
    assert 0.35 < share < 0.65
    # every completed message accounts for three successful calls
    assert 3 * snap.messages.completed <= snap.succeeded
    assert snap.balance() == 0 and message_balance(snap) == 0


def test_below_capacity_every_message_completes_and_nothing_is_wasted():
    snap = run_virtual(message_engine(rate=20).run(10))
    assert snap.messages.failed == 0 and snap.messages.calls_wasted == 0
    assert snap.messages.completed >= snap.messages.generated - 2  # the last ones still in flight
    assert 15 <= steady(snap) <= 25  # Poisson arrivals at 20/s


@pytest.mark.parametrize("pattern", ["parallel", "sequential"])
def test_calls_and_messages_balance_at_every_snapshot_under_overload(pattern):
    engine = message_engine(rate=100, pattern=pattern)
    snaps = []

    async def main():
        engine.start()
        for _ in range(80):
            await asyncio.sleep(0.05)
            snaps.append(engine.snapshot())
        snaps.append(await engine.stop())

    run_virtual(main())
    assert {s.balance() for s in snaps} == {0}
    assert {message_balance(s) for s in snaps} == {0}
    end = snaps[-1]
    assert end.messages.failed > 0 and end.expired > 0


def test_calls_spent_on_failed_messages_are_counted_as_wasted():
    snap = run_virtual(message_engine(rate=100).run(8))
    useful = 3 * snap.messages.completed
    assert snap.messages.calls_wasted > 0
    # attempts are either part of a completed message, wasted, or still open
    assert useful + snap.messages.calls_wasted <= snap.sent
    assert snap.sent - useful - snap.messages.calls_wasted <= 3 * snap.messages.in_progress + 3


def test_parallel_at_three_times_overload_auto_throttle_holds_goodput_without_it_it_falls():
    rate = 3 * CAPACITY / 3  # messages/s: 3x what capacity / n allows
    off = run_virtual(message_engine(rate=rate, throttle="off").run(10))
    auto = run_virtual(message_engine(rate=rate, throttle="auto").run(10))
    assert steady(auto) >= 0.95 * CAPACITY / 3
    assert auto.messages.failed == 0
    assert steady(off) < 0.75 * CAPACITY / 3
    assert off.messages.calls_wasted > 10 * auto.messages.calls_wasted


def test_sequential_plateaus_with_the_throttle_and_falls_without_it():
    off, auto = {}, {}
    for rate in (50, 100, 150):
        off[rate] = steady(run_virtual(message_engine(rate=rate, pattern="sequential").run(8)))
        auto[rate] = steady(
            run_virtual(message_engine(rate=rate, pattern="sequential", throttle="auto").run(8))
        )
    assert min(auto.values()) >= 0.95 * CAPACITY / 3
    assert max(auto.values()) - min(auto.values()) < 1.0  # a plateau
    assert off[50] > off[100] > off[150]  # falls steadily as arrivals grow
    assert off[150] < 0.6 * auto[150]


def test_auto_throttle_follows_a_paused_key_and_its_resumption():
    engine = message_engine(rate=60, throttle="auto")

    async def main():
        engine.start()
        await asyncio.sleep(3)
        before = engine.snapshot()
        engine.apply(PauseKey("k2"))
        await asyncio.sleep(4)
        paused = engine.snapshot()
        engine.apply(ResumeKey("k2"))
        await asyncio.sleep(3)
        return before, paused, await engine.stop()

    before, paused, after = run_virtual(main())
    assert before.messages.throttle_mode == "auto"
    assert paused.messages.throttle_rate == pytest.approx(before.messages.throttle_rate * 4 / 5, rel=0.05)
    assert after.messages.throttle_rate == pytest.approx(before.messages.throttle_rate, rel=0.05)
    # goodput followed the four remaining keys, and no message failed for it
    assert paused.messages.goodput_series[-1] <= 4 * 20 / 3 + 1
    assert after.messages.failed == 0 and after.balance() == 0


def test_shed_messages_are_counted_and_written_to_the_shed_file(tmp_path):
    path = tmp_path / "shed.jsonl"
    engine = message_engine(rate=30, throttle=10.0, excess="shed", shed_path=str(path))
    snap = run_virtual(engine.run(6))
    assert snap.messages.throttle_mode == "fixed" and snap.messages.throttle_rate == 10.0
    assert snap.messages.shed > 80  # about 20 of 30 per second
    assert 9 <= steady(snap) <= 11
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == snap.messages.shed
    assert lines[0]["reason"] == "throttle" and lines[0]["calls"] == 3
    assert message_balance(snap) == 0
    # The report says how many messages were shed, beside the requests' own count.
    from ratedeck.runner.report import build_report

    report = build_report(snap)
    assert report["messages"]["shed"] == len(lines) and report["messages"]["balance_ok"]


def test_sample_processes_the_configured_fraction():
    engine = message_engine(rate=60, throttle="auto", excess="sample", sample_fraction=0.25)
    snap = run_virtual(engine.run(10))
    taken = snap.messages.generated - snap.messages.shed
    assert taken / snap.messages.generated == pytest.approx(0.25, abs=0.02)
    assert snap.messages.failed == 0 and 13 <= steady(snap) <= 17


def test_queue_excess_holds_messages_at_the_entry_and_the_source_waits_when_full():
    engine = message_engine(rate=100, throttle="auto", excess="queue", backlog_max=50)
    snap = run_virtual(engine.run(6))
    assert snap.messages.queued == 50 and snap.messages.shed == 0
    assert snap.messages.generated < 100 * 6 * 0.7  # the source was held back
    assert steady(snap) >= 0.95 * CAPACITY / 3 and message_balance(snap) == 0


def test_set_throttle_switches_live_and_rejects_nonsense():
    engine = message_engine(rate=100, throttle="off")

    async def main():
        engine.start()
        await asyncio.sleep(3)
        engine.apply(SetThrottle("auto"))
        await asyncio.sleep(4)
        snap = engine.snapshot()
        with pytest.raises(ValueError, match="throttle"):
            engine.apply(SetThrottle("fast"))
        engine.apply(SetThrottle(12))
        await asyncio.sleep(3)
        return snap, await engine.stop()

    auto, fixed = run_virtual(main())
    assert auto.messages.throttle_mode == "auto" and auto.messages.goodput_series[-1] >= 30
    assert fixed.messages.throttle_mode == "fixed" and fixed.messages.throttle_rate == 12
    assert 10 <= fixed.messages.goodput_series[-1] <= 14
    assert any("entry throttle" in e.text for e in fixed.events)


def test_a_plain_workload_has_no_message_part_and_a_message_run_balances_its_own():
    engine = Engine(load_config(preset="study"), SimulatedTransport(ServerSettings()))
    assert engine.snapshot().messages is None
    snap = run_virtual(message_engine(rate=20.0).run(3.0))
    assert snap.messages is not None and snap.messages.balance() == 0


@pytest.mark.parametrize(
    "table, key",
    [
        ({"calls": 0}, "messages.calls"),
        ({"pattern": "zigzag"}, "messages.pattern"),
        ({"throttle": "fast"}, "messages.throttle"),
        ({"throttle": -5}, "messages.throttle"),
        ({"excess": "drop"}, "messages.excess"),
        ({"sample_fraction": 1.5}, "messages.sample_fraction"),
        ({"bogus": 1}, "messages.bogus"),
    ],
)
def test_bad_messages_settings_name_the_key(table, key):
    with pytest.raises(ConfigError) as info:
        load_config(preset="study", overrides={"messages": table})
    assert info.value.key == key


def test_messages_section_selects_the_message_workload():
    from ratedeck.config import build_config, to_toml_dict
    from ratedeck.engine.sources.multicall import MessageWorkload

    # No arrival rate given: messages arrive at the keys' capacity divided by the calls each needs.
    keys = {"secrets": [f"key-{i:03d}" for i in range(5)], "limits": ["20/1s"]}
    cfg = build_config({"keys": keys, "messages": {"calls": 3, "throttle": 25}})
    assert cfg.engine_settings.messages.calls == 3 and cfg.engine_settings.messages.throttle == 25.0
    engine = Engine(cfg, SimulatedTransport(ServerSettings()))
    assert isinstance(engine.parts.source, MessageWorkload)
    assert engine.parts.source.rate == pytest.approx(CAPACITY / 3)  # default arrival: capacity / n
    assert to_toml_dict(cfg)["messages"]["calls"] == 3
    plain = load_config(preset="study")
    assert plain.engine_settings.messages is None and not isinstance(
        Engine(plain, SimulatedTransport(ServerSettings())).parts.source, MessageWorkload
    )
