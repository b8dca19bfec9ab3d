"""The server's own count, read from every answer's headers (never raising)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ratedeck.engine.http.delays import Quota, read_quotas

NOW = 1_700_000_000.0


def test_github_headers_give_the_resource_its_count_and_its_reset():
    (q,) = read_quotas(
        {
            "X-RateLimit-Limit": "5000",
            "X-RateLimit-Remaining": "1999",
            "X-RateLimit-Used": "3001",
            "X-RateLimit-Reset": str(int(NOW) + 1200),
            "X-RateLimit-Resource": "search",
        },
        NOW,
    )
    assert q == Quota(5000, 1999, 3001, 1200.0, None, "search")


def test_ietf_structured_fields_pair_each_policy_with_its_remaining():
    (q,) = read_quotas({"RateLimit": '"burst";r=0;t=4', "RateLimit-Policy": '"burst";q=20;w=1'}, NOW)
    assert (q.limit, q.remaining, q.reset_in_s, q.window_s, q.name) == (20, 0, 4.0, 1.0, "burst")


def test_older_drafts_and_delta_resets():
    (q,) = read_quotas({"RateLimit-Limit": "10", "RateLimit-Remaining": "3", "RateLimit-Reset": "7"}, NOW)
    assert (q.limit, q.remaining, q.reset_in_s) == (10, 3, 7.0)


def test_binance_used_weight_per_interval():
    quotas = read_quotas({"X-MBX-USED-WEIGHT-1M": "1180", "x-mbx-order-count-10s": "4"}, NOW)
    weight = next(q for q in quotas if q.weight)
    assert (weight.used, weight.window_s, weight.name) == (1180, 60.0, "weight")
    assert any(q.name == "orders" and q.used == 4 and q.window_s == 10.0 for q in quotas)


def test_nonsense_reports_nothing():
    assert read_quotas({"X-RateLimit-Remaining": "lots", "X-MBX-USED-WEIGHT-1M": "-3"}, NOW) == ()


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "X-RateLimit-Limit",
                "X-RateLimit-Remaining",
                "X-RateLimit-Used",
                "X-RateLimit-Reset",
                "RateLimit",
                "RateLimit-Policy",
                "RateLimit-Remaining",
                "RateLimit-Reset",
                "X-MBX-USED-WEIGHT-1M",
            ]
        ),
        st.text(max_size=60),
    )
)
def test_any_header_text_gives_quotas_or_nothing(headers):
    for q in read_quotas(headers, NOW):
        assert q.reset_in_s is None or 0 <= q.reset_in_s <= 3600
        assert all(v is None or v >= 0 for v in (q.limit, q.remaining, q.used))
