"""Issue 22, items 1, 5 and 7: honest defaults, a run that achieved nothing fails, bad input.

The runs that matter go through the real CLI in a child process against a real
loopback server (aiohttp on 127.0.0.1), as a user meets them.
"""

from __future__ import annotations

import pytest

from ratedeck.runner.cli import main

# ---------------------------------------------------------------- item 7: bad input


@pytest.mark.parametrize("keys", [[], ["--keys", "k-one"]])
def test_a_bad_target_url_names_target_not_keys(keys, capsys):
    code = main(["--no-ui", "--target", "ht!tp://", *keys])
    err = capsys.readouterr().err
    assert code == 2
    assert "--target" in err and "no API keys" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_enqueue_needs_no_keys(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('[target]\nurl = "http://127.0.0.1:9/x"\n[pools]\nslow = 2\n')
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"n": 1}\n{"n": 2, "_pool": "slow"}\n')
    db = tmp_path / "work.db"
    code = main(["enqueue", "--store", f"sqlite:{db}", "--config", str(config), str(jobs)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "enqueued 2 jobs" in out and "(2 pending)" in out, out
    # the config's other settings are still checked: a pool the config lacks is refused
    jobs.write_text('{"n": 3, "_pool": "nowhere"}\n')
    assert main(["enqueue", "--store", f"sqlite:{db}", "--config", str(config), str(jobs)]) == 2
