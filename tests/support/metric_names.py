"""The metrics the code defines, by the names Prometheus exposes (test helper).

``metrics_in_code()`` reads api/, operator/ and runtime/ for prometheus_client metric
definitions (``Counter("sandbox_…"``, ``GaugeMetricFamily("sandbox_…"``…); a counter's
exposed name gains ``_total``. ``base_metric(name)`` strips the series suffixes a query
names (``_bucket``, ``_count``, ``_sum``, ``_created``) back to the metric. Used by
tests/test_docs.py (the operations.md table) and tests/chart (alerts and dashboard).
"""

from __future__ import annotations

import re

from doc_blocks import REPO_ROOT

SERIES_SUFFIX = re.compile(r"_(bucket|count|sum|created)$")


def metrics_in_code() -> set[str]:
    """Every metric the API and operator define, by the name Prometheus exposes."""
    names = set()
    for package in ("api", "operator", "runtime"):
        for source in (REPO_ROOT / package).rglob("*.py"):
            text = source.read_text()
            found = re.findall(r"\b(\w*?)(?:MetricFamily)?\(\s*\"(sandbox_\w+)\"", text)
            for kind, name in found:
                if kind not in {"Counter", "Gauge", "Histogram", "Summary"}:
                    continue
                counter = kind == "Counter" and not name.endswith("_total")
                names.add(f"{name}_total" if counter else name)
    return names


def base_metric(name: str, known: set[str]) -> str:
    """``name`` as a query writes it → the metric it is a series of."""
    return name if name in known else SERIES_SUFFIX.sub("", name)
