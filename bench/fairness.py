"""One conversation cannot starve the others: conversation A attacks, B keeps working.

A runs, in turn, a memory bomb, a fork bomb, a CPU spin on every core and a disk filler
(each repeated for the whole window: an attack ended by its limit starts again), while B
— in the same session, so the same runtime — runs warm Python executions and uploads.
B's p50 under each attack is compared with its quiet p50 measured next to it: each
attack is ``CYCLES`` cycles of a quiet block then an attack block (A's executions time
out after about a block), so the other work of a shared machine weighs on both alike
— a single quiet phase followed by one attack phase measured mostly that work's drift
(the memory bomb: 0.72–2.12 over four runs). Every upload of B must succeed. The
limits are the defaults a deployment gets (512Mi / 300 s / 256Mi / 512Mi), the same
``sandbox-workspace dev`` a developer runs.

Results: ``bench/results/fairness.json`` (``fairness-quick.json`` in quick mode): per
attack B's p50, the ratio to the quiet p50, uploads ok/failed and what A's executions
ended with, and the kernel's reclaim/swap/OOM counters during its blocks (the whole
machine's: ``/proc/vmstat``); ``neighbour_p50_ratio_worst`` the worst ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from .harness import Figure, dev_server, percentile

RESULTS = Path(__file__).resolve().parent / "results"
CYCLES = 3
RAMP_SECONDS = 1.0

# Each attack is one execution of A, run again and again until the window closes.
ATTACKS = {
    # Touches what it allocates: RLIMIT_AS stops each process at 512 MiB; four at once.
    "memory bomb": (
        "bash",
        "for i in 1 2 3 4; do python3 -c '\n"
        "chunks = []\n"
        "while True:\n"
        '    b = bytearray(32 << 20); b[::4096] = b"x" * len(b[::4096]); chunks.append(b)\n'
        "' & done; wait",
    ),
    "fork bomb": ("bash", "bomb() { bomb | bomb & }; bomb; sleep 30"),
    "cpu spin on every core": (
        "bash",
        "for i in $(seq $(nproc)); do (while :; do :; done) & done; wait",
    ),
    # 64 MiB files (under the file limit) until the conversation's quota stops it.
    "disk filler": (
        "bash",
        "i=0; while :; do head -c 64M /dev/zero > fill-$i; i=$((i+1)); done",
    ),
}


def _execute(client: httpx.Client, url: str, cid: str, language: str, code: str, timeout: float):
    r = client.post(
        f"{url}/execute",
        json={"conversation_id": cid, "language": language, "code": code, "timeout": timeout},
        timeout=timeout + 60,
    )
    r.raise_for_status()
    return r.json()


def _neighbour(client: httpx.Client, url: str, n: int, uploads: int) -> tuple[list, int, int]:
    """B's warm execution latencies (ms), and uploads ok / failed."""
    samples, ok, failed = [], 0, 0
    every = max(1, n // max(1, uploads))
    for i in range(n):
        start = time.perf_counter()
        out = _execute(client, url, "b", "python", "counter += 1", 30)
        samples.append((time.perf_counter() - start) * 1000)
        assert out["error"] is None, out
        if i % every == 0:
            r = client.post(
                f"{url}/files/upload",
                files={"file": (f"b-{i}.csv", b"x" * 65536)},
                data={"conversation_id": "b"},
            )
            ok, failed = (ok + 1, failed) if r.status_code == 201 else (ok, failed + 1)
    return samples, ok, failed


def _attack(client, url, language, code, stop: threading.Event, window: float, ended: Counter):
    while not stop.is_set():
        try:
            out = _execute(client, url, "a", language, code, window)
        except httpx.HTTPError as e:
            ended[f"http error {e}"] += 1
            continue
        error = out.get("error") or {}
        ended[error.get("code") or error.get("name") or f"exit {out['exit_code']}"] += 1
        _execute(client, url, "a", "bash", "rm -f fill-*", 30)  # the filler starts afresh


def _kernel_counters() -> dict[str, int]:
    """/proc/vmstat counters that show reclaim, swapping and OOM kills."""
    found: dict[str, int] = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            for name, prefix in _KERNEL_COUNTERS.items():
                if key.startswith(prefix):
                    found[name] = found.get(name, 0) + int(value)
    return found


_KERNEL_COUNTERS = {
    "pages_scanned_for_reclaim": "pgscan_",
    "direct_reclaim_stalls": "allocstall_",
    "pages_swapped_out": "pswpout",
    "oom_kills": "oom_kill",
    "page_faults": "pgfault",
}


def _cycle(b_client, server, headers, url, attack, n: int, window: float) -> dict:
    """One quiet block, then one attack block: B's samples of each, what A ended with."""
    language, code = attack
    quiet, _, _ = _neighbour(b_client, url, n, 1)
    stop, ended = threading.Event(), Counter()
    before = _kernel_counters()
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as a_client:
        attacker = threading.Thread(
            target=_attack, args=(a_client, url, language, code, stop, window, ended)
        )
        attacker.start()
        time.sleep(RAMP_SECONDS)  # the attack is under way
        samples, ok, failed = _neighbour(b_client, url, n, 1)
        stop.set()
        attacker.join()  # A's execution ends by its limit or its timeout, ``window``
    after = _kernel_counters()
    return {
        "quiet": quiet, "samples": samples, "ok": ok, "failed": failed, "ended": ended,
        "kernel": {k: after.get(k, 0) - before.get(k, 0) for k in after},
    }  # fmt: skip


def run(quick: bool) -> list[Figure]:
    # An attack's execution lasts at most ``window`` (its timeout): about one block.
    n, window, cycles = (10, 2.0, 1) if quick else (70, 3.0, CYCLES)
    report: dict = {
        "quick": quick,
        "samples_per_phase": n * cycles,
        "cycles_per_attack": cycles,
        "load_average_start": os.getloadavg()[0],
        "attacks": {},
    }
    figures, quiet_all = [], []
    with dev_server(SANDBOX_WORKSPACE_SANDBOX_MOUNT="none") as server:
        headers = {"X-User-Id": "fairness"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as b_client:
            url = "/api/v1/sessions/sb-session-fairness"
            _execute(b_client, url, "b", "python", "counter = 0", 60)
            _neighbour(b_client, url, 10, 1)  # warm-up
            for name, attack in ATTACKS.items():
                runs = [
                    _cycle(b_client, server, headers, url, attack, n, window) for _ in range(cycles)
                ]
                quiet = [x for r in runs for x in r["quiet"]]
                samples = [x for r in runs for x in r["samples"]]
                quiet_all.extend(quiet)
                alive = _execute(b_client, url, "b", "python", "counter", 30)
                kernel: Counter = Counter()
                ended: Counter = Counter()
                for r in runs:
                    kernel.update(r["kernel"])
                    ended.update(r["ended"])
                report["attacks"][name] = {
                    "p50_ms": statistics.median(samples),
                    "p99_ms": percentile(samples, 99),
                    "quiet_p50_ms": statistics.median(quiet),
                    "ratio": round(statistics.median(samples) / statistics.median(quiet), 3),
                    "uploads_ok": sum(r["ok"] for r in runs),
                    "uploads_failed": sum(r["failed"] for r in runs),
                    "attacker_executions_ended_with": dict(ended),
                    "kernel_during_attack": dict(kernel),
                    "neighbour_state_kept": alive["error"] is None
                    and not alive["kernel_restarted"],
                }
                figures.append(
                    Figure.of(
                        f"warm execute python of B while A runs a {name}", "ms", samples,
                        "B quiet", quiet, goal="ratio <= 2",
                    )
                )  # fmt: skip
    report["quiet_p50_ms"] = statistics.median(quiet_all)
    ratios = [a["ratio"] for a in report["attacks"].values()]
    report["neighbour_p50_ratio_worst"] = max(ratios)
    report["load_average_end"] = os.getloadavg()[0]
    report["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    RESULTS.mkdir(exist_ok=True)
    name = "fairness-quick.json" if quick else "fairness.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)
    return figures
