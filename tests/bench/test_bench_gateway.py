"""`ratedeck bench --scenarios gateway`: the same client straight at a stub and through the real gateway."""

import pytest

from ratedeck.bench.gateway import gateway_table, run_gateway


@pytest.mark.slow
def test_the_gateway_scenario_measures_both_paths_and_the_gateway_s_cpu():
    said: list[str] = []
    result = run_gateway(1.5, said.append)
    rows = {r["strategy"]: r for r in result.rows}
    assert set(rows) == {"direct", "gateway", "ratedeck"}
    for name in ("direct", "gateway"):
        assert rows[name]["errors"] == 0 and rows[name]["ok_per_s"] > 0, rows[name]
        assert 0 < rows[name]["p50_ms"] <= rows[name]["p99_ms"], rows[name]
    assert rows["gateway"]["added_p50_ms"] == round(rows["gateway"]["p50_ms"] - rows["direct"]["p50_ms"], 2)
    assert rows["gateway"]["gateway_cpu_us_per_req"] > 0 and rows["ratedeck"]["gateway_cpu_us_per_req"] > 0
    assert rows["ratedeck"]["ok_per_s"] > 0
    table = gateway_table(result)
    assert "added p50" in table and "gateway" in table.splitlines()[4]
    assert any("through the gateway" in line for line in said)
