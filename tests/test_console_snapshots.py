"""Snapshot tests of the console, driven from fixed Snapshots (never wall time).

Regenerate baselines with `pytest tests/test_console_snapshots.py --snapshot-update`
and look at them before committing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from console_fixtures import (
    SECRETS,
    cooldown_snapshot,
    gates_snapshot,
    main_snapshot,
    make_app,
    message_snapshot,
    paused_snapshot,
    swelling_snapshot,
)

FULL = (120, 40)
COMPACT = (80, 24)
SNAPSHOT_DIR = Path(__file__).parent / "__snapshots__" / "test_console_snapshots"


async def settle(pilot) -> None:
    """Let layout and the event log's scroll-to-end finish before the capture."""
    await pilot.pause()
    await pilot.pause()


def test_main_screen(snap_compare):
    assert snap_compare(make_app(main_snapshot()), terminal_size=FULL, run_before=settle)


def test_paused_key(snap_compare):
    assert snap_compare(make_app(paused_snapshot()), terminal_size=FULL, run_before=settle)


def test_key_in_cooldown(snap_compare):
    assert snap_compare(make_app(cooldown_snapshot()), terminal_size=FULL, run_before=settle)


def test_backpressure_off_swelling_queue(snap_compare):
    assert snap_compare(make_app(swelling_snapshot()), terminal_size=FULL, run_before=settle)


def test_help_screen(snap_compare):
    assert snap_compare(
        make_app(main_snapshot()), terminal_size=FULL, press=["question_mark"], run_before=settle
    )


def test_compact_80x24(snap_compare):
    assert snap_compare(make_app(cooldown_snapshot()), terminal_size=COMPACT, run_before=settle)


def test_gates_closed_with_escalation(snap_compare):
    """k1's gate and the host gate closed; the host's escalated (error colour)."""
    assert snap_compare(make_app(gates_snapshot()), terminal_size=FULL, run_before=settle)


def test_message_run_goodput(snap_compare):
    """Messages of 4 calls: goodput beside throughput, the throttle in the limiter."""
    assert snap_compare(make_app(message_snapshot()), terminal_size=FULL, run_before=settle)


def test_compact_80x24_gates_closed(snap_compare):
    assert snap_compare(make_app(gates_snapshot()), terminal_size=COMPACT, run_before=settle)


@pytest.mark.parametrize("theme", ["ratedeck-dark", "ratedeck-light", "ratedeck-high-contrast"])
def test_theme(snap_compare, theme: str):
    assert snap_compare(make_app(paused_snapshot(), theme=theme), terminal_size=FULL, run_before=settle)


def test_main_snapshot_baseline_shows_no_secret(request):
    """The committed main-screen SVG holds masked keys only."""
    if request.config.getoption("--snapshot-update"):
        pytest.skip("baselines are being rewritten in this run")
    baselines = sorted(SNAPSHOT_DIR.glob("test_main_screen*.svg"))
    assert baselines, "main screen baseline missing; run with --snapshot-update"
    text = baselines[0].read_text()
    for secret in SECRETS.values():
        assert secret not in text
    assert not re.search(r"(?<![A-Za-z0-9#-])[A-Za-z0-9]{32}(?![A-Za-z0-9])", text)
    assert "…Ye5G" in text.replace("&#8230;", "…")  # the masked form is there
