"""`Request.mark_sent`: the send path's bookkeeping in one call, same as the attributes one by one."""

from __future__ import annotations

from ratedeck.engine.request import Request


def test_the_first_attempt_is_told_apart_and_later_ones_keep_its_time():
    req = Request(1, created_at=0.0, deadline=10.0)
    assert req.first_sent_at is None and req.key is None
    assert req.mark_sent(1.5, "k1") is True
    assert (req.first_sent_at, req.last_sent_at, req.key) == (1.5, 1.5, "k1")
    assert req.mark_sent(2.5, "k2") is False
    # a retry moves the latest send and key, never the first send's time
    assert (req.first_sent_at, req.last_sent_at, req.key) == (1.5, 2.5, "k2")


def test_marking_one_request_sent_leaves_every_other_unsent():
    # Unsent requests share one default side object: marking one sent must give it its own.
    sent, other = Request(1, 0.0, 10.0), Request(2, 0.0, 10.0)
    sent.mark_sent(1.5, "k1")
    assert (other.first_sent_at, other.last_sent_at, other.key) == (None, None, None)
