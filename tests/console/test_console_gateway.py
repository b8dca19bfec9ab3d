"""The console of a gateway: its clients' panel, shown only for a gateway."""

from __future__ import annotations

import dataclasses

from ratedeck.console.widgets.clients import ClientsPanel, clients_line
from ratedeck.engine.snapshot import ClientView
from tests.support.console_fixtures import async_test, main_snapshot, make_app, screen_text

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
