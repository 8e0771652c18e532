"""The benchmark suite runs (quick mode) — benchmarks are not timed tests; this only checks
that ``make bench`` keeps working and writes its results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# The quick run in four units of about equal length (faults ~130 s, operator ~70 s, chat
# + ha ~55 s, the rest ~80 s on an idle machine), so the test command's two workers run
# them side by side; together they are every suite `python -m bench --quick` runs.
QUICK_UNITS = {
    "faults": ["faults"],
    "operator": ["operator"],
    "chat": ["chat", "ha"],
    "rest": [
        *("execution", "transfer", "concurrency", "session_start", "fairness", "storage"),
        *("e2b", "egress"),
    ],
}


def test_quick_units_cover_every_default_suite():
    listed = subprocess.run(
        [sys.executable, "-c", "from bench.__main__ import OPT_IN, SUITES as S; "
         "print(' '.join(s for s in S if s not in OPT_IN))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    units = [suite for suites in QUICK_UNITS.values() for suite in suites]
    assert sorted(units) == sorted(listed)


def _run_quick(unit: str) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    started = time.time()
    summary = f"latest-quick-{unit}"
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--summary", summary, *QUICK_UNITS[unit]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # the fault trials' quick mode: ~2–3.5 min of it
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((ROOT / "bench" / "results" / f"{summary}.json").read_text())
    assert all(f["p50"] > 0 and f["baseline_p50"] > 0 for f in data["figures"])
    return result, data["figures"], started


@pytest.mark.timeout(660)  # the run's own limit above, not the default 300 s
def test_bench_quick_rest():
    _, figures, _ = _run_quick("rest")
    names = [f["name"] for f in figures]
    assert any("execute python" in n for n in names)
    assert any(n.startswith("upload") for n in names)
    # Time to first command through E2B's SDK, beside our own API (the SDK is a dev dep).
    e2b = json.loads((ROOT / "bench" / "results" / "e2b-quick.json").read_text())
    assert e2b["quick"] and e2b["first_command_p50_ms"] > 0
    assert e2b["rest_first_command_p50_ms"] > 0 and "added_p50_ms" in e2b
    # The egress proxy on loopback: a tunnel against direct, an injected secret against
    # the tunnel, each in the same run.
    egress = json.loads((ROOT / "bench" / "results" / "egress-quick.json").read_text())
    assert egress["quick"] and egress["throughput_ratio"] > 0
    assert {"added_p50_ms", "added_p99_ms", "intercepted"} <= egress.keys()
    assert egress["intercepted"]["throughput_ratio"] > 0
    # The same downloads with the proxy on CPUs of its own (None on a 1-CPU machine).
    pinned = egress["pinned"]
    assert pinned is None or pinned["throughput_ratio"] > 0
    assert pinned is None or not set(pinned["proxy_cpus"]) & set(pinned["client_upstream_cpus"])


@pytest.mark.timeout(660)
def test_bench_quick_chat_routes_and_replicas():
    _, figures, started = _run_quick("chat")
    # Every chat route under the same load, on both providers, beside /chat's figure.
    chat_routes = [f["extra"] for f in figures if f["name"].startswith("chat via ")]
    assert sorted((f["route"], f["provider"]) for f in chat_routes) == sorted(
        (route, provider)
        for route in ("/api/v1/ui/chat", "/api/v1/ag-ui", "/api/v1/agents")
        for provider in ("openai", "anthropic")
    )
    assert all(f["n"] == f["baseline_n"] and "vs_chat_p99_ms" in f for f in chat_routes)
    if shutil.which("redis-server") or shutil.which("valkey-server"):
        assert any(f["name"].startswith("chat on the Redis run store") for f in figures)
        chat = json.loads((ROOT / "bench" / "results" / "chat-quick.json").read_text())
        on_redis = chat["figures"][1]["extra"]
        assert chat["quick"] and len(on_redis["rounds"]) == 1
        assert on_redis["added_p50_ms"] == on_redis["rounds"][0]["added_p50_ms"]
        ha = json.loads((ROOT / "bench" / "results" / "ha-quick.json").read_text())
        assert ha["quick"] and ha["when"] >= time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(started)
        )
        assert ha["kills"] >= 2 and ha["replicas"] >= 2 and ha["runs"] > 0
        assert ha["lost_events"] == ha["duplicated_events"] == ha["unfinished_streams"] == 0


@pytest.mark.timeout(660)
def test_bench_quick_fault_trials_leave_nothing():
    result, _, started = _run_quick("faults")
    # The fault trials (quick mode) count what a deletion under faults left behind.
    faults = ROOT / "bench" / "results" / "faults-quick.json"
    if "faults: skipped" in result.stdout:
        pytest.skip(result.stdout.split("faults: skipped", 1)[1].splitlines()[0])
    assert faults.stat().st_mtime >= started, "the fault trials wrote no results"
    trials = json.loads(faults.read_text())
    assert trials["trials"] >= len(trials["faults"])  # the fork trial: one
    # Store faults (store mode s3, a real SeaweedFS): nothing left in the bucket either.
    # The failure names each fault that left something, with what it left and when.
    counts = ("leaked_files", "leaked_objects", "stuck", "released_early", "lost_objects",
              "partial_forks")  # fmt: skip
    bad = [f for f in trials["faults"] if any(f.get(k) for k in counts)]
    assert trials["leaked_objects"] == 0 and trials["released_early"] == 0, bad
    # The fork trial: nothing a live fork references lost, no fork left half-made.
    assert trials["lost_objects"] == 0 and trials["partial_forks"] == 0, bad
    assert trials["leaked_files"] == 0 and trials["stuck"] == 0, bad


@pytest.mark.timeout(660)
def test_bench_quick_operator_at_scale():
    result, _, started = _run_quick("operator")
    # The operator at scale (quick form: 30 sessions) wrote its figures.
    operator = ROOT / "bench" / "results" / "operator-quick.json"
    if "operator: skipped" in result.stdout:
        pytest.skip(result.stdout.split("operator: skipped", 1)[1].splitlines()[0])
    scale = json.loads(operator.read_text())
    assert scale["quick"] and scale["sessions"] == 30 and operator.stat().st_mtime >= started
    assert scale["burst_per_second"] > 0 and scale["rss_bytes"] > 0
    assert scale["idle_stop_lag_p99_s"] < 60  # every idle session stopped
    # The API at the same scale: uploads to its running session, with 10 and with all.
    assert scale["api_upload_p50_ms"] > 0 and scale["api_upload_10_sessions_p50_ms"] > 0
    assert scale["api_rss_bytes"] > 0 and scale["api_rss_10_sessions_bytes"] > 0


SELECTION = ["--providers", "anthropic", "--rounds", "2"]


@pytest.mark.timeout(300)
def test_bench_chat_runs_a_selection_of_routes():
    """``python -m bench.chat --routes … --providers …``: only those routes, beside /chat's
    phases on those providers, written apart from the full run's figures."""
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "bench.chat", "--quick", "--routes", "agents", *SELECTION],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    selected = ROOT / "bench" / "results" / "chat-selected.json"
    assert selected.stat().st_mtime >= started
    figures = json.loads(selected.read_text())["figures"]
    assert [f["name"].split(":")[0] for f in figures] == [
        "chat on the Anthropic Messages provider",
        "chat via /api/v1/agents (Anthropic Messages provider)",
    ]
    route = figures[1]["extra"]
    assert route["n"] == 2 * route["baseline_n"] and len(route["vs_chat_rounds"]) == 2
    assert "vs /chat" in result.stdout
