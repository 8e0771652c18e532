"""The floor of a burst of warm-pool claims: the apiserver writes a claim is made of, done
back to back by a client with no operator at all, on this machine's own control plane.

``python -m bench.claim_floor [--burst 50] [--rounds 5]`` — not a suite of ``make bench``;
the measurement behind issue 25's burst figure in docs/performance.md (the session start
section). ``bench session_start``'s burst floor is one write per start (the create and its
watch event); a claim cannot be fewer than three: the session created, the pool pod bound
to it (labels and owner) and the session's status written Running — four today, with the
session's token Secret. Here ``--burst`` threads, released together, each do a variant's
writes with no time between them (an operator that costs nothing and hears every event
at once) and watch until the last write shows:

- ``create``: the SandboxSession created (1 write; ``bench session_start``'s floor);
- ``swap+status``: then a Pending pool pod (made beforehand) patched to the session,
  then the session's status (3 writes: the fewest a claim can make);
- ``secret+swap+status``: the token Secret first (4 writes: the short path's today).

Per variant: p50 / p99 over the rounds' starts (ms, the create's request → the last
write's watch event), and the CPU of kube-apiserver, etcd and the client per start. The
control plane is the cluster tier's (etcd + kube-apiserver + kube-controller-manager, no
node), so the apiserver carries less than on the node tier during ``bench
session_start`` — a lower bound. Results: ``bench/results/claim_floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from .harness import cpu_seconds, percentile
from .operator import API, _cluster, _session_running, _watch_until

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "claim_floor.json"
NS = "claim-floor"
VARIANTS = {"create": 1, "swap+status": 3, "secret+swap+status": 4}
GOAL_MS = 250


def _pool_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"sandboxworkspace.io/pool": "floor"}},
        "spec": {"containers": [{"name": "runtime", "image": "floor:none"}]},
    }


def _round(plane, variant: str, burst: int, tag: str) -> list[float]:
    """One burst of ``burst`` starts of ``variant`` (ms each)."""
    sbs, pods = f"{API}/namespaces/{NS}/sandboxsessions", f"/api/v1/namespaces/{NS}/pods"
    secrets = f"/api/v1/namespaces/{NS}/secrets"
    with plane.client() as api:
        for j in range(burst):
            api.create(pods, _pool_pod(f"pool-{tag}-{j}"))
    took = [0.0] * burst
    gate = threading.Barrier(burst)

    def one(j: int) -> None:
        name = f"sb-{tag}-{j}"
        with plane.client() as own:
            # The connection is open before the gate; the watch starts from before the create.
            rv = own.get(f"{sbs}?limit=1")["metadata"]["resourceVersion"]
            gate.wait()
            start = time.perf_counter()
            body = {
                "apiVersion": "sandboxworkspace.io/v1alpha1",
                "kind": "SandboxSession",
                "metadata": {"name": name},
                "spec": {"userId": f"u-{tag}-{j}"},
            }
            created = own.create(sbs, body)
            done = (lambda _: True) if variant == "create" else _session_running
            if variant != "create":
                meta = created["metadata"]
                if variant.startswith("secret"):
                    own.create(
                        secrets,
                        {"metadata": {"name": f"{name}-token"}, "stringData": {"token": "x"}},
                    )
                owner = {
                    "apiVersion": "sandboxworkspace.io/v1alpha1",
                    "kind": "SandboxSession",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                }
                own.patch(
                    f"{pods}/pool-{tag}-{j}",
                    {"metadata": {"labels": {"sandboxworkspace.io/session": name},
                                  "ownerReferences": [owner]}},
                )  # fmt: skip
                own.patch(f"{sbs}/{name}/status", {"status": {"phase": "Running"}})
            before = {"metadata": {"name": name, "resourceVersion": rv}}
            took[j] = (_watch_until(own, sbs, before, done) - start) * 1000

    threads = [threading.Thread(target=one, args=(j,)) for j in range(burst)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not all(took):
        raise RuntimeError(f"a start of {variant} was not seen")
    return took


def measure(burst: int, rounds: int) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="sbw-claim-floor-") as tmp,
        _cluster(Path(tmp)) as (plane, api),
    ):
        api.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        pids = {name: plane.procs[name].pid for name in ("kube-apiserver", "etcd")}
        pids["client (this process)"] = os.getpid()
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, dict[str, float]] = {v: dict.fromkeys(pids, 0.0) for v in VARIANTS}
        _round(plane, "create", burst, "warm")
        for r in range(rounds):  # variants interleaved: the machine's swings hit each alike
            for k, variant in enumerate(VARIANTS):
                before = {n: cpu_seconds(p) for n, p in pids.items()}
                samples[variant] += _round(plane, variant, burst, f"r{r}v{k}")
                for n, p in pids.items():
                    cpu[variant][n] += cpu_seconds(p) - before[n]
    starts = burst * rounds
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "burst": burst,
        "rounds": rounds,
        "goal_p99_ms": GOAL_MS,
        "machine_cpus": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "variants": {
            variant: {
                "writes_per_start": VARIANTS[variant],
                "p50_ms": round(statistics.median(samples[variant]), 1),
                "p99_ms": round(percentile(samples[variant], 99), 1),
                "cpu_ms_per_start": {
                    n: round(s * 1000 / starts, 2) for n, s in cpu[variant].items()
                },
            }
            for variant in VARIANTS
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_floor")
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.burst, args.rounds)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
