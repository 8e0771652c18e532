"""The API's garbage collector: frozen start-up heap, rare full collections, pauses seen."""

from __future__ import annotations

import gc

from sandbox_workspace.api import garbage


def _pauses(generation: str) -> float:
    value = garbage.PAUSES.collect()[0]
    for sample in value.samples:
        if sample.name.endswith("_count") and sample.labels["generation"] == generation:
            return sample.value
    return 0.0


def test_tune_freezes_the_startup_heap_and_keeps_full_collections_rare():
    threshold = gc.get_threshold()
    try:
        garbage.tune()
        assert gc.get_freeze_count() > 0  # start-up objects: out of the collector's view
        assert gc.get_threshold() == (threshold[0], threshold[1], 100)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_every_pause_is_observed_once_however_many_apps_watch():
    garbage.watch()
    garbage.watch()
    assert gc.callbacks.count(garbage._observe) == 1
    before = _pauses("2")
    gc.collect()
    assert _pauses("2") == before + 1
