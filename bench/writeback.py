"""The write-back of many small outputs (a part of ``python -m bench storage``).

One execution writes 2,000 small files into ``outputs/`` in s3 mode; it answers once
every one is in the store. Figures, each beside a baseline of the same run:
- its time until it answers (``writeback_2000_seconds``) against a plain client (obstore)
  putting the same 2,000 objects with the same parallelism as the write-back
  (``WRITE_BACK_CONCURRENCY``) to the same bucket (``writeback_floor_seconds``) — goal
  ≤ 1.5× that floor;
- another user's request latency meanwhile (``GET …/workspace/{cid}``, seed 003's
  listing, which reads that user's metadata from the store) against the same requests
  with nothing else running (``writeback_neighbour_p99_ms`` and
  ``writeback_neighbour_baseline_p99_ms``) — goal p99 ≤ +100 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import httpx

from api.backends.store_writeback import WRITE_BACK_CONCURRENCY
from sandbox_workspace.store import S3Store

from .harness import Figure, dev_server

FILES = 2000
WRITE = (
    f"for i in range({FILES}):\n    open(f'outputs/f{{i:04}}.txt', 'w').write('x' * 100 + str(i))\n"
)


async def _plain_puts(store: S3Store, prefix: str) -> float:
    gate = asyncio.Semaphore(WRITE_BACK_CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            await store.put(f"{prefix}f{i:04}.txt", b"x" * 100 + str(i).encode())

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(FILES)))
    return time.perf_counter() - start


async def _count(store: S3Store, prefix: str) -> int:
    return sum([1 async for _ in store.list(prefix)])


class _Neighbour:
    """Another user's requests in a loop on a thread of its own, latencies in ms."""

    def __init__(self, base: str, path: str) -> None:
        self.client = httpx.Client(base_url=base, headers={"X-User-Id": "nb"}, timeout=120)
        self.path = path
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            r = self.client.get(self.path)
            assert r.status_code == 200, r.text
            self.samples.append((time.perf_counter() - start) * 1000)
            time.sleep(0.02)

    def __enter__(self) -> _Neighbour:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def run(env: dict[str, str], store: S3Store, quick: bool) -> list[Figure]:
    rounds = 1 if quick else 3
    spans, floors, busy, idle = [], [], [], []
    with (
        dev_server(**env) as server,
        httpx.Client(base_url=server.url, headers={"X-User-Id": "wb"}, timeout=900) as api,
    ):
        url = "/api/v1/sessions/sb-session-wb"
        api.post("/api/v1/sessions", json={})
        with httpx.Client(base_url=server.url, headers={"X-User-Id": "nb"}) as nb:
            nb.post("/api/v1/sessions", json={})
            seed = "/api/v1/sessions/sb-session-nb/workspace/nc"
            up = nb.post(
                "/api/v1/sessions/sb-session-nb/files/upload",
                files={"file": ("n.txt", b"neighbour")},
                data={"conversation_id": "nc"},
            )
            assert up.status_code == 201, up.text
        for n in range(rounds):
            cid = f"wb-{n}"
            warm = {"conversation_id": cid, "language": "python", "code": "1"}
            r = api.post(f"{url}/execute", json=warm)
            assert r.status_code == 200, r.text  # warm: the kernel of this conversation
            with _Neighbour(server.url, seed) as neighbour:
                time.sleep(2)
            idle += neighbour.samples
            with _Neighbour(server.url, seed) as neighbour:
                start = time.perf_counter()
                body = {"conversation_id": cid, "language": "python", "code": WRITE}
                r = api.post(f"{url}/execute", json=body)
                spans.append(time.perf_counter() - start)
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            busy += neighbour.samples
            prefix = f"workspaces/default/sb-session-wb/{cid}/outputs/"
            stored = asyncio.run(_count(store, prefix))
            assert stored == FILES, f"{stored} of {FILES} outputs in the store"
            floors.append(asyncio.run(_plain_puts(store, f"plain/wb-{n}/")))
    keys = {
        "writeback_2000_seconds": round(statistics.median(spans), 3),
        "writeback_floor_seconds": round(statistics.median(floors), 3),
        "writeback_neighbour_p99_ms": round(Figure.of("", "", busy, "", busy).p99, 1),
        "writeback_neighbour_baseline_p99_ms": round(Figure.of("", "", idle, "", idle).p99, 1),
    }
    return [
        Figure.of(
            f"execution writing {FILES} small outputs, until all are stored (s)",
            "s",
            spans,
            f"plain S3 PUT of the same {FILES} objects, {WRITE_BACK_CONCURRENCY} in flight",
            floors,
            goal="ratio ≤ 1.5",
            **keys,
        ),
        Figure.of(
            "another user's GET …/workspace/{cid} during that write-back (ms)",
            "ms",
            busy,
            "the same requests, nothing else running",
            idle,
            goal="p99 ≤ baseline p99 + 100 ms",
            **keys,
        ),
    ]
