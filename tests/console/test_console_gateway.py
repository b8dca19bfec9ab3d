"""The console of a gateway: its clients' panel, shown only for a gateway."""

from __future__ import annotations

import dataclasses

from ratedeck.console.widgets.clients import (
    ClientsPanel,
    batch_rows,
    batches_eta,
    batches_summary,
    client_rows,
    clients_line,
    priority_text,
    quota_text,
)
from ratedeck.engine.snapshot import BatchRow, ClientRow, ClientView, QuotaRow
from tests.support.console_fixtures import (
    async_test,
    gateway_batches,
    gateway_batches_snapshot,
    gateway_clients_snapshot,
    main_snapshot,
    make_app,
    screen_text,
)

SIZE = (120, 40)
CLIENTS = ClientView(
    waiting=3, answered=12, wait_p50_ms=14.2, wait_p99_ms=840.0, statuses=((200, 10), (503, 1), (499, 1))
)


def test_the_clients_line_says_who_waits_how_long_and_what_they_got():
    line = clients_line(CLIENTS)
    for part in ("3 waiting", "p50 14 ms, p99 840 ms", "200[/] ×10", "503[/] ×1", "left[/] ×1"):
        assert part in line, line
    assert "none yet" in clients_line(ClientView())


@async_test
async def test_the_clients_panel_shows_for_a_gateway_only():
    for snap, shown in (
        (main_snapshot(), False),
        (dataclasses.replace(main_snapshot(), clients=CLIENTS), True),
    ):
        app = make_app(snap)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app.query_one(ClientsPanel).display is shown
            assert ("3 waiting" in screen_text(app)) is shown


# ---------------------------------------------------------------- named clients ([[gateway.clients]])


def plain(markup: str) -> str:
    from textual.content import Content

    return Content.from_markup(markup).plain


def test_each_named_client_has_a_row_with_its_waits_share_refusals_and_quota_left():
    lines = [plain(line) for line in client_rows(gateway_clients_snapshot().clients)]
    head, chat, nightly, tools = lines
    assert head.split() == "client priority waiting wait p50 / p99 share of tokens refused quota left".split()
    assert chat.split() == ["chat", "interactive", "0", "12", "ms", "/", "840", "ms", "━" * 10, "18%", "none"]
    assert nightly.split()[:8] == ["nightly", "batch", "37", "2.4", "s", "/", "31", "s"]
    assert nightly.endswith("34%        4  tokens_per_minute 8,000 of 100,000 left"), nightly
    assert tools.startswith("tools    standard ×3        5   45 ms / 1.2 s")
    assert tools.endswith("48%           usd_per_day $31.50 of $50.00 left"), tools
    # the columns line up under their header
    for column, lines_under in (("waiting", (nightly, tools)), ("refused", (nightly,))):
        end = head.index(column) + len(column)
        assert all(line[end - 1] != " " and line[end] == " " for line in lines_under), column
    assert {line.index("%") for line in lines[1:]} == {head.index("refused") - 3}


def test_several_quotas_are_joined_and_no_refusals_no_column():
    row = ClientRow(
        "ci", "standard", 1.0, sent=0,
        quotas=(QuotaRow("requests_per_minute", 600.0, 420.0), QuotaRow("usd_per_day", 50.0, 0.0)),
    )  # fmt: skip
    head, line = (plain(x) for x in client_rows(ClientView(rows=(row,), unit="requests")))
    assert "refused" not in head and "share of requests" in head
    assert "—" in line  # nothing sent yet: no waits to show
    assert line.endswith("requests_per_minute 420 of 600 left · usd_per_day $0.00 of $50.00 left")
    assert "[b $text-error]usd_per_day" in client_rows(ClientView(rows=(row,)))[1]  # none left


def test_the_table_is_left_out_with_one_token_and_counts_the_clients_it_cannot_show():
    assert client_rows(CLIENTS) == []
    lines = client_rows(gateway_clients_snapshot().clients, most=2)
    assert len(lines) == 4 and "… and 1 more client (" in plain(lines[-1])
    assert priority_text(ClientRow("x", "batch", 1.5)) == "batch ×1.5"
    assert priority_text(ClientRow("x", "batch", 1.0)) == "batch"
    assert quota_text(QuotaRow("tokens_per_minute", 100_000.0, 12_000.0)) == (
        "tokens_per_minute 12,000 of 100,000 left"
    )


@async_test
async def test_the_panel_grows_to_hold_its_clients_and_keeps_one_line_without_them():
    app = make_app(gateway_clients_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        panel = app.query_one(ClientsPanel)
        assert panel.region.height == 7  # the line, the header, three clients, the border
        assert "3 clients · shares over the last 60 s · 2898 answered" in str(panel.border_subtitle)
        text = screen_text(app)
        for part in ("42 waiting", "standard ×3", "tokens_per_minute 8,000 of 100,000 left", "refused"):
            assert part in text, part
        app.show_snapshot(dataclasses.replace(main_snapshot(), clients=CLIENTS))
        await pilot.pause()
        assert panel.region.height == 3 and "standard ×3" not in screen_text(app)


@async_test
async def test_at_80x24_the_clients_panel_keeps_its_one_line():
    app = make_app(gateway_clients_snapshot())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one(ClientsPanel).region.height == 3


def test_gateway_clients_panel(snap_compare):
    async def settle(pilot) -> None:
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(gateway_clients_snapshot()), terminal_size=SIZE, run_before=settle)


# ---------------------------------------------------------------- batches (the Batch APIs)


def test_the_batches_summary_counts_them_by_status_with_the_lines_left_and_the_last_eta():
    assert plain(batches_summary(gateway_batches())) == (
        "batches: 1 in progress · 1 cancelling · 1 completed · 420 lines left · eta 1m20s"
    )
    two = (
        BatchRow("batch_a", "openai", "x", "in_progress", 10, 9, 0, eta_s=5.0),
        BatchRow("batch_b", "openai", "x", "in_progress", 3, 1, 0, eta_s=130.0),
        BatchRow("batch_c", "openai", "x", "failed", 4, 4, 4),
    )
    assert plain(batches_summary(two)) == "batches: 2 in progress · 1 failed · 3 lines left · eta 2m10s"
    assert batches_eta(two) == 130.0
    # every batch final: no lines left, no ETA; no batch has a rate yet: "—"
    assert plain(batches_summary(two[2:])) == "batches: 1 failed"
    fresh = BatchRow("batch_d", "anthropic", "x", "validating", 1, 0, 0)
    assert plain(batches_summary((fresh,))) == "batches: 1 validating · 1 line left · eta —"
    assert batches_summary(()) == "" and batch_rows(()) == []


def test_each_batch_has_a_line_with_its_id_end_api_client_status_lines_failed_and_eta():
    lines = [plain(line) for line in batch_rows(gateway_batches())]
    running, cancelling, completed = lines
    assert running.split() == [
        "9d4b7a35",
        "openai",
        "nightly",
        "in_progress",
        "━" * 10,
        "260/600",
        "eta",
        "1m20s",
    ]
    assert cancelling.split() == [
        "X2c4e8f1",
        "anthropic",
        "tools",
        "cancelling",
        "━" * 10,
        "120/200",
        "eta",
        "—",
    ]
    assert completed.split() == [
        "c5a2f480",
        "openai",
        "chat",
        "completed",
        "━" * 10,
        "120/120",
        "failed",
        "3",
    ]
    # the columns line up: statuses, counts, ETAs
    assert {line.index(status) for line, status in zip(lines, ("in_p", "canc", "comp"), strict=True)} == {
        running.index("in_progress")
    }
    assert {line.index("/") for line in lines} == {running.index("/")}
    assert running.index("eta") == cancelling.index("eta") > completed.index("failed")
    # the bar: 260 of 600 is 4 of 10 filled
    assert "[$accent]━━━━[/][$foreground 15%]━━━━━━[/]" in batch_rows(gateway_batches())[0]
    # no batch failed a line: no failed column
    assert all("failed" not in plain(line) for line in batch_rows(gateway_batches()[:2]))


def test_at_most_five_batch_lines_then_the_others_counted():
    many = tuple(
        BatchRow(f"batch_{i:016d}", "openai", "nightly", "in_progress", 100, i, 0, eta_s=float(i))
        for i in range(8)
    )
    lines = [plain(line) for line in batch_rows(many)]
    assert len(lines) == 6 and lines[-1] == "  +3 more (the report lists them)"
    assert [line.split()[0] for line in lines[:5]] == [f"{i:08d}" for i in range(5)]
    assert len(batch_rows(many[:5])) == 5


@async_test
async def test_the_panel_grows_for_its_batches_and_keeps_their_summary_at_80x24():
    app = make_app(gateway_batches_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        panel = app.query_one(ClientsPanel)
        # the line, the clients' header and three rows, the summary, three batches, the border
        assert panel.region.height == 11
        text = screen_text(app)
        for part in ("batches: 1 in progress · 1 cancelling", "9d4b7a35", "eta 1m20s", "failed 3", "120/200"):
            assert part in text, part
        # the batches gone (none kept): the panel is as before
        app.show_snapshot(gateway_clients_snapshot())
        await pilot.pause()
        assert panel.region.height == 7 and "batches" not in screen_text(app)
    app = make_app(gateway_batches_snapshot())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.query_one(ClientsPanel)
        assert panel.region.height == 4  # the clients' line and the batches' summary
        text = screen_text(app)
        assert "batches: 1 in progress" in text and "9d4b7a35" not in text


@async_test
async def test_no_batches_change_nothing():
    snap = gateway_clients_snapshot()
    assert snap.clients is not None and snap.clients.batches == ()
    app = make_app(snap)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one(ClientsPanel).region.height == 7
        assert "batches" not in screen_text(app)


def test_gateway_batches_panel(snap_compare):
    async def settle(pilot) -> None:
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(gateway_batches_snapshot()), terminal_size=SIZE, run_before=settle)


# ---------------------------------------------------------------- the client's own cost


@async_test
async def test_the_limiter_panel_says_when_the_embedded_simulator_s_cpu_is_in_the_client_line():
    """The simulator answers on the engine's own loop: its CPU is in the figures, and the line's
    label says so (`Client+sim`); a run on a target of its own shows `Client` alone."""
    from ratedeck.console.widgets.limiter import LimiterPanel

    for with_, label in (("the embedded simulator", "Client+sim "), ("", "Client ")):
        snap = dataclasses.replace(main_snapshot(), cpu_s=26.0, sent=100_000, cpu_with=with_)
        app = make_app(snap)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            lines = [line.strip("│ ") for line in screen_text(app).splitlines() if "µs/req CPU" in line]
            assert lines and lines[0].split("│")[-1].lstrip().startswith(label), lines
            assert app.query_one(LimiterPanel).display
