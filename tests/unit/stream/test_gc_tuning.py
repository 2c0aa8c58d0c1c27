"""The collector tuning of long-running commands (it changes this process's collector: restored)."""

from __future__ import annotations

import gc

from stream.gc_tuning import OLDER_THRESHOLDS, YOUNG_THRESHOLD, tune_for_streaming


def test_the_start_up_heap_is_frozen_and_collections_are_rarer() -> None:
    before = gc.get_threshold()
    try:
        tune_for_streaming()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert before[0] < YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
