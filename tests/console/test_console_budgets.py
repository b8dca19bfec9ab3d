"""The console in a run with token budgets: the keys table's Binds column, a key out of quota,
the key detail's Budgets panel (issue 24, item 4)."""

from __future__ import annotations

import dataclasses

from ratedeck.console.screens.key_detail import budgets_text, head_text
from ratedeck.console.widgets.keys_table import KeysTable, binds_text, out_of_quota, state_text
from ratedeck.engine.snapshot import BudgetRow, KeyRow
from tests.support.console_fixtures import (
    SECRETS,
    async_test,
    main_snapshot,
    make_app,
    screen_text,
    token_budget_snapshot,
)

SIZE = (120, 40)
QUOTA = "You exceeded your current quota, please check your plan and billing details."


def test_a_key_refused_by_a_429_is_out_of_quota_and_other_refusals_are_not():
    out = KeyRow("k1", "…AAAA", state="blocked", refused_status=429, refused_message=QUOTA)
    revoked = KeyRow("k2", "…BBBB", state="blocked", refused_status=403, refused_message="key revoked")
    assert out_of_quota(out) and not out_of_quota(revoked)
    assert not out_of_quota(dataclasses.replace(out, state="active"))  # a 429 that passes is a rate limit
    assert state_text(out) == "✖ out of quota" and state_text(revoked) == "✖ refused 403"
    assert binds_text(out) == "out" and binds_text(revoked) == "out"
    assert binds_text(KeyRow("k3", "…CCCC", binding="output-tokens")) == "output-tokens"
    assert "out of quota" in head_text(out) and "out of quota" not in head_text(revoked)


def test_budget_lines_show_the_window_the_minute_reserved_and_settled_and_what_binds():
    snap = token_budget_snapshot()
    k1 = snap.keys[0]
    text = budgets_text(k1, snap)
    assert text.count("\n") == 0  # k1's own budget only
    for part in (
        "24 000/30 000",
        "30 000/min",
        "reserved[/] 88 400",
        "settled[/] 80 100 (91%)",
        "◀ binds now",
    ):
        assert part in text, text
    k3 = snap.keys[2]  # bound by its own request limit: a line for it, the budget unmarked
    lines = budgets_text(k3, snap).splitlines()
    assert lines[0].startswith("[b]requests") and "◀ binds now" in lines[0] and "◀" not in lines[1]
    host = dataclasses.replace(snap, budgets=(*snap.budgets, BudgetRow("tokens", "host", 1, 9, "tokens")))
    assert "(host)" in budgets_text(k1, host).splitlines()[-1]
    assert "not learned yet" in budgets_text(k1, host)  # the host budget's per_min is None
    assert "out of quota" in budgets_text(snap.keys[5], snap)


@async_test
async def test_the_binds_column_only_in_a_run_with_budgets():
    for snap, shown in ((main_snapshot(), False), (token_budget_snapshot(), True)):
        app = make_app(snap)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            table = app.query_one(KeysTable)
            keys = [str(column.value) for column in table.columns]
            assert ("binds" in keys) is shown, keys
            if shown:
                assert keys.index("binds") == keys.index("window") + 1
                assert table.get_cell("k3", "binds").plain == "requests"
                assert table.get_cell("k6", "binds").plain == "out"
                assert table.get_cell("k6", "state").plain == "✖ out of quota"
                table.sort_by("binds")  # it sorts like any other column
                assert table.shown_labels[0] == "k6"  # "out" before "requests" before "tokens"
            text = screen_text(app)
            assert not any(secret in text for secret in SECRETS.values())


@async_test
async def test_the_binds_column_appears_when_budgets_first_show():
    app = make_app(main_snapshot())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.query_one(KeysTable)
        assert "binds" not in [str(column.value) for column in table.columns]
        table.show_keys(token_budget_snapshot().keys)
        await pilot.pause()
        assert "binds" in [str(column.value) for column in table.columns]
        assert table.get_cell("k1", "binds").plain == "tokens" and table.row_count == 6


@async_test
async def test_the_key_detail_shows_budgets_only_when_the_key_has_some():
    for snap, shown in ((main_snapshot(), False), (token_budget_snapshot(), True)):
        app = make_app(snap)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("enter")
            await pilot.pause()
            panel = app.screen.query_one("#detail-budgets")
            assert panel.display is shown
            text = screen_text(app)
            assert ("Budgets" in text) is shown
            if shown:
                assert "24 000/30 000 now" in text and "reserved 88 400" in text
