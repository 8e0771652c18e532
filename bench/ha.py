"""High availability of chat runs: runs streamed through several API replicas sharing a
Redis-protocol run store while the replicas are stopped (SIGTERM, a graceful hand-over)
and killed (SIGKILL, a takeover once the lease expires), then restarted.

Every run is followed by a client that re-attaches with ``Last-Event-ID`` on whichever
replica answers (tests/support/run_follower.py). Counted: events lost (gaps in the ids),
events duplicated, streams that never reached ``done`` — the goal is 0 for each — and
each run's longest stall (the wait between two events across a kill or stop) against
the model's pace between tokens when nothing is killed. Writes bench/results/ha.json
(``ha-quick.json`` with --quick: the full run's figures are the ones kept).

    python -m bench ha [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from .harness import Figure, wait_for_port

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "support")]
from redis_server import missing_reason, start_redis  # noqa: E402
from run_follower import start_and_follow  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LEASE_SECONDS = 2.0


class Replica:
    """One ``sandbox-workspace dev`` API process that can be stopped and started again."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        port_file = self.workdir / f"port-{uuid.uuid4().hex[:6]}"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "sandbox_workspace", "dev", "--data-dir", "data"),
                *("--port", "0", "--port-file", str(port_file)),
            ],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "api.log", "ab"),  # noqa: SIM115 — the child keeps it
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{wait_for_port(self.proc, port_file, 'API replica')}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    self.url = url
                    return
            except httpx.TransportError:
                time.sleep(0.02)
        raise RuntimeError("API replica never answered /healthz")

    @property
    def alive(self) -> bool:
        return bool(self.url) and self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int) -> None:
        assert self.proc is not None
        self.url = ""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def _chaos(replicas: list[Replica], kills: list[int], pause: float) -> list[str]:
    """Stop each replica in turn (alternating SIGTERM and SIGKILL) and start it again."""
    done = []
    for i, sig in enumerate(kills):
        await asyncio.sleep(pause)
        replica = replicas[i % len(replicas)]
        await asyncio.to_thread(replica.stop, sig)
        await asyncio.to_thread(replica.start)
        done.append(signal.Signals(sig).name)
    return done


async def _scenario(replicas, runs: int, kills: list[int], pause: float):
    urls = lambda: [r.url for r in replicas if r.alive]  # noqa: E731
    followers = [
        asyncio.create_task(
            start_and_follow(
                urls,
                "ha",
                {"query": "go", "conversation_id": f"ha-{i % 10}"},
                timeout=600,
                first=i,
            )
        )
        for i in range(runs)
    ]
    signals = await _chaos(replicas, kills, pause)
    return signals, await asyncio.gather(*followers)


def run(quick: bool) -> list[Figure]:
    reason = missing_reason()
    if reason:
        print(f"ha: skipped — {reason}", flush=True)
        return []
    # Model turns outlast uvicorn's 5 s for open streams at a stop, so a stopped replica
    # has runs to hand over. quick: 20 runs of 8 s turns, one stop and one kill; full:
    # 100 runs of 15 s turns, three replicas, six stops/kills.
    runs, tokens, interval, count = (20, 160, 0.05, 2) if quick else (100, 300, 0.05, 3)
    kills = [signal.SIGTERM, signal.SIGKILL] * (1 if quick else 3)
    with tempfile.TemporaryDirectory(prefix="sbw-bench-ha-") as tmp:
        root = Path(tmp)
        store = start_redis(root / "redis")
        llm_port_file = root / "llm-port"
        llm = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.llm_server",
                str(llm_port_file),
                str(tokens),
                str(interval),
            ],
            start_new_session=True,
            cwd=REPO,
        )
        replicas: list[Replica] = []
        try:
            llm_url = f"http://127.0.0.1:{wait_for_port(llm, llm_port_file, 'model')}/v1"
            clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
            env = {
                **clean,
                "SANDBOX_WORKSPACE_LOG_LEVEL": "warning",
                "SANDBOX_WORKSPACE_LLM_BASE_URL": llm_url,
                "SANDBOX_WORKSPACE_LLM_MODEL": "bench",
                "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
                "SANDBOX_WORKSPACE_CHAT_RUN_STORE": "redis",
                "SANDBOX_WORKSPACE_CHAT_REDIS_URL": store.url,
                "SANDBOX_WORKSPACE_CHAT_RUN_LEASE_SECONDS": str(LEASE_SECONDS),
                "SANDBOX_WORKSPACE_CHAT_RUN_HANDOVER_SECONDS": "10",
                # One user's runs all at once: the per-user caps are not what this measures.
                "SANDBOX_WORKSPACE_QUOTAS__RUNS_PER_USER": str(runs),
                "SANDBOX_WORKSPACE_QUOTAS__FOLLOWERS_PER_USER": str(4 * runs),
            }
            for i in range(count):
                (root / f"api-{i}").mkdir()
                replicas.append(Replica(root / f"api-{i}", env))
                replicas[-1].start()
            started = time.monotonic()
            pause = 0.5 if quick else 1.5
            signals, followed = asyncio.run(_scenario(replicas, runs, kills, pause))
            seconds = time.monotonic() - started
        finally:
            for replica in replicas:
                if replica.proc is not None and replica.proc.poll() is None:
                    replica.stop(signal.SIGTERM)
            os.killpg(llm.pid, signal.SIGTERM)
            llm.wait(timeout=10)
            store.stop()
    result = {
        "quick": quick,
        "runs": runs,
        "replicas": count,
        "kills": len(signals),
        "signals": signals,
        "lost_events": sum(f.lost for f in followed),
        "duplicated_events": sum(f.duplicated for f in followed),
        "unfinished_streams": sum(not f.done for f in followed),
        "interrupted_runs": sum(
            any(d.get("code") == "run_interrupted" for _, _, d in f.events) for f in followed
        ),
        "resumed_runs": sum(
            any(d.get("stage") == "resumed" for _, _, d in f.events) for f in followed
        ),
        "reconnects": sum(f.reconnects for f in followed),
        "events": sum(len(f.ids) for f in followed),
        "seconds": round(seconds, 1),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RESULTS.mkdir(exist_ok=True)
    # Quick mode (the test command's) never overwrites the full run's committed figures.
    name = "ha-quick.json" if quick else "ha.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print("ha: " + json.dumps(result), flush=True)
    gaps = [f.longest_gap() * 1000 for f in followed if len(f.times) > 1]
    pace = [interval * 1000] * len(gaps)
    return [
        Figure.of(
            f"ha: longest stall of a run's stream, {runs} runs over {count} replicas, "
            f"{len(signals)} stops/kills",
            "ms",
            gaps,
            "model pace between tokens",
            pace,
            goal="0 lost / duplicated / unfinished",
            **{k: result[k] for k in ("lost_events", "duplicated_events", "unfinished_streams")},
        )
    ]
