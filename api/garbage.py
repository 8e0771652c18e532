"""The API process's garbage collector: tuned so that live streams do not stall, and
watched, because while it runs every stream of the process waits.

Contract:
- ``tune()`` (once the app has started) freezes everything built so far — modules,
  routes, schemas live as long as the process — out of the collector's view, and lets a
  full collection wait for 100 young-generation passes instead of 10. Measured with 200
  runs streaming (bench/chat.py): full collections walking the start-up heap paused the
  event loop 60–110 ms several times a run; frozen, 25–45 ms every few seconds — still
  the whole p99. The price: cyclic garbage that reached the old generation is freed a
  little later.
- ``PAUSES`` is a process-wide histogram of collector pauses by generation
  (``sandbox_api_gc_pause_seconds``), exported by every app's /metrics; ``watch()``
  installs its hook once per process, however many apps are built.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import Histogram

PAUSES = Histogram(
    "sandbox_api_gc_pause_seconds",
    "Garbage-collector pauses of the API process, by generation (streams wait meanwhile)",
    ["generation"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
    registry=None,  # each app's registry registers it (see api/metrics.py)
)

_started_at = 0.0


def _observe(phase: str, info: dict) -> None:
    global _started_at
    if phase == "start":
        _started_at = time.perf_counter()
    else:
        PAUSES.labels(str(info["generation"])).observe(time.perf_counter() - _started_at)


def watch() -> None:
    if _observe not in gc.callbacks:
        gc.callbacks.append(_observe)


def tune() -> None:
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)
