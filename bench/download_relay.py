"""What relaying a download costs: one SeaweedFS object through a relay process, by method.

``python -m bench.download_relay [--rounds N] [MODE ...]`` — not a suite of ``make bench``;
the measurement behind the object store's download analysis in docs/performance.md.
Each relay is a process of its own on loopback that answers any GET with one 256 MB
object of a real SeaweedFS (tests/support/seaweedfs.py), read by the same client as the
plain GET (obstore, 1 MiB chunks), rounds alternating relays and the plain GET. Modes:

- ``rw``: blocking sockets, HTTP/1.1 to a presigned URL, ``recv_into`` a 1 MiB buffer and
  ``sendall`` — a copy-through relay with nothing else in it;
- ``splice``: the same, the body moved store socket → pipe (1 MiB) → client socket with
  ``os.splice`` (``SPLICE_F_MOVE | SPLICE_F_MORE``): no copy through user space;
- ``obstore_rw``: blocking client socket, the store read with obstore's synchronous
  stream (1 MiB chunks), each chunk ``sendall`` as it is (no copy in Python);
- ``uv_raw``: uvicorn (uvloop, httptools) and a pure ASGI app, the store read with an
  asyncio stream (1 MiB reads), each chunk sent as an ASGI body message;
- ``uv_sock``: the same app, the store read with ``loop.sock_recv_into`` on a raw
  non-blocking socket into a new 1 MiB ``bytearray`` per chunk (no asyncio stream buffer);
- ``uv_obstore``: the same app reading the store as the API does (``S3Store.get``:
  obstore, 1 MiB chunks, a ``bytes`` copy of each).

Per download: MB/s, and the CPU seconds (user + system, every thread, ``/proc/PID/stat``)
of the relay, the store and the client process. Results:
``bench/results/download_relay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import obstore
from obstore.store import HTTPStore

from .harness import cpu_seconds, record_run

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "download_relay.json"
MODES = ("rw", "splice", "obstore_rw", "uv_raw", "uv_sock", "uv_obstore")
SIZE = 256 << 20
CHUNK = 1 << 20
KEY = "relay/0.bin"


def _length(head: bytes) -> int:
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no Content-Length: {head[:200]!r}")


def _s3_store():
    """The obstore client under the project's ``S3Store``, for the relay's settings."""
    from sandbox_workspace.store import S3Settings, S3Store

    return S3Store(S3Settings(**json.loads(os.environ["RELAY_S3"])))._store


def _serve_blocking(mode: str, port: int, signed: str) -> None:
    url = urlsplit(signed)
    request = f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        client, _ = listener.accept()
        got = received = client.recv(65536)
        while got and b"\r\n\r\n" not in received:
            got = client.recv(65536)
            received += got
        if not got:  # the parent's probe for the port
            client.close()
            continue
        if mode == "obstore_rw":
            result = obstore.get(_s3_store(), KEY)
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % result.meta["size"])
            for chunk in result.stream(min_chunk_size=CHUNK):
                client.sendall(chunk)
            client.close()
            continue
        store = socket.create_connection((url.hostname, url.port))
        store.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            head += store.recv(65536)
        head, rest = head.split(b"\r\n\r\n", 1)
        length = _length(head)
        client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + rest)
        left = length - len(rest)
        if mode == "rw":
            buffer = memoryview(bytearray(CHUNK))
            while left:
                n = store.recv_into(buffer[: min(left, CHUNK)])
                assert n, "the store closed early"
                client.sendall(buffer[:n])
                left -= n
        else:
            r, w = os.pipe()
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)  # 64 KiB by default
            flags = os.SPLICE_F_MOVE | os.SPLICE_F_MORE
            while left:
                n = os.splice(store.fileno(), w, min(left, CHUNK), flags=flags)
                assert n, "the store closed early"
                left -= n
                while n:
                    n -= os.splice(r, client.fileno(), n, flags=flags)
            os.close(r)
            os.close(w)
        store.close()
        client.close()


def _asgi_app(mode: str, signed: str, s3: dict):
    url = urlsplit(signed)
    request = f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()
    stores: list = []

    def start(length: int) -> dict:
        headers = [(b"content-length", str(length).encode())]
        return {"type": "http.response.start", "status": 200, "headers": headers}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if mode == "uv_raw":
            reader, writer = await asyncio.open_connection(url.hostname, url.port, limit=CHUNK)
            writer.write(request)
            left = _length(await reader.readuntil(b"\r\n\r\n"))
            await send(start(left))
            while left:
                chunk = await reader.read(min(left, CHUNK))
                assert chunk, "the store closed early"
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": bool(left)})
            writer.close()
            return
        if mode == "uv_sock":
            loop = asyncio.get_running_loop()
            store = socket.create_connection((url.hostname, url.port))
            store.setblocking(False)
            await loop.sock_sendall(store, request)
            head = b""
            while b"\r\n\r\n" not in head:
                head += await loop.sock_recv(store, 65536)
            head, rest = head.split(b"\r\n\r\n", 1)
            left = _length(head)
            await send(start(left))
            await send({"type": "http.response.body", "body": rest, "more_body": True})
            left -= len(rest)
            while left:
                chunk = bytearray(min(left, CHUNK))
                n = await loop.sock_recv_into(store, chunk)
                assert n, "the store closed early"
                left -= n
                body = memoryview(chunk)[:n] if n < len(chunk) else chunk
                await send({"type": "http.response.body", "body": body, "more_body": bool(left)})
            store.close()
            return
        from sandbox_workspace.store import S3Settings, S3Store

        if not stores:
            stores.append(S3Store(S3Settings(**s3)))
        download = await stores[0].get(KEY)
        await send(start(download.info.size))
        async for chunk in download:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def serve(mode: str, port: int, signed: str) -> None:
    if mode in ("rw", "splice", "obstore_rw"):
        _serve_blocking(mode, port, signed)
        return
    import uvicorn

    app = _asgi_app(mode, signed, json.loads(os.environ["RELAY_S3"]))
    uvicorn.run(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"relay exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"no relay on port {port}")


def measure(modes: list[str], rounds: int, size: int = SIZE) -> dict:
    sys.path[:0] = [str(REPO / "tests" / "support")]
    from seaweedfs import start_seaweedfs

    from sandbox_workspace.store import S3Store

    work = Path(tempfile.mkdtemp(prefix="sbw-bench-relay-"))
    server = start_seaweedfs(work / "seaweedfs")
    relays: dict[str, tuple[int, subprocess.Popen]] = {}
    try:
        server.make_bucket("bench")
        settings = server.settings("bench")
        store = S3Store(settings)
        block = os.urandom(CHUNK)

        async def chunks():
            for _ in range(size // CHUNK):
                yield block

        asyncio.run(store.put(KEY, chunks()))
        signed = obstore.sign(store._store, "GET", KEY, timedelta(hours=1))
        s3 = {
            "endpoint_url": server.endpoint,
            "bucket": "bench",
            "region": server.region,
            "access_key_id": server.access_key,
            "secret_access_key": server.secret_key,
        }
        for mode in modes:
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.download_relay", "--serve", mode, str(port), signed],
                cwd=REPO,
                env={**os.environ, "RELAY_S3": json.dumps(s3)},
            )
            relays[mode] = (port, proc)
            _wait_for(port, proc, time.monotonic() + 30)
        pids = {"store": server.proc.pid, "client": os.getpid()}

        async def one(source, key: str, relay_pid: int | None) -> dict:
            procs = {**pids, "relay": relay_pid} if relay_pid else pids
            before = {name: cpu_seconds(pid) for name, pid in procs.items()}
            start = time.perf_counter()
            result = await obstore.get_async(source, key)
            got = sum([len(c) async for c in result.stream(min_chunk_size=CHUNK)])
            seconds = time.perf_counter() - start
            assert got == size, got
            return {
                "mb_s": size / CHUNK / seconds,
                **{f"cpu_{name}": cpu_seconds(pid) - before[name] for name, pid in procs.items()},
            }

        async def run() -> dict:
            clients = {
                mode: HTTPStore.from_url(
                    f"http://127.0.0.1:{port}",
                    client_options={"allow_http": True, "timeout": timedelta(minutes=10)},
                )
                for mode, (port, _) in relays.items()
            }
            samples: dict[str, list[dict]] = {mode: [] for mode in [*modes, "plain"]}
            for n in range(rounds + 1):  # round 0 warms connections and caches
                for mode, (_, proc) in relays.items():
                    sample = await one(clients[mode], "any", proc.pid)
                    if n:
                        samples[mode].append(sample)
                sample = await one(store._store, KEY, None)
                if n:
                    samples["plain"].append(sample)
            return samples

        samples = asyncio.run(run())
    finally:
        for _, proc in relays.values():
            proc.kill()
            proc.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)  # the store's data: each round's objects
    plain = [s["mb_s"] for s in samples["plain"]]
    summary = {}
    for mode, rows in samples.items():
        summary[mode] = {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
        if mode != "plain":
            ratios = [r["mb_s"] / p for r, p in zip(rows, plain, strict=True)]
            summary[mode]["ratio"] = round(statistics.median(ratios), 3)
            summary[mode]["ratio_per_round"] = sorted(round(x, 3) for x in ratios)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.download_relay")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--serve", nargs=3, metavar=("MODE", "PORT", "URL"), help=argparse.SUPPRESS)
    parser.add_argument("--size-mb", type=int, default=SIZE // CHUNK)
    parser.add_argument("modes", nargs="*", help=f"any of {', '.join(MODES)} (default: all)")
    args = parser.parse_args(argv)
    if set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s) {sorted(set(args.modes) - set(MODES))}; choose from {MODES}")
    if args.serve:
        mode, port, url = args.serve
        serve(mode, int(port), url)
        return 0
    record_run(
        RESULTS,
        args.size_mb == SIZE // CHUNK,  # a smaller object is a smoke test, not the figure
        lambda: measure(args.modes or list(MODES), args.rounds, args.size_mb * CHUNK),
        size_mb=args.size_mb,
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
