"""Upload and download of a large file through API → runtime vs a plain copy on one disk.

Goals (issue 8): throughput ratio ≥ 0.5 of the plain copy; peak RSS of the API and the
runtime flat (under +64 MB for 1 GB), which is what proves the bodies stream.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from .harness import Figure, dev_server, peak_rss_mb, runtime_pid

CHUNK = 1024 * 1024


def _mb_per_s(size: int, seconds: float) -> float:
    return size / CHUNK / seconds


def run(quick: bool) -> list[Figure]:
    size = (32 if quick else 1024) * CHUNK
    repeat = 1 if quick else 3
    figures = []
    with tempfile.TemporaryDirectory(prefix="sbw-bench-copy-", dir=".") as tmp:
        source = Path(tmp) / "source.bin"
        with open(source, "wb") as f:
            for i in range(size // CHUNK):
                f.write(os.urandom(64) * (CHUNK // 64) if i == 0 else bytes([i % 256]) * CHUNK)
        digest = hashlib.sha256(source.read_bytes()).hexdigest() if quick else None
        copies = []
        for n in range(repeat):
            start = time.perf_counter()
            shutil.copyfile(source, Path(tmp) / f"copy-{n}.bin")
            with open(Path(tmp) / f"copy-{n}.bin", "rb+") as f:
                os.fsync(f.fileno())  # the runtime fsyncs uploads: compare like with like
            copies.append(_mb_per_s(size, time.perf_counter() - start))
        limits = {"max_file_size": 2, "max_file_size_unit": "GB", "allowed_file_types": []}
        with (
            dev_server(
                SANDBOX_WORKSPACE_SANDBOX_MOUNT="none", SANDBOX_WORKSPACE_DATA_DIR=tmp
            ) as server,
            httpx.Client(base_url=server.url, headers={"X-User-Id": "bench"}, timeout=600) as api,
        ):
            url = "/api/v1/sessions/sb-session-bench"
            api.post("/api/v1/sessions", json={"config": {"file_upload_config": limits}})
            api.get(f"{url}/files", params={"conversation_id": "c"})
            rt = runtime_pid(server.data_dir)
            rss_before = {"api": peak_rss_mb(server.pid), "runtime": peak_rss_mb(rt)}
            uploads, downloads = [], []
            for _ in range(repeat):
                with open(source, "rb") as f:
                    start = time.perf_counter()
                    r = api.post(
                        f"{url}/files/upload",
                        files={"file": ("big.bin", f)},
                        data={"conversation_id": "c"},
                    )
                    uploads.append(_mb_per_s(size, time.perf_counter() - start))
                assert r.status_code == 201, r.text
                if digest:
                    assert r.json()["sha256"] == digest
                start = time.perf_counter()
                with api.stream(
                    "GET", f"{url}/files/big.bin", params={"conversation_id": "c"}
                ) as got:
                    received = sum(len(c) for c in got.iter_raw(CHUNK))
                downloads.append(_mb_per_s(size, time.perf_counter() - start))
                assert received == size
            growth = {
                "api": peak_rss_mb(server.pid) - rss_before["api"],
                "runtime": peak_rss_mb(rt) - rss_before["runtime"],
            }
    label = f"{size // CHUNK} MB"
    figures.append(
        Figure.of(
            f"upload {label} via API (MB/s)",
            "MB/s",
            uploads,
            "cp + fsync same disk",
            copies,
            goal="ratio ≥ 0.5",
            peak_rss_growth_mb={k: round(v, 1) for k, v in growth.items()},
        )
    )
    figures.append(
        Figure.of(
            f"download {label} via API (MB/s)",
            "MB/s",
            downloads,
            "cp + fsync same disk",
            copies,
            goal="ratio ≥ 0.5",
        )
    )
    figures.append(
        Figure.of(
            "peak RSS growth API / runtime (MB)",
            "MB",
            [growth["api"], growth["runtime"]],
            "limit",
            [64.0, 64.0],
            goal="< 64 MB",
        )
    )
    return figures
