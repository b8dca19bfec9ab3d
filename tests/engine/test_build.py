"""The composition root (`engine/build.py`): an engine built directly, with no host, is whole."""

from __future__ import annotations

import asyncio
import json

from ratedeck.config import load_config
from ratedeck.engine.engine import Engine
from ratedeck.engine.http import outcome as oc
from ratedeck.engine.http.transport import TransportBase
from ratedeck.server.simulated import run_virtual

SECRET = "sk-build-test-000000000001"


class Refusing(TransportBase):
    """Answers every attempt with a 400: each request goes to the graveyard."""

    async def send(self, key, req, nonce):
        await asyncio.sleep(0.01)
        return oc.Outcome(oc.CLIENT_ERROR, 400, None, 0.01)

    async def close(self):
        pass


def test_an_engine_built_with_no_host_masks_keys_in_its_graveyard(tmp_path):
    work = tmp_path / "work.jsonl"
    work.write_text(
        "".join(json.dumps({"api_key": SECRET, "n": i, "note": f"key {SECRET}"}) + "\n" for i in range(3))
    )
    grave = tmp_path / "graveyard.jsonl"
    cfg = load_config(
        preset="study",
        overrides={
            "keys": {"secrets": [SECRET], "limits": ["20/1s"]},
            "target": {"nonce_param": ""},
            "workload": {"file": str(work)},
            "engine": {"graveyard_path": str(grave), "max_attempts": 1},
        },
    )
    engine = Engine(cfg, Refusing())
    snap = run_virtual(engine.run(10))
    assert snap.graveyard == 3
    text = grave.read_text()
    assert SECRET not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 3 and all(line["params"]["api_key"] != SECRET for line in lines)
    assert all(line["params"]["api_key"] for line in lines)  # masked, not dropped


def test_a_nonce_target_keeps_whole_gaps_and_any_other_may_send_half_a_gap_early():
    # Sends closer than the jitter can reach a nonce-checking server out of order; elsewhere
    # the slack lets a slot that frees early be reused at once (WindowLimiter, pace_slack).
    def paces(nonce_param: str) -> set[tuple[float, float]]:
        cfg = load_config(
            preset="study",
            overrides={
                "keys": {"secrets": [SECRET, SECRET + "2"], "limits": ["20/1s"]},
                "target": {"nonce_param": nonce_param},
                "engine": {"graveyard_path": "", "pacing": "even"},
            },
        )
        engine = Engine(cfg, Refusing())
        return {(w.limiter.min_spacing, w.limiter.pace_slack) for w in engine.parts.keys.workers}

    assert paces("nonce") == {(1.0, 0.0)}
    assert paces("") == {(0.9, 0.5)}
