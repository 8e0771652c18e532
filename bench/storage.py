"""The object store mode (SANDBOX_WORKSPACE_STORE=s3) against a real SeaweedFS.

Figures, each beside a baseline measured in the same run on the same server:
- upload and download throughput through the API (upload: until the answer, which comes
  after the file is in the store; download: by file_id, from the store) against a plain
  S3 client (obstore) moving the same bytes to the same bucket — goal ratio ≥ 0.8.
  The upload is also set beside a presigned PUT by its own client (httpx, the API's
  uploads alternating with the PUTs), so that ratio is the API's cost, not the clients'.
  The uploads run twice: with the store's default signing (an http:// endpoint: every
  body's SHA-256 in the signature, on both sides) and with the payload unsigned on both
  sides (``SANDBOX_WORKSPACE_S3__SIGN_PAYLOAD=false``, a trusted in-cluster network).
  Uploads and downloads are also measured with the API and its runtime pinned to one
  core and the store and the client to the other (``_pinned``): the shape of a cluster,
  where the API's pod has CPU of its own — the shared-core figures are the API's cost on
  a machine where every process competes for two cores.
  The download is read the same way on both sides, so the ratio is the API's cost and
  not the clients': obstore's Rust HTTP client (``HTTPStore`` on the API's URL, the
  ``S3Store`` on the bucket), 1 MiB chunks, one warm-up each, then alternating rounds
  (API, plain, API, …) so the machine's load swings hit both alike; the CPU each process
  spent per download is kept beside it. A Python client (httpx, 64 KiB reads) is
  measured too, both ways (the API and a presigned GET on the store), as a second view:
  under load it reads slower than either server sends, on a quiet machine it does not;
- resume of a conversation of 100 files / 100 MB after the cache is lost (a new API with
  an empty data directory, the same bucket) until the first execution sees them all,
  against a cold first execution in an empty conversation;
- write-back: an execution writing a 1 MB output, end to end in s3 mode (the answer comes
  once the output is in the store) against the same execution in local mode; the
  difference is the time from the end of the execution to its output being stored;
- write-back of 2,000 small outputs against a plain client's 2,000 PUTs, and another
  user's latency meanwhile (``bench.writeback``);
- fork and snapshot of a conversation of 1,000 files / 1 GB, beside a plain client's
  server-side copies and a download-and-upload copy (``bench.forks``).
Results: ``bench/results/storage.json`` (``storage-quick.json`` in quick mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import obstore
from obstore.store import HTTPStore

from . import forks, writeback
from .harness import Figure, cpu_seconds, dev_server, runtime_pid

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "support")]
from seaweedfs import missing_reason, start_seaweedfs  # noqa: E402

from sandbox_workspace.store import S3Store  # noqa: E402

CHUNK = 1024 * 1024
RESULTS = REPO / "bench" / "results" / "storage.json"
LIMITS = {
    "max_file_size": 2,
    "max_file_size_unit": "GB",
    "max_file_count": 200,
    "allowed_file_types": [],
}


def _mb_per_s(size: int, seconds: float) -> float:
    return size / CHUNK / seconds


def _plain_put(store: S3Store, source: Path, size: int, key: str) -> float:
    """One PUT of ``source`` by the plain S3 client (obstore, 1 MiB reads of the file as
    the body's chunks; multipart as the API's store write is) (MB/s)."""

    async def chunks():
        f = await asyncio.to_thread(open, source, "rb")
        with f:
            while chunk := await asyncio.to_thread(f.read, CHUNK):
                yield chunk

    async def measure():
        start = time.perf_counter()
        await store.put(key, chunks())
        return _mb_per_s(size, time.perf_counter() - start)

    return asyncio.run(measure())


async def _read_all(result) -> int:
    return sum([len(c) async for c in result.stream(min_chunk_size=CHUNK)])


def _downloads(
    store: S3Store, api: HTTPStore, path: str, size: int, rounds: int, pids: dict[str, int]
) -> tuple[list, list, dict]:
    """``rounds`` downloads of the API's ``path`` and of the plain object ``plain/0.bin``
    (the same bytes), alternating, with the same client and chunking on both sides. Also
    the CPU seconds each process spent per download (p50): on a shared 2-core machine the
    API's own CPU is what the path through it costs on top of the store's and the client's.
    """
    cpu: dict[str, dict[str, list[float]]] = {"warm": {}, "via_api": {}, "plain": {}}

    async def timed(side: str, source, key: str) -> float:
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        start = time.perf_counter()
        got = await _read_all(await obstore.get_async(source, key))
        seconds = time.perf_counter() - start
        assert got == size, got
        for name, pid in pids.items():
            cpu[side].setdefault(name, []).append(cpu_seconds(pid) - before[name])
        return _mb_per_s(size, seconds)

    async def measure():
        # Warm-up: connections, first reads.
        await timed("warm", api, path), await timed("warm", store._store, "plain/0.bin")
        through, plain = [], []
        for _ in range(rounds):
            through.append(await timed("via_api", api, path))
            plain.append(await timed("plain", store._store, "plain/0.bin"))
        return through, plain

    through, plain = asyncio.run(measure())
    medians = {
        f"cpu_s_{side}": {name: round(statistics.median(v), 3) for name, v in per.items()}
        for side, per in cpu.items()
        if side != "warm"
    }
    return through, plain, medians


def _httpx_plain_put(store: S3Store, source: Path, size: int, n: int) -> float:
    """A PUT of ``source`` straight to the store by the client the API's uploads are
    measured with (httpx, streaming the file in its own 64 KiB reads; a presigned URL):
    the same client both ways, as the downloads are compared (MB/s)."""
    key = f"plain/httpx-{n}.bin"
    signed = obstore.sign(store._store, "PUT", key, timedelta(hours=1))
    with open(source, "rb") as f, httpx.Client(timeout=600) as client:
        start = time.perf_counter()
        r = client.put(signed, content=f, headers={"Content-Length": str(size)})
        seconds = time.perf_counter() - start
    assert r.status_code == 200, r.text[:300]
    return _mb_per_s(size, seconds)


def _uploads(
    api_server, api, seed, server, store, source, size, repeat, tag="", same_client=True
) -> tuple:
    """``repeat`` uploads of ``source`` through the API's ``seed`` conversation, each
    followed by a plain PUT of the same bytes with ``store``'s client and (``same_client``)
    a presigned PUT with httpx (the machine's swings hit all alike); the CPU each process
    spent on the API's and on the plain PUTs. Answers (API MB/s, plain MB/s, httpx MB/s, CPU, the
    last upload's answer)."""
    puts: list[float] = []
    uploads, httpx_puts = [], []
    r = None
    runtime = runtime_pid(api_server.data_dir)  # the session's, started by the API
    cpu_of = {
        "api_and_runtime": lambda: cpu_seconds(api_server.pid) + cpu_seconds(runtime),
        "store": lambda: cpu_seconds(server.proc.pid),
        "client": lambda: cpu_seconds(os.getpid()),
    }
    upload_cpu: dict[str, dict[str, list[float]]] = {"via_api": {}, "plain": {}}

    def cpu_now() -> dict[str, float]:
        return {name: read() for name, read in cpu_of.items()}

    def cpu_since(side: str, before: dict[str, float]) -> None:
        for name, spent in cpu_now().items():
            upload_cpu[side].setdefault(name, []).append(spent - before[name])

    for n in range(repeat):
        if r is not None:
            # The conversation's quota (512 MiB) holds two such files, not three.
            gone = api.delete(f"{seed}/files/{r.json()['file_id']}")
            assert gone.status_code == 200, gone.text
        with open(source, "rb") as f:
            before = cpu_now()
            start = time.perf_counter()
            # A new name each time: the same bytes again under one name would
            # be recognised as unchanged and not copied to the store again.
            r = api.post(f"{seed}/files", files={"file": (f"big{tag}-{n}.bin", f)})
            uploads.append(_mb_per_s(size, time.perf_counter() - start))
            cpu_since("via_api", before)
        assert r.status_code == 201, r.text
        # The plain PUTs right after, each round: the machine's swings hit both.
        before = cpu_now()
        puts.append(_plain_put(store, source, size, f"plain/{tag}{n}.bin"))
        cpu_since("plain", before)
        if same_client:
            httpx_puts.append(_httpx_plain_put(store, source, size, n))
    return uploads, puts, httpx_puts, upload_cpu, r


@contextlib.contextmanager
def _pinned(api_pids: set[int], other_pids: set[int]) -> Iterator[None]:
    """CPU 1 for ``api_pids``; CPU 0 for ``other_pids`` and this process (the client);
    every thread of each (threads made later inherit their maker's); all CPUs again
    afterwards."""
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        yield  # one core: nothing to separate
        return
    first, second = sorted(everything)[:2]

    def pin(pids: set[int], cpus: set[int]) -> None:
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(tid), cpus)

    pin(other_pids | {os.getpid()}, {first})
    pin(api_pids, {second})
    try:
        yield
    finally:
        pin(api_pids | other_pids | {os.getpid()}, everything)


def _upload_figures(
    label, variant, uploads, puts, httpx_puts, upload_cpu, *, signing
) -> list[Figure]:
    """The upload against the plain PUT by the store's client (with the same signing)
    and, when measured, against a presigned PUT by the API's own client (httpx)."""
    signs = "signed" if signing.signs_payload() else "unsigned"
    figures = [
        Figure.of(
            f"upload {label} via API, s3 mode{variant} (MB/s)",
            "MB/s",
            uploads,
            f"plain S3 PUT (obstore, payload {signs})",
            puts,
            goal="ratio ≥ 0.8",
            client="httpx to the API, obstore to the store; alternating rounds",
            **{
                f"cpu_s_{side}": {k: round(statistics.median(v), 3) for k, v in per.items()}
                for side, per in upload_cpu.items()
            },
            ratio_per_round=[round(a / b, 3) for a, b in zip(uploads, puts, strict=True)],
        )
    ]
    if httpx_puts:  # measured beside them
        figures.append(
            Figure.of(
                f"upload {label} via API{variant}, httpx client (MB/s)",
                "MB/s",
                uploads,
                "presigned S3 PUT, same httpx client",
                httpx_puts,
                client="httpx (Python) both ways, alternating rounds",
                ratio_per_round=[round(a / b, 3) for a, b in zip(uploads, httpx_puts, strict=True)],
            )
        )
    return figures


def _httpx_downloads(
    api: httpx.Client, path: str, signed: str, size: int, rounds: int
) -> tuple[list, list]:
    """The same comparison with a Python client (httpx; its transport reads 64 KiB per
    call): the API against a presigned GET of the plain object straight from the store."""

    def one(client: httpx.Client, url: str) -> float:
        start = time.perf_counter()
        with client.stream("GET", url) as got:
            received = sum(len(c) for c in got.iter_raw(CHUNK))
        assert received == size, received
        return _mb_per_s(size, time.perf_counter() - start)

    with httpx.Client(timeout=600) as plain_client:
        one(api, path), one(plain_client, signed)  # warm-up
        through, plain = [], []
        for _ in range(rounds):
            through.append(one(api, path))
            plain.append(one(plain_client, signed))
    return through, plain


def _session(api: httpx.Client, user: str) -> str:
    api.post("/api/v1/sessions", json={"config": {"file_upload_config": LIMITS}})
    return f"/api/v1/sessions/sb-session-{user}"


def _execute(api: httpx.Client, url: str, code: str, cid: str) -> dict:
    r = api.post(
        f"{url}/execute", json={"conversation_id": cid, "language": "python", "code": code}
    )
    assert r.status_code == 200, r.text
    return r.json()


def run(quick: bool) -> list[Figure]:
    reason = missing_reason()
    if reason:
        print(f"storage: skipped — {reason}", flush=True)
        return []
    size = (16 if quick else 256) * CHUNK
    repeat = 2 if quick else 5  # two in quick mode too: the delete between rounds runs
    rounds = 2 if quick else 9
    files, resumes = (20, 2) if quick else (100, 5)
    figures: list[Figure] = []
    work = Path(tempfile.mkdtemp(prefix="sbw-bench-storage-"))
    server = start_seaweedfs(work / "seaweedfs")
    try:
        server.make_bucket("bench")
        env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **server.env("bench")}
        source = work / "source.bin"
        with open(source, "wb") as f:
            for i in range(size // CHUNK):
                f.write(os.urandom(CHUNK) if i == 0 else bytes([i % 256]) * CHUNK)
        store = S3Store(server.settings("bench"))
        _plain_put(store, source, size, "plain/warm-up")  # the server's first write allocates
        # The obstore client under S3Store: the plain side reads as the API's side does
        # (no S3Store wrapper, no copy of each chunk), and it signs the httpx client's GET.
        signed = obstore.sign(store._store, "GET", "plain/0.bin", timedelta(hours=1))

        with (
            dev_server(**env) as api_server,
            httpx.Client(base_url=api_server.url, headers={"X-User-Id": "b"}, timeout=600) as api,
        ):
            url = _session(api, "b")
            seed = url + "/workspace/t"
            api.get(seed)  # running
            uploads, puts, httpx_puts, upload_cpu, r = _uploads(
                api_server, api, seed, server, store, source, size, repeat
            )
            path = f"{seed}/files/{r.json()['file_id']}"
            rust_api = HTTPStore.from_url(
                api_server.url,
                client_options={
                    "allow_http": True,
                    "default_headers": {"X-User-Id": "b"},
                    "timeout": timedelta(minutes=10),
                },
            )
            pids = {"api": api_server.pid, "store": server.proc.pid, "client": os.getpid()}
            downloads, gets, cpu = _downloads(store, rust_api, path.lstrip("/"), size, rounds, pids)
            slow, slow_plain = _httpx_downloads(api, path, signed, size, max(1, rounds // 3))
            # Again with the API and its runtime on a core of their own, the store and the
            # client on the other — the shape of a cluster, where the API's pod (and the
            # sandbox's) has CPU of its own: does the API slow a transfer then?
            with _pinned({api_server.pid, runtime_pid(api_server.data_dir)}, {server.proc.pid}):
                pinned_down = _downloads(
                    store, rust_api, path.lstrip("/"), size, max(3, rounds // 2), pids
                )
                # The quota (512 MiB) holds one such file beside the one being uploaded.
                assert api.delete(path).status_code == 200
                pinned_up = _uploads(
                    *(api_server, api, seed, server, store, source, size, max(2, repeat - 2)),
                    tag="-p",
                    same_client=False,
                )
        label = f"{size // CHUNK} MB"
        figures += _upload_figures(
            label, "", uploads, puts, httpx_puts, upload_cpu, signing=store.settings
        )
        pinned = ", API on its own core"
        figures += _upload_figures(label, pinned, *pinned_up[:4], signing=store.settings)
        through, plain, pinned_cpu = pinned_down
        figures.append(
            Figure.of(
                f"download {label} by file_id, s3 mode{pinned} (MB/s)",
                "MB/s",
                through,
                "plain S3 GET (obstore)",
                plain,
                goal="ratio ≥ 0.8",
                client="obstore (Rust) both ways, alternating rounds",
                **pinned_cpu,
                ratio_per_round=sorted(
                    round(a / b, 3) for a, b in zip(through, plain, strict=True)
                ),
            )
        )
        # The same with the payload unsigned on both sides (store.s3.signPayload=false:
        # a trusted in-cluster network), fewer rounds: what the signing's SHA-256 costs.
        unsigned = {**env, "SANDBOX_WORKSPACE_S3__SIGN_PAYLOAD": "false"}
        plain_unsigned = S3Store(server.settings("bench", sign_payload=False))
        with (
            dev_server(**unsigned) as api_server,
            httpx.Client(base_url=api_server.url, headers={"X-User-Id": "u"}, timeout=600) as api,
        ):
            seed = _session(api, "u") + "/workspace/t"
            api.get(seed)  # running
            measured = _uploads(
                api_server, api, seed, server, plain_unsigned, source, size, max(2, repeat - 2)
            )
        figures += _upload_figures(
            label, ", payload unsigned", *measured[:4], signing=plain_unsigned.settings
        )
        figures.append(
            Figure.of(
                f"download {label} by file_id, s3 mode (MB/s)",
                "MB/s",
                downloads,
                "plain S3 GET (obstore)",
                gets,
                goal="ratio ≥ 0.8",
                client="obstore (Rust) both ways, alternating rounds",
                **cpu,
                ratio_per_round=sorted(
                    round(a / b, 3) for a, b in zip(downloads, gets, strict=True)
                ),
            )
        )
        figures.append(
            Figure.of(
                f"download {label} by file_id, httpx client (MB/s)",
                "MB/s",
                slow,
                "presigned S3 GET, same httpx client",
                slow_plain,
                client="httpx (Python) both ways, alternating rounds",
            )
        )

        # A conversation of `files` × 1 MB, then a new API with an empty cache each time.
        with (
            dev_server(**env) as api_server,
            httpx.Client(base_url=api_server.url, headers={"X-User-Id": "r"}, timeout=600) as api,
        ):
            url = _session(api, "r")
            for i in range(files):
                body = bytes([i % 256]) * CHUNK
                r = api.post(
                    f"{url}/files/upload",
                    files={"file": (f"f{i:03}.csv", body)},
                    data={"conversation_id": "big"},
                )
                assert r.status_code == 201, r.text
        count = "import os; print(len(os.listdir('uploads/temparea')))"
        fills, colds = [], []
        for n in range(resumes):
            with (
                dev_server(**env) as api_server,
                httpx.Client(
                    base_url=api_server.url, headers={"X-User-Id": "r"}, timeout=600
                ) as api,
            ):
                url = _session(api, "r")
                start = time.perf_counter()
                result = _execute(api, url, count, "big")
                fills.append((time.perf_counter() - start) * 1000)
                assert result["stdout"].strip() == str(files), result
                start = time.perf_counter()
                _execute(api, url, "print(1)", f"empty-{n}")
                colds.append((time.perf_counter() - start) * 1000)
        figures.append(
            Figure.of(
                f"first execution after cache loss, {files} files / {files} MB (ms)",
                "ms",
                fills,
                "first execution, empty conversation",
                colds,
            )
        )

        # Write-back of a 1 MB output: s3 mode against local mode, same code.
        code = "open('outputs/o.bin','wb').write(os.urandom(1<<20))"
        code = "import os; " + code
        runs = 5 if quick else 30
        timings: dict[str, list[float]] = {}
        for mode, mode_env in (("s3", env), ("local", {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none"})):
            with (
                dev_server(**mode_env) as api_server,
                httpx.Client(
                    base_url=api_server.url, headers={"X-User-Id": "w"}, timeout=600
                ) as api,
            ):
                url = _session(api, "w")
                _execute(api, url, "print(1)", "wb")  # warm: session, kernel
                timings[mode] = []
                for _ in range(runs):
                    start = time.perf_counter()
                    _execute(api, url, code, "wb")
                    timings[mode].append((time.perf_counter() - start) * 1000)
        figures.append(
            Figure.of(
                "execution writing 1 MB, until its output is stored (ms)",
                "ms",
                timings["s3"],
                "same execution, local mode",
                timings["local"],
            )
        )
        figures += writeback.run(env, store, quick)
        figures += forks.run(env, store, quick)
    finally:
        server.stop()
        # The store's data (several GB in a full run: the forks' and the plain copies'
        # objects) and the source file go with it: a bench leaves no bucket behind.
        shutil.rmtree(work, ignore_errors=True)
    results = RESULTS.with_name("storage-quick.json") if quick else RESULTS
    results.parent.mkdir(exist_ok=True)
    results.write_text(
        json.dumps([{**f.__dict__, "ratio": round(f.ratio, 3)} for f in figures], indent=2) + "\n"
    )
    return figures
