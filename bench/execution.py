"""Code execution through the API: warm round trips and first calls, confined vs not.

Two ``dev`` servers run side by side in the same run: one whose runtimes confine code with
Landlock (``SANDBOX_WORKSPACE_CONFINEMENT=require``), one with confinement off (``none``);
both start code through the same spawner, so the difference is Landlock's own cost.
Samples alternate between the two servers so drift on a shared machine hits both alike.

Goals: warm Python round trip p50 < 10 ms (issue 3); confinement overhead p50 <= 1 ms warm
and <= +10 ms on the first call of a conversation (issue 11). The HTTP floor (GET
/healthz) and ``python -c pass`` are reported as physical limits.
"""

from __future__ import annotations

import itertools
import subprocess
from contextlib import ExitStack

import httpx

from .harness import Figure, dev_server, real_python, timed

_PATH = "/api/v1/sessions/sb-session-bench"


def run(quick: bool) -> list[Figure]:
    calls, firsts = (30, 5) if quick else (400, 30)
    python = real_python()
    baseline = timed(lambda: subprocess.run([python, "-c", "pass"], check=True), firsts)
    with ExitStack() as stack:
        apis = {}
        for mode in ("require", "none"):
            server = stack.enter_context(
                dev_server(
                    SANDBOX_WORKSPACE_SANDBOX_MOUNT="none", SANDBOX_WORKSPACE_CONFINEMENT=mode
                )
            )
            apis[mode] = stack.enter_context(
                httpx.Client(base_url=server.url, headers={"X-User-Id": "bench"}, timeout=60)
            )
        counter = itertools.count()

        def execute(mode: str, cid: str, language: str, code: str) -> None:
            body = {"conversation_id": cid, "language": language, "code": code}
            r = apis[mode].post(f"{_PATH}/execute", json=body)
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        def first_call(mode: str) -> float:
            cid = f"first-{next(counter)}"
            [sample] = timed(lambda: execute(mode, cid, "python", "1 + 1"), 1)
            apis[mode].delete(f"{_PATH}/conversations/{cid}")  # its interpreter goes too
            return sample

        for mode in apis:  # sessions created, interpreters warm
            for _ in range(10):
                execute(mode, "bench", "python", "1 + 1")
        warm = _alternating(lambda m: execute(m, "bench", "python", "1 + 1"), calls)
        bash = _alternating(lambda m: execute(m, "bench", "bash", "true"), max(10, calls // 4))
        first = {m: [] for m in apis}
        for _ in range(firsts):
            for mode in apis:
                first[mode].append(first_call(mode))
        floor = timed(lambda: apis["require"].get("/healthz"), calls)
    return [
        Figure.of(
            "execute python `1 + 1` (warm, confined)",
            "ms",
            warm["require"],
            "python -c pass",
            baseline,
            goal="p50 < 10 ms",
        ),
        _versus("execute python `1 + 1` (warm)", warm, goal="overhead p50 <= 1 ms"),
        _versus("first call of a conversation (python)", first, goal="overhead p50 <= 10 ms"),
        _versus("execute bash `true` (fresh process)", bash, goal="overhead p50 <= 1 ms"),
        Figure.of("GET /healthz (HTTP floor)", "ms", floor, "python -c pass", baseline),
    ]


def _alternating(call, repeat: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"require": [], "none": []}
    for _ in range(repeat):
        for mode in samples:
            samples[mode].extend(timed(lambda m=mode: call(m), 1))
    return samples


def _versus(name: str, samples: dict[str, list[float]], *, goal: str) -> Figure:
    figure = Figure.of(
        f"{name}, confined", "ms", samples["require"], "unconfined", samples["none"], goal=goal
    )
    figure.extra["overhead_p50_ms"] = round(figure.p50 - figure.baseline_p50, 3)
    return figure
