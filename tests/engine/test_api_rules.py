"""Real-API settings: outcome rules, signing recipes (documented examples), budgets and paths."""

from __future__ import annotations

import pytest

from ratedeck.config import build_config, load_config, to_toml_dict
from ratedeck.core.vocab import OutcomeKind
from ratedeck.engine.api_rules import PathTable, first_match, parse_outcome_rules, parse_paths
from ratedeck.engine.http.signing import SignInput, encode, sign_binance, sign_kraken

GITHUB_RULES = parse_outcome_rules(
    [
        {
            "kind": "rate_limited",
            "status": [403, 429],
            "header": "X-RateLimit-Remaining",
            "header_value": "0",
        },
        {"kind": "rate_limited", "status": [403, 429], "header": "Retry-After"},
    ]
)
KRAKEN_RULES = parse_outcome_rules(
    [
        {
            "kind": "rate_limited",
            "status": 200,
            "json_field": "error",
            "json_contains": "Rate limit exceeded",
        },
        {"kind": "nonce", "status": 200, "json_field": "error", "json_contains": "EAPI:Invalid nonce"},
        {"kind": "failed", "status": 200, "json_field": "error"},
    ]
)


def test_github_403_with_no_quota_left_is_a_rate_limit_and_other_403s_are_not():
    limited = first_match(GITHUB_RULES, 403, {"X-RateLimit-Remaining": "0"}, "API rate limit exceeded")
    assert limited is not None and limited.kind is OutcomeKind.RATE_LIMITED
    assert (
        first_match(GITHUB_RULES, 403, {"X-RateLimit-Remaining": "4000"}, "Resource not accessible") is None
    )


def test_kraken_errors_in_a_200_are_told_apart():
    def kind(body):
        rule = first_match(KRAKEN_RULES, 200, {}, body)
        return rule.kind if rule else OutcomeKind.OK

    assert kind('{"error":["EAPI:Rate limit exceeded"]}') is OutcomeKind.RATE_LIMITED
    assert kind('{"error":["EAPI:Invalid nonce"]}') is OutcomeKind.NONCE
    assert kind('{"error":["EOrder:Insufficient funds"]}') is OutcomeKind.CLIENT_ERROR
    assert kind('{"error":[],"result":{"unixtime":1}}') is OutcomeKind.OK
    assert kind("not json") is OutcomeKind.OK  # nothing a rule can read: the status decides


def test_binance_signature_matches_the_documented_example():
    # Binance Spot API docs, "SIGNED Endpoint Examples for POST /api/v3/order" (HMAC SHA256).
    params = [
        ("symbol", "LTCBTC"), ("side", "BUY"), ("type", "LIMIT"), ("timeInForce", "GTC"),
        ("quantity", "1"), ("price", "0.1"), ("recvWindow", "5000"), ("timestamp", "1499827319559"),
    ]  # fmt: skip
    secret = "NhqPtmdSJYdKjVHjA7PZj4Mge3R5YNiP1e3UZjInClVN65XAbvqqM6A7H5fATj0j"
    headers = sign_binance(
        SignInput(
            "POST",
            "/api/v3/order",
            params,
            "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zvsw0MuIgwCIPy6utIco14y7Ju91duEh8A",
            secret,
            None,
        )
    )
    assert params[-1] == ("signature", "c8db56825ae71d6d79447849e617115f4a920fa2acdcab2b053c4b2838bd6b71")
    assert headers == {"X-MBX-APIKEY": "vmPUZE6mv9SD5VNHk4HlWFsOr6aKE2zvsw0MuIgwCIPy6utIco14y7Ju91duEh8A"}


def test_kraken_signature_matches_the_documented_example():
    # Kraken REST API docs, "Authentication": the worked example.
    secret = "kQH5HW/8p1uGOVjbgWA7FunAmGO8lsSUXNsu3eow76sz84Q18fWxnyRzBHCd3pd5nE9qa99HAZtuZuj6F1huXg=="
    params = [("nonce", "1616492376594"), ("ordertype", "limit"), ("pair", "XBTUSD"), ("price", "37500"),
              ("type", "buy"), ("volume", "1.25")]  # fmt: skip
    headers = sign_kraken(SignInput("POST", "/0/private/AddOrder", params, "KEY", secret, None))
    assert headers["API-Sign"] == (
        "4/dpxb3iT4tp/ZCVEwSnEsLxx0bqyhLpdfOpc6fn7OR8+UClSV5n9E6aSS8MPtnRfp32bAb0nmbRn6H8ndwLUQ=="
    )
    assert encode(params).startswith("nonce=1616492376594&")


def test_path_rules_match_exact_paths_first_then_globs():
    table = PathTable(parse_paths({"/api/v3/depth": {"weight": 5}, "/api/v3/*": {"weight": 2}}, set()))
    assert table.lookup("/api/v3/depth").weight == 5
    assert table.lookup("/api/v3/account").weight == 2
    assert table.lookup("/sapi/v1/x") is None


def test_a_config_with_budgets_paths_rules_and_signing_saves_and_loads_back_the_same(tmp_path, monkeypatch):
    import tomli_w

    monkeypatch.setenv("KRAKEN_KEYS", "KEY1 c2VjcmV0MQ==,KEY2 c2VjcmV0Mg==")
    data = {
        "target": {
            "url": "https://api.example.com/0/private/Balance",
            "method": "POST",
            "key_header": "API-Key",
            "signing": "kraken",
            "nonce_param": "nonce",
            "headers": {"Accept": "application/json"},
            "rules": [
                {"kind": "rate_limited", "status": 200, "json_field": "error", "json_contains": "Rate limit"}
            ],
        },
        "keys": {"secrets": ["env:KRAKEN_KEYS"], "limits": ["15@0.33/s"]},
        "budgets": [{"name": "trading", "limits": ["60@1/s"], "paths": ["/0/private/AddOrder"]}],
        "paths": {"/0/private/Ledgers": {"weight": 2}, "/0/private/AddOrder": {"budgets": ["trading"]}},
    }
    cfg = build_config(data, "test")
    assert [k.api_secret for k in cfg.engine_settings.keys] == ["c2VjcmV0MQ==", "c2VjcmV0Mg=="]
    assert "c2VjcmV0MQ" not in repr(cfg) and "KEY1" not in repr(cfg)
    path = tmp_path / "saved.toml"
    path.write_text(tomli_w.dumps(to_toml_dict(cfg)))
    again = load_config(str(path))
    assert (
        again.engine_settings.target == cfg.engine_settings.target
        and again.engine_settings.budgets == cfg.engine_settings.budgets
        and again.engine_settings.paths == cfg.engine_settings.paths
    )
    assert [k.api_secret for k in again.engine_settings.keys] == [
        k.api_secret for k in cfg.engine_settings.keys
    ]
    assert "c2VjcmV0" not in path.read_text()


@pytest.mark.parametrize(
    "target, problem",
    [
        ({"signing": "nope"}, "signing"),
        ({"key_format": "Token"}, "{key}"),
        ({"headers": {"Bad Name": "x"}}, "header name"),
    ],
)
def test_bad_target_settings_are_named(target, problem):
    from ratedeck.config import ConfigError

    with pytest.raises(ConfigError, match=problem):
        build_config({"target": {"url": "http://127.0.0.1:9/x", **target}, "keys": {"secrets": ["K1"]}})


def test_a_signing_hook_signs_each_request_when_it_leaves_and_its_errors_never_show_the_secret(tmp_path):
    """`signing = "module:function"`: called per attempt with the request and the key's secret."""
    import asyncio
    import sys

    from aiohttp import web

    from ratedeck.engine.engine import Engine
    from ratedeck.engine.http.transport import http_transport

    (tmp_path / "my_signer.py").write_text(
        "import hashlib\n"
        "def sign(s):\n"
        "    s.params.append(('sig', hashlib.sha256((s.secret + s.path).encode()).hexdigest()[:16]))\n"
        "    return {'X-Key': s.key}\n"
        "def broken(s):\n"
        "    raise ValueError('secret is ' + s.secret)\n"
    )
    sys.path.insert(0, str(tmp_path))
    seen = []

    async def handler(request):
        seen.append((request.headers.get("X-Key"), request.query.get("sig")))
        return web.json_response({"ok": True})

    async def run(hook):
        app = web.Application()
        app.router.add_get("/x", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        cfg = load_config(
            overrides={
                "target": {"url": f"http://127.0.0.1:{port}/x", "signing": hook, "key_header": "X-Plain"},
                "keys": {"secrets": ["KEY-ONE S3CRET-VALUE"], "limits": ["50/1s"]},
                "workload": {"total": 3},
                "engine": {"graveyard_path": str(tmp_path / "g.jsonl"), "max_attempts": 1},
            }
        )
        transport = http_transport(cfg.engine_settings, cfg.engine_settings.target.url)
        snap = await Engine(cfg, transport).run(3.0)
        await transport.close()
        await runner.cleanup()
        return snap

    try:
        ok = asyncio.run(run("my_signer:sign"))
        broken = asyncio.run(run("my_signer:broken"))
    finally:
        sys.path.remove(str(tmp_path))
    assert ok.succeeded == 3 and len(seen) == 3
    assert all(key == "KEY-ONE" and sig and len(sig) == 16 for key, sig in seen)
    assert broken.succeeded == 0 and broken.graveyard == 3
    text = repr(broken.errors) + repr([e.text for e in broken.events])
    assert "ValueError" in text and "S3CRET" not in text
