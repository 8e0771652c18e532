"""Trivial Python round trip through the API (warm interpreter) vs ``python -c pass``.

Goal (issue 3): p50 under 10 ms once the interpreter is warm. Also reports the HTTP floor
(GET /healthz on the same API) so the cost of execution itself is visible.
"""

from __future__ import annotations

import subprocess

import httpx

from .harness import Figure, dev_server, real_python, timed


def run(quick: bool) -> list[Figure]:
    calls, spawns = (30, 5) if quick else (500, 40)
    python = real_python()
    baseline = timed(lambda: subprocess.run([python, "-c", "pass"], check=True), spawns)
    with (
        dev_server(SANDBOX_WORKSPACE_SANDBOX_MOUNT="none") as server,
        httpx.Client(base_url=server.url, headers={"X-User-Id": "bench"}, timeout=60) as api,
    ):
        body = {"conversation_id": "bench", "language": "python", "code": "1 + 1"}
        path = "/api/v1/sessions/sb-session-bench/execute"

        def call() -> None:
            r = api.post(path, json=body)
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        first = timed(call, 1)  # creates the session and starts the interpreter
        for _ in range(10):
            call()
        warm = timed(call, calls)
        floor = timed(lambda: api.get("/healthz"), calls)
        bash_body = {**body, "language": "bash", "code": "true"}
        bash = timed(lambda: api.post(path, json=bash_body), max(5, calls // 10))
    return [
        Figure.of(
            "execute python `1 + 1` (warm)",
            "ms",
            warm,
            "python -c pass",
            baseline,
            goal="p50 < 10 ms",
            cold_first_call_ms=round(first[0], 1),
        ),
        Figure.of("GET /healthz (HTTP floor)", "ms", floor, "python -c pass", baseline),
        Figure.of("execute bash `true` (fresh process)", "ms", bash, "python -c pass", baseline),
    ]
