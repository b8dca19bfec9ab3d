"""The console's endpoints panel: shown only for a pool of endpoints, one line per endpoint
with its state, its keys' counts and each model's limits."""

from __future__ import annotations

import dataclasses

from ratedeck.console.widgets.endpoints import EndpointsPanel, endpoint_line
from ratedeck.engine.snapshot import EndpointRow, KeyRow, ModelLimits
from tests.support.console_fixtures import async_test, main_snapshot, make_app

MINI = "gpt-4o-mini"


def pool_snapshot():
    """main_snapshot's run as a pool: east out of the pool, openai in it."""
    snap = main_snapshot()
    names = ("east", "openai", "openai", "openai")
    keys = tuple(
        dataclasses.replace(k, label=f"{n}-{i}" if n == "openai" else n, endpoint=n)
        for i, (k, n) in enumerate(zip(snap.keys, names, strict=False))
    )
    endpoints = (
        EndpointRow(
            "east", "azure-openai", "https://east-res.openai.azure.com", (MINI,),
            (ModelLimits(MINI, (("requests", 120.0), ("tokens", 20000.0))),),
            "down", "out of the pool: 3 attempts in a row failed (the last: connection)", 1, 1, 400, 380, 0,
        ),
        EndpointRow(
            "openai", "openai", "https://api.openai.com", ("any",),
            (ModelLimits(MINI, (("requests", 1000.0), ("tokens", 400000.0)), followed=True),),
            "up", "", 0, 3, 20000, 19800, 4,
        ),
    )  # fmt: skip
    return dataclasses.replace(snap, keys=keys, endpoints=endpoints)


def plain(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup.replace("$text-", "")).plain


def test_an_endpoint_line_says_state_counts_and_limits():
    east, openai = pool_snapshot().endpoints
    assert plain(endpoint_line(east, 6)) == (
        "○ east   down    azure-openai  1 key  sent 400  ok 380  429 0  out 1× · "
        "out of the pool: 3 attempts in a row failed (the last: connection) · "
        "gpt-4o-mini: requests 120/min, tokens 20,000/min"
    )
    assert plain(endpoint_line(openai, 6)) == (
        "● openai up      openai  3 keys  sent 20000  ok 19800  429 4 · "
        "gpt-4o-mini: requests 1,000/min, tokens 400,000/min"
    )
    bare = EndpointRow("x", "openai-compatible")
    assert plain(endpoint_line(bare, 1)).endswith("· any model")


@async_test
async def test_the_panel_shows_for_a_pool_only():
    app = make_app(main_snapshot())
    async with app.run_test(size=(120, 40)) as pilot:
        app.pull_snapshot()
        await pilot.pause()
        panel = app.query_one(EndpointsPanel)
        assert not app.has_class("-endpoints")
        assert not panel.region.height  # hidden: takes no room
        app.show_snapshot(pool_snapshot())
        await pilot.pause()
        assert app.has_class("-endpoints")
        assert panel.region.height == 4  # two lines and the border
        assert "1 of 2 in the pool" in str(panel.border_subtitle)
        assert "east" in str(panel.render()) and "openai" in str(panel.render())


def test_endpoints_panel(snap_compare):
    async def settle(pilot) -> None:
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(pool_snapshot()), terminal_size=(120, 40), run_before=settle)


def test_key_rows_keep_their_endpoint():
    assert all(isinstance(k, KeyRow) and k.endpoint for k in pool_snapshot().keys)
