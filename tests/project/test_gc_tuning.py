"""core.loops.tune_gc: an engine process collects young garbage rarely (issue 23)."""

from __future__ import annotations

import gc

from ratedeck.core.loops import GC_YOUNG_THRESHOLD, tune_gc


def test_tune_gc_raises_the_young_threshold_and_keeps_the_others():
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 7, 9)
        assert GC_YOUNG_THRESHOLD >= 50_000
    finally:
        gc.set_threshold(*saved)


def test_tune_gc_never_lowers_a_higher_threshold():
    saved = gc.get_threshold()
    try:
        gc.set_threshold(GC_YOUNG_THRESHOLD * 2, 10, 10)
        tune_gc()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD * 2
    finally:
        gc.set_threshold(*saved)
