"""Fork and snapshot of a conversation in s3 mode (a part of ``python -m bench storage``).

A conversation of ``FILES`` files (1,000 × 1 MiB = 1 GiB; 50 × 20 kB in quick mode) is
written by one execution (its write-back puts them in the store). Then, each timed until
the API answers:
- ``snapshot_seconds``: ``POST …/snapshots``;
- ``fork_seconds``: ``POST …/fork``, and ``fork_api_bytes``: what the API process read and
  wrote meanwhile (``/proc/{pid}/io`` ``rchar + wchar``: every socket and file byte it
  moved — goal 0 of the files' bytes; what remains is metadata and HTTP);
- beside them, in the same run on the same server: ``fork_floor_seconds``, a plain
  client (obstore) making the same ``FILES`` server-side copies with the same parallelism
  as the API (``store.snapshots.COPY_CONCURRENCY``) — goal fork ≤ 1.2× that floor, or ≤ 1 s;
  and ``copy_baseline_seconds``, the same copy by download and upload (what a copy
  through the API would cost).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx

from sandbox_workspace.store import S3Store
from sandbox_workspace.store.snapshots import COPY_CONCURRENCY

from .harness import Figure, dev_server


def _io_bytes(pid: int) -> int:
    text = Path(f"/proc/{pid}/io").read_text()
    fields = dict(line.split(": ") for line in text.splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


async def _copies(store: S3Store, keys: list[str], to: str, *, through: bool) -> float:
    """Copy ``keys`` under ``to``: server-side, or by download and upload (``through``)."""
    gate = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(key: str) -> None:
        async with gate:
            target = to + key.rsplit("/", 1)[-1]
            if through:
                data, _ = await store.read(key)
                await store.put(target, data)
            else:
                await store.copy(key, target)

    start = time.perf_counter()
    await asyncio.gather(*(one(k) for k in keys))
    return time.perf_counter() - start


async def _keys(store: S3Store, prefix: str) -> list[str]:
    return [i.key async for i in store.list(prefix)]


def run(env: dict[str, str], store: S3Store, quick: bool) -> list[Figure]:
    files, size = (50, 20_000) if quick else (1000, 1 << 20)
    rounds = 1 if quick else 3
    env = {**env, "SANDBOX_WORKSPACE_LIMITS__CONVERSATION_SIZE": "8Gi"}
    forks, snaps, moved, floors, baselines = [], [], [], [], []
    write = (
        f"import os\nfor i in range({files}):\n"
        f"    open(f'outputs/f{{i:04}}.bin', 'wb').write(os.urandom({size}))\n"
    )
    with (
        dev_server(**env) as server,
        httpx.Client(base_url=server.url, headers={"X-User-Id": "fk"}, timeout=1800) as api,
    ):
        url = "/api/v1/sessions/sb-session-fk/conversations"
        api.post("/api/v1/sessions", json={})
        body = {"conversation_id": "origin", "language": "python", "code": write}
        r = api.post("/api/v1/sessions/sb-session-fk/execute", json=body)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        prefix = "workspaces/default/sb-session-fk/origin/outputs/"
        keys = asyncio.run(_keys(store, prefix))
        assert len(keys) == files, f"{len(keys)} of {files} outputs in the store"
        for n in range(rounds):
            start = time.perf_counter()
            r = api.post(f"{url}/origin/snapshots", json={"name": f"round {n}"})
            snaps.append(time.perf_counter() - start)
            assert r.status_code == 201 and r.json()["file_count"] == files, r.text
            before = _io_bytes(server.pid)
            start = time.perf_counter()
            r = api.post(f"{url}/origin/fork", json={"conversation_id": f"fork-{n}"})
            forks.append(time.perf_counter() - start)
            moved.append(_io_bytes(server.pid) - before)
            assert r.status_code == 201 and r.json()["file_count"] == files, r.text
            floors.append(asyncio.run(_copies(store, keys, f"plain/fk-{n}/", through=False)))
            baselines.append(asyncio.run(_copies(store, keys, f"plain/dl-{n}/", through=True)))
            assert api.delete(f"{url}/fork-{n}").status_code == 200
    keys_out = {
        "files": files,
        "bytes": files * size,
        "fork_seconds": round(statistics.median(forks), 3),
        "fork_api_bytes": int(statistics.median(moved)),
        "snapshot_seconds": round(statistics.median(snaps), 3),
        "fork_floor_seconds": round(statistics.median(floors), 3),
        "copy_baseline_seconds": round(statistics.median(baselines), 3),
    }
    label = f"{files} files / {files * size // 1_000_000} MB"
    return [
        Figure.of(
            f"fork of a conversation of {label}, s3 mode (s)",
            "s",
            forks,
            f"plain client: {files} server-side copies, {COPY_CONCURRENCY} in flight",
            floors,
            goal="ratio ≤ 1.2 or ≤ 1 s; fork_api_bytes ≪ bytes (metadata only)",
            **keys_out,
        ),
        Figure.of(
            f"snapshot of a conversation of {label}, s3 mode (s)",
            "s",
            snaps,
            f"download-and-upload copy of the same {files} files",
            baselines,
            **keys_out,
        ),
    ]
