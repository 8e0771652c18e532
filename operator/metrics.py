"""Prometheus metrics of the operator, in a registry of its own (one per operator).

- ``sandbox_operator_reconciles_total{kind, outcome}``: handler runs (ok / retry / error).
- ``sandbox_operator_errors_total{kind, reason}``: failures by cause.
- ``sandbox_operator_sessions{phase}``: sessions this operator sees, by phase.
- ``sandbox_operator_workspace_deletion_seconds``: conversation delete requested (the
  resource's deletionTimestamp) to files verified gone.
- ``sandbox_operator_runtime_answer_seconds``: a starting sandbox pod seen running (not
  yet Ready) to its runtime's first answer to the operator's own /healthz poll — the
  runtime's start-up as the operator sees it (``answers.py``).
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PHASES = ("Pending", "Running", "Stopped", "Error")


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "sandbox_operator_reconciles",
            "Reconciliations by resource kind and outcome.",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.errors = Counter(
            "sandbox_operator_errors",
            "Reconciliation failures by resource kind and reason.",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.sessions = Gauge(
            "sandbox_operator_sessions",
            "SandboxSessions by phase.",
            ["phase"],
            registry=self.registry,
        )
        self.deletion_seconds = Histogram(
            "sandbox_operator_workspace_deletion_seconds",
            "From a ConversationWorkspace's deletion request to its files verified gone.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
            registry=self.registry,
        )
        self.runtime_answer_seconds = Histogram(
            "sandbox_operator_runtime_answer_seconds",
            "From a starting sandbox pod seen running to its runtime's first /healthz answer.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 120),
            registry=self.registry,
        )
        self._phases: dict[str, str] = {}
        self._counts: Tally[str] = Tally()
        self._server: Any = None

    def session_phase(self, key: str, phase: str | None) -> None:
        """Record the phase of one session (None: the session is gone)."""
        # Counted as phases change, not recounted: O(1) per call with 10,000 sessions.
        old = self._phases.pop(key, None) if phase is None else self._phases.get(key)
        if phase is not None:
            self._phases[key] = phase
        if old == phase and self._counts:
            return
        if old is not None:
            self._counts[old] -= 1
        if phase is not None:
            self._counts[phase] += 1
        for name in {*PHASES, old, phase} - {None}:
            self.sessions.labels(name).set(self._counts.get(name, 0))

    def serve(self, port: int, host: str) -> None:
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
