"""Snapshot tests of the console, driven from fixed Snapshots (never wall time).

Regenerate baselines with `pytest tests/console/test_console_snapshots.py --snapshot-update`
and look at them before committing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.console_fixtures import (
    SECRETS,
    ReplayHost,
    all_blocked_snapshot,
    client_bound_snapshot,
    cluster_snapshot,
    cooldown_snapshot,
    demo_live_capacity,
    demo_snapshot,
    gates_snapshot,
    job_snapshot,
    main_snapshot,
    make_app,
    many_keys_snapshot,
    message_snapshot,
    paused_snapshot,
    reported_snapshot,
    swelling_snapshot,
    token_budget_snapshot,
)

FULL = (120, 40)
COMPACT = (80, 24)
WIDE = (200, 50)
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


def demo_app() -> tuple:
    host = ReplayHost(demo_snapshot(), demo_live_capacity())
    return make_app(host=host), host


@pytest.mark.parametrize("size", [COMPACT, FULL, WIDE], ids=["80x24", "120x40", "200x50"])
def test_demo_steady_state(snap_compare, size: tuple[int, int]):
    """The out-of-box demo two minutes in, watched from the start, at the three
    sizes: throughput under the live-capacity line, which steps down while k3
    cooled (70-82 s) and back; p50 wobbling by 0.4 ms stays flat on the log scale."""
    app, host = demo_app()

    async def replay(pilot) -> None:
        host.replay(app)
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=replay)


def test_wide_200x50_errors_beside_keys(snap_compare):
    assert snap_compare(make_app(main_snapshot()), terminal_size=WIDE, run_before=settle)


def test_key_detail(snap_compare):
    """Enter on k1 with the fields the engine is asked to report: fingerprint, the
    server's remaining count, per-key latency."""
    assert snap_compare(make_app(reported_snapshot()), terminal_size=FULL, press=["enter"], run_before=settle)


def test_key_detail_80x24(snap_compare):
    """k4 at 80x24: its fingerprint, its own latency and last errors; "unknown" only for the
    server's count, which its answers never carried."""
    assert snap_compare(
        make_app(reported_snapshot()),
        terminal_size=COMPACT,
        press=["down", "down", "down", "enter"],
        run_before=settle,
    )


def test_errors_screen(snap_compare):
    assert snap_compare(make_app(main_snapshot()), terminal_size=FULL, press=["e", "down"], run_before=settle)


def test_keys_sorted_and_filtered(snap_compare):
    """500 keys sorted by 429s (five `o`), filtered to the cooling ones."""
    press = ["o"] * 5 + ["slash", "c", "o", "o", "l", "enter"]

    async def type_then_drop_toasts(pilot) -> None:
        # The sort's notice lasts 2 s: on a loaded box the keys take longer than that
        # to type, so whether it is still up at the capture is luck. Leave it out.
        await pilot.pause()
        await pilot.press(*press)
        pilot.app.clear_notifications()
        await settle(pilot)

    assert snap_compare(
        make_app(many_keys_snapshot(500)), terminal_size=FULL, run_before=type_then_drop_toasts
    )


def test_help_80x24_scrolled_to_the_end(snap_compare):
    assert snap_compare(
        make_app(main_snapshot()), terminal_size=COMPACT, press=["question_mark", "end"], run_before=settle
    )


def test_all_keys_blocked_80x24(snap_compare):
    assert snap_compare(make_app(all_blocked_snapshot()), terminal_size=COMPACT, run_before=settle)


def test_whole_run_span(snap_compare):
    """`z` twice: the charts cover the whole run."""
    assert snap_compare(make_app(main_snapshot()), terminal_size=FULL, press=["z", "z"], run_before=settle)


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


def test_cluster_line_in_the_limiter(snap_compare):
    """A `--store redis://...` run: "Cluster 3 members · ..." above the Gates line, which stays in
    view (the failure causes and client cost give way in the 8 rows at 120x40)."""
    assert snap_compare(make_app(cluster_snapshot()), terminal_size=FULL, run_before=settle)


def test_client_is_the_limit_in_the_limiter(snap_compare):
    """The client's cost, the loop's lag (p99 over 10 ms in the warning colour) and the verdict
    highlighted: the client, not the server, is the limit (the failure causes give way)."""
    assert snap_compare(make_app(client_bound_snapshot()), terminal_size=FULL, run_before=settle)


def test_client_is_the_limit_80x24(snap_compare):
    """At 80x24 the limiter's third line gives the verdict and the loop's lag instead of rejections."""
    assert snap_compare(make_app(client_bound_snapshot()), terminal_size=COMPACT, run_before=settle)


def test_cluster_screen(snap_compare):
    """`m`: each member's row (one cut off from the store) under the shared queues."""
    assert snap_compare(make_app(cluster_snapshot()), terminal_size=FULL, press=["m"], run_before=settle)


def test_token_budgets_binds_column_and_a_key_out_of_quota(snap_compare):
    """An LLM run: the keys table's Binds column, k6 out of quota (429 insufficient_quota)."""
    assert snap_compare(make_app(token_budget_snapshot()), terminal_size=FULL, run_before=settle)


def test_key_detail_token_budgets(snap_compare):
    """k3's detail: its own request limit binds, its tokens budget reserved against settled."""
    assert snap_compare(
        make_app(token_budget_snapshot()),
        terminal_size=FULL,
        press=["down", "down", "enter"],
        run_before=settle,
    )


def test_job_progress_under_the_header(snap_compare):
    """A job of known size: the Job line under the header, done of total with the ETA and the
    least time the limits allow for what remains (no such line for endless work: the others)."""
    assert snap_compare(make_app(job_snapshot()), terminal_size=FULL, run_before=settle)


def test_job_progress_80x24(snap_compare):
    assert snap_compare(make_app(job_snapshot()), terminal_size=COMPACT, run_before=settle)
