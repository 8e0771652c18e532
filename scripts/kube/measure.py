"""Measure the cluster tier's control plane: warm start time and memory.

    .venv/bin/python scripts/kube/measure.py [--runs 3] [--settle 10]

Starts etcd + kube-apiserver + kube-controller-manager exactly as the pytest fixture
does (binaries from scripts/build-kube.sh), reports the time until each is ready and
the RSS of each process after `--settle` seconds idle, then stops them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from kubeenv.controlplane import ControlPlane, build_binaries  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    build_binaries(stream=sys.stderr)
    starts, stops, rss_totals = [], [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kube-measure-") as tmp:
            plane = ControlPlane(Path(tmp))
            plane.start()
            t = plane.timings
            starts.append(t["total"])
            time.sleep(args.settle)  # a measurement: let the controllers settle
            rss = plane.rss()
            rss_totals.append(sum(rss.values()))
            t0 = time.monotonic()
            plane.stop()
            stops.append(time.monotonic() - t0)
            parts = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in rss.items())
            print(
                f"run {i + 1}: ready in {t['total']:.2f}s (etcd {t['etcd']:.2f}s, "
                f"apiserver {t['kube-apiserver'] - t['etcd']:.2f}s, "
                f"kcm {t['kube-controller-manager'] - t['kube-apiserver']:.2f}s); "
                f"RSS after {args.settle:.0f}s: {parts}, total {rss_totals[-1] / 2**20:.0f} MiB; "
                f"stop {stops[-1]:.2f}s"
            )
    print(
        f"median: ready {statistics.median(starts):.2f}s, "
        f"RSS {statistics.median(rss_totals) / 2**20:.0f} MiB, stop {statistics.median(stops):.2f}s"
    )


if __name__ == "__main__":
    main()
