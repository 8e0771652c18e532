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


@pytest.mark.timeout(960)  # the suite's own limit below, not the default 300 s
def test_bench_runs_in_quick_mode():
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,  # the fault trials' quick mode: ~3.5 min of it
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())
    names = [f["name"] for f in data["figures"]]
    assert any("execute python" in n for n in names)
    assert any(n.startswith("upload") for n in names)
    assert all(f["p50"] > 0 and f["baseline_p50"] > 0 for f in data["figures"])
    # Every chat route under the same load, on both providers, beside /chat's figure.
    chat_routes = [f["extra"] for f in data["figures"] if f["name"].startswith("chat via ")]
    assert sorted((f["route"], f["provider"]) for f in chat_routes) == sorted(
        (route, provider)
        for route in ("/api/v1/ui/chat", "/api/v1/ag-ui", "/api/v1/agents")
        for provider in ("openai", "anthropic")
    )
    assert all(f["n"] == f["baseline_n"] and "vs_chat_p99_ms" in f for f in chat_routes)
    # The fault trials (quick mode) count what a deletion under faults left behind.
    faults = ROOT / "bench" / "results" / "faults-quick.json"
    if "faults: skipped" not in result.stdout:
        assert faults.stat().st_mtime >= started, "the fault trials wrote no results"
        trials = json.loads(faults.read_text())
        assert trials["trials"] >= 2 * len(trials["faults"])
        # Store faults (store mode s3, a real SeaweedFS): nothing left in the bucket either.
        # The failure names each fault that left something, with what it left and when.
        bad = [
            f
            for f in trials["faults"]
            if f["leaked_files"] or f.get("leaked_objects") or f["stuck"] or f["released_early"]
        ]
        assert trials["leaked_objects"] == 0 and trials["released_early"] == 0, bad
        assert trials["leaked_files"] == 0 and trials["stuck"] == 0, bad
    # The operator at scale (quick form: 30 sessions) wrote its figures.
    operator = ROOT / "bench" / "results" / "operator-quick.json"
    if "operator: skipped" not in result.stdout:
        scale = json.loads(operator.read_text())
        assert scale["quick"] and scale["sessions"] == 30 and operator.stat().st_mtime >= started
        assert scale["burst_per_second"] > 0 and scale["rss_bytes"] > 0
        assert scale["idle_stop_lag_p99_s"] < 60  # every idle session stopped
        # The API at the same scale: uploads to its running session, with 10 and with all.
        assert scale["api_upload_p50_ms"] > 0 and scale["api_upload_10_sessions_p50_ms"] > 0
        assert scale["api_rss_bytes"] > 0 and scale["api_rss_10_sessions_bytes"] > 0
    # Time to first command through E2B's SDK, beside our own API (the SDK is a dev dep).
    if "e2b: skipped" not in result.stdout:
        e2b = json.loads((ROOT / "bench" / "results" / "e2b-quick.json").read_text())
        assert e2b["quick"] and e2b["first_command_p50_ms"] > 0
        assert e2b["rest_first_command_p50_ms"] > 0 and "added_p50_ms" in e2b
    # The egress proxy on loopback: a tunnel against direct, an injected secret against
    # the tunnel, each in the same run.
    egress = json.loads((ROOT / "bench" / "results" / "egress-quick.json").read_text())
    assert egress["quick"] and egress["throughput_ratio"] > 0
    assert {"added_p50_ms", "added_p99_ms", "intercepted"} <= egress.keys()
    assert egress["intercepted"]["throughput_ratio"] > 0
    if shutil.which("redis-server") or shutil.which("valkey-server"):
        assert any(n.startswith("chat on the Redis run store") for n in names)
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
