"""The floor of an upload through the API: what a relay doing only the upload contract's
mandatory work reaches beside a plain S3 PUT of the same bytes to the same SeaweedFS.

``python -m bench.upload_floor [--rounds N] [--size-mb M] [MODE ...]`` — not a suite of
``make bench``. Issue 21's goal is an upload through the API at ≥ 0.8 of a plain PUT; the
API reaches ~0.65–0.72 (``bench storage``). Its contract forces work a plain PUT does not
do: receive a multipart/form-data body, hash the file (SHA-256), write it to the object
store and send it to the sandbox runtime, which writes it to a local file (the cache).
This measures how close a relay with nothing else in it — its own process on loopback,
blocking sockets, ``recv_into`` a 1 MiB buffer and ``sendall`` — comes to the plain PUT
on this machine, adding one piece of that work at a time:

- ``plain``: the baseline, always measured — the client PUTs straight to SeaweedFS;
- ``relay``: client → relay → store (one hop);
- ``tee``: the relay also sends each chunk to the cache sink and answers once the store
  and the sink both have the file;
- ``tee_sha``: and ``hashlib.sha256().update`` of each chunk;
- ``tee_sha_form``: and the client sends a multipart/form-data body (one ``file`` part),
  which the relay parses with python_multipart's ``MultipartParser`` as the API must.

Every store write is one PUT with Content-Length to a presigned URL (``obstore.sign`` on
the store under ``S3Store``); the relay knows the file's size from the request's
Content-Length (minus the form's fixed overhead). The cache sink is one more process:
``recv_into``, ``os.write`` to a file under a temp directory, ``fsync``, then its answer.
The client is the same for every mode (a raw socket, the file read in 1 MiB pieces); the
bytes are ``bench storage``'s (the first MiB random, then ``bytes([i % 256]) * 1 MiB``).
Rounds pair each mode with a plain PUT, in alternating order, after a discarded warm-up
round. Per mode: median MB/s, the ratio to the plain PUT of its pair (median and per
round) and the CPU seconds per upload (user + system, ``/proc/PID/stat``) of the client,
the relay, the cache sink and SeaweedFS. Results: ``bench/results/upload_floor.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
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

from .harness import cpu_seconds, record_run

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "upload_floor.json"
RELAYS = ("relay", "tee", "tee_sha", "tee_sha_form")
MODES = ("plain", *RELAYS)
SIZE = 256 << 20
CHUNK = 1 << 20
BOUNDARY = b"sbw-upload-floor-5f0c9e"
# The client's one fixed form: the relay derives the file's size from it (the store PUT
# needs its Content-Length before the first byte of the file).
PREAMBLE = (
    b"--" + BOUNDARY + b"\r\n"
    b'Content-Disposition: form-data; name="file"; filename="floor.bin"\r\n'
    b"Content-Type: application/octet-stream\r\n\r\n"
)
EPILOGUE = b"\r\n--" + BOUNDARY + b"--\r\n"


def _head(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The HTTP head read from ``sock`` and the bytes after it; None if it closed first."""
    received = b""
    while b"\r\n\r\n" not in received:
        got = sock.recv(65536)
        if not got:
            return None
        received += got
    head, rest = received.split(b"\r\n\r\n", 1)
    return head, rest


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _response(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and body of the response on ``sock`` (its Content-Length's worth)."""
    got = _head(sock)
    assert got, "closed before answering"
    head, body = got
    left = _length(head) - len(body)
    while left > 0:
        more = sock.recv(left)
        assert more, "closed mid-answer"
        body += more
        left -= len(more)
    return head.split(b"\r\n", 1)[0], body


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            return data
        data += got
    return data


def serve_relay(mode: str, port: int, signed: str, sink_port: int) -> None:
    url = urlsplit(signed)
    put = f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
    listener = socket.create_server(("127.0.0.1", port))
    buffer = bytearray(CHUNK)
    while True:
        client, _ = listener.accept()
        got = _head(client)
        if got is None:  # the parent's probe for the port
            client.close()
            continue
        store = socket.create_connection((url.hostname, url.port))
        cache = None if mode == "relay" else socket.create_connection(("127.0.0.1", sink_port))
        answer = _relay(mode, client, *got, store, put, cache, buffer)
        client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        for sock in (client, store, cache):
            if sock is not None:
                sock.close()


def _relay(mode, client, head: bytes, rest: bytes, store, put: str, cache, buffer) -> bytes:
    """One upload relayed: the body from ``client`` to ``store`` (and ``cache``), the answer
    (the file's SHA-256 in hex, or its size) once both have it."""
    form = mode == "tee_sha_form"
    length = _length(head)
    size = length - len(PREAMBLE) - len(EPILOGUE) if form else length
    store.sendall(f"{put}Content-Length: {size}\r\n\r\n".encode())
    if cache is not None:
        cache.sendall(size.to_bytes(8, "big"))
    digest = hashlib.sha256() if "sha" in mode else None
    sent = 0

    def forward(chunk) -> None:
        nonlocal sent
        store.sendall(chunk)
        if cache is not None:
            cache.sendall(chunk)
        if digest is not None:
            digest.update(chunk)
        sent += len(chunk)

    if form:
        from python_multipart.multipart import MultipartParser

        parser = MultipartParser(
            BOUNDARY, {"on_part_data": lambda data, s, e: forward(memoryview(data)[s:e])}
        )
        feed = parser.write
    else:
        feed = forward
    feed(rest)
    view = memoryview(buffer)
    left = length - len(rest)
    while left:
        n = client.recv_into(view[: min(left, CHUNK)])
        assert n, "the client closed early"
        # The parser needs a bytes-like with find(): the whole buffer as it is, or a copy
        # of a short read (an ASGI server hands over a bytes copy of every read anyway).
        feed(view[:n] if not form else buffer if n == CHUNK else bytes(view[:n]))
        left -= n
    if form:
        parser.finalize()
    assert sent == size, (sent, size)
    status, _ = _response(store)
    assert status.startswith(b"HTTP/1.1 200"), status
    if cache is not None:
        assert _recv_exactly(cache, 2) == b"ok", "the cache sink failed"
    return (digest.hexdigest() if digest else str(sent)).encode()


def serve_sink(port: int, directory: str) -> None:
    """The sandbox runtime's part: the file written to a local file, fsynced, then "ok"."""
    listener = socket.create_server(("127.0.0.1", port))
    view = memoryview(bytearray(CHUNK))
    path = os.path.join(directory, "cache.bin")
    while True:
        conn, _ = listener.accept()
        header = _recv_exactly(conn, 8)
        if len(header) < 8:  # the parent's probe for the port
            conn.close()
            continue
        left = int.from_bytes(header, "big")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        while left:
            n = conn.recv_into(view[: min(left, CHUNK)])
            assert n, "the relay closed early"
            written = 0
            while written < n:
                written += os.write(fd, view[written:n])
            left -= n
        os.fsync(fd)
        os.close(fd)
        conn.sendall(b"ok")
        conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "bench.upload_floor", *args], cwd=REPO)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{args[:2]} exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"nothing on port {port} for {args[:2]}")


def _upload(address: tuple[str, int], head: bytes, source: Path, prefix=b"", suffix=b"") -> bytes:
    """The client, alike for every mode: ``head`` and the file sent, the answer's body."""
    sock = socket.create_connection(address)
    sock.sendall(head + prefix)
    view = memoryview(bytearray(CHUNK))
    with open(source, "rb", buffering=0) as f:
        while n := f.readinto(view):
            sock.sendall(view[:n])
    if suffix:
        sock.sendall(suffix)
    status, body = _response(sock)
    sock.close()
    assert status.startswith(b"HTTP/1.1 200"), (status, body[:200])
    return body


def measure(modes: list[str], rounds: int, size: int = SIZE) -> dict:
    sys.path[:0] = [str(REPO / "tests" / "support")]
    from seaweedfs import start_seaweedfs

    from sandbox_workspace.store import S3Store

    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="sbw-bench-upload-floor-") as tmp:
        work = Path(tmp)
        source = work / "source.bin"
        digest = hashlib.sha256()
        with open(source, "wb") as f:
            for i in range(size // CHUNK):
                chunk = os.urandom(CHUNK) if i == 0 else bytes([i % 256]) * CHUNK
                digest.update(chunk)
                f.write(chunk)
        expected = digest.hexdigest().encode()
        (work / "cache").mkdir()
        server = start_seaweedfs(work / "seaweedfs")
        try:
            server.make_bucket("bench")
            store = S3Store(server.settings("bench"))._store

            def signed(key: str) -> str:
                return obstore.sign(store, "PUT", key, timedelta(hours=2))

            sink_port = _free_port()
            procs["sink"] = _start(["--sink", str(sink_port), str(work / "cache")], sink_port)
            targets: dict[str, tuple[tuple[str, int], bytes, bytes, bytes]] = {}
            url = urlsplit(signed("floor/plain.bin"))
            head = f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            head += f"Content-Length: {size}\r\n\r\n"
            targets["plain"] = ((url.hostname, url.port), head.encode(), b"", b"")
            for mode in modes:
                port = _free_port()
                args = ["--serve", mode, str(port), signed(f"floor/{mode}.bin"), str(sink_port)]
                procs[mode] = _start(args, port)
                if mode == "tee_sha_form":
                    length = len(PREAMBLE) + size + len(EPILOGUE)
                    kind = f"multipart/form-data; boundary={BOUNDARY.decode()}"
                    head = f"POST /upload HTTP/1.1\r\nHost: relay\r\nContent-Type: {kind}\r\n"
                    head += f"Content-Length: {length}\r\n\r\n"
                    targets[mode] = (("127.0.0.1", port), head.encode(), PREAMBLE, EPILOGUE)
                else:
                    head = f"PUT /upload HTTP/1.1\r\nHost: relay\r\nContent-Length: {size}\r\n\r\n"
                    targets[mode] = (("127.0.0.1", port), head.encode(), b"", b"")
            pids = {"client": os.getpid(), "store": server.proc.pid}

            def one(mode: str) -> dict:
                watched = dict(pids)
                if mode != "plain":
                    watched["relay"] = procs[mode].pid
                    if mode != "relay":
                        watched["sink"] = procs["sink"].pid
                before = {name: cpu_seconds(pid) for name, pid in watched.items()}
                start = time.perf_counter()
                answer = _upload(*targets[mode][:2], source, *targets[mode][2:])
                seconds = time.perf_counter() - start
                if "sha" in mode:
                    assert answer == expected, answer
                return {
                    "mb_s": size / CHUNK / seconds,
                    **{f"cpu_{n}": cpu_seconds(pid) - before[n] for n, pid in watched.items()},
                }

            samples: dict[str, list[tuple[dict, dict]]] = {mode: [] for mode in modes}
            for n in range(rounds + 1):  # round 0 warms connections, caches and the store
                for mode in modes:
                    # Alternating which goes first, so a trend within a pair favours neither.
                    if n % 2:
                        pair = one(mode), one("plain")
                    else:
                        plain = one("plain")
                        pair = one(mode), plain
                    if n:
                        samples[mode].append(pair)
            for mode in modes:
                meta = obstore.head(store, f"floor/{mode}.bin")
                assert meta["size"] == size, (mode, meta)
            assert (work / "cache" / "cache.bin").stat().st_size == size
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait()
            server.stop()
    return _summary(samples)


def _summary(samples: dict[str, list[tuple[dict, dict]]]) -> dict:
    def medians(rows: list[dict]) -> dict:
        return {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}

    plains = [plain for pairs in samples.values() for _, plain in pairs]
    summary = {"plain": medians(plains)}
    for mode, pairs in samples.items():
        ratios = [m["mb_s"] / p["mb_s"] for m, p in pairs]
        summary[mode] = {
            **medians([m for m, _ in pairs]),
            "plain_mb_s": round(statistics.median(p["mb_s"] for _, p in pairs), 3),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_per_round": [round(x, 3) for x in ratios],
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upload_floor")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size-mb", type=int, default=SIZE // CHUNK)
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--sink", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "modes", nargs="*", help=f"any of {', '.join(RELAYS)} (default: all; plain always runs)"
    )
    args = parser.parse_args(argv)
    if set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s) {sorted(set(args.modes) - set(MODES))}; choose from {MODES}")
    if args.serve:
        mode, port, url, sink_port = args.serve
        serve_relay(mode, int(port), url, int(sink_port))
        return 0
    if args.sink:
        serve_sink(int(args.sink[0]), args.sink[1])
        return 0
    modes = [m for m in RELAYS if m in args.modes] or list(RELAYS)
    record_run(
        RESULTS,
        args.size_mb == SIZE // CHUNK,  # a smaller file is a smoke test, not the figure
        lambda: measure(modes, args.rounds, args.size_mb * CHUNK),
        size_mb=args.size_mb,
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
