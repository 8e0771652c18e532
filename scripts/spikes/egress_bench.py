"""Spike measurement for issue 40 (docs/egress-spike.md): what an HTTP CONNECT proxy adds
to a TLS request on loopback — per-request latency (new connection + TLS handshake + GET
of a tiny body) and download throughput — against the same request made directly.

    python scripts/spikes/egress_bench.py [--proxy ours|HOST:PORT] [--requests N] [--mib M]

``ours`` starts sandbox_workspace.egress in a subprocess (policy: allow localhost on the
upstream's port; loopback taken off the forbidden list for the measurement only). Any
other proxy is given as HOST:PORT and must allow CONNECT to localhost:<upstream port>
(the script prints the port before measuring when --upstream-port is not given).
Everything is on 127.0.0.1; loops are bounded by --requests and --mib.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CHUNK = b"x" * (1 << 20)


def make_cert(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def serve_upstream(cert: str, key: str, port_file: str) -> None:
    """Blocking TLS server, a thread per connection: GET /small → 2 bytes, GET /big?N → N MiB."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    Path(port_file).write_text(str(listener.getsockname()[1]))

    def one(conn: socket.socket) -> None:
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = tls.recv(4096)
                    if not data:
                        return
                    head += data
                path = head.split(b" ", 2)[1]
                mib = int(path.split(b"?")[1]) if path.startswith(b"/big") else 0
                small = head.split(b"\r\n\r\n")[0] if path == b"/echo" else b"ok"
                length = mib << 20 if mib else len(small)
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length)
                if mib:
                    for _ in range(mib):
                        tls.sendall(CHUNK)
                else:
                    tls.sendall(small)
        except (OSError, ssl.SSLError):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def serve_ours(upstream_port: int, port_file: str) -> None:
    from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, Rule
    from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig

    loopback = ipaddress.ip_network("127.0.0.0/8")
    policy = EgressPolicy((Rule.make("localhost", ports=[upstream_port]),))

    async def resolve(host: str, port: int):
        return [ipaddress.ip_address("127.0.0.1")]

    async def main() -> None:
        proxy = EgressProxy(
            lambda s: policy,
            resolve=resolve,
            config=ProxyConfig(forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != loopback)),
        )
        server = await proxy.serve_tcp("127.0.0.1", 0, lambda peer: "bench")
        await asyncio.to_thread(Path(port_file).write_text, str(server.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


def open_tls(ctx, upstream_port: int, proxy: tuple[str, int] | None) -> ssl.SSLSocket:
    if proxy is None:
        sock = socket.create_connection(("127.0.0.1", upstream_port))
    else:
        sock = socket.create_connection(proxy)
        sock.sendall(
            f"CONNECT localhost:{upstream_port} HTTP/1.1\r\nHost: localhost:{upstream_port}"
            "\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                raise OSError(f"proxy closed: {answer!r}")
            answer += data
        if not answer.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
            raise OSError(answer.split(b"\r\n")[0].decode())
    return ctx.wrap_socket(sock, server_hostname="localhost")


def get(ctx, upstream_port: int, proxy, path: str) -> int:
    with open_tls(ctx, upstream_port, proxy) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += tls.recv(65536)
        head, _, body = head.partition(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got = len(body)
        buf = bytearray(1 << 20)
        while got < length:
            n = tls.recv_into(buf)
            if not n:
                break
            got += n
        return got


def measure(ctx, upstream_port: int, proxy, requests: int, mib: int) -> dict:
    for _ in range(5):
        get(ctx, upstream_port, proxy, "/small")
    times = []
    for _ in range(requests):
        t0 = time.perf_counter()
        get(ctx, upstream_port, proxy, "/small")
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    t0 = time.perf_counter()
    got = get(ctx, upstream_port, proxy, f"/big?{mib}")
    seconds = time.perf_counter() - t0
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
        "mib_per_s": round(got / (1 << 20) / seconds, 1),
    }


def wait_port(path: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited {proc.returncode}")
        time.sleep(0.05)
    raise SystemExit(f"{proc.args} did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxy", default="ours")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--upstream-port-file")
    parser.add_argument("--role", choices=["upstream", "ours"])
    parser.add_argument("--port-file")
    parser.add_argument("--upstream-port", type=int)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    if args.role == "upstream":
        return serve_upstream(args.cert, args.key, args.port_file)
    if args.role == "ours":
        return serve_ours(args.upstream_port, args.port_file)

    tmp = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    cert, key = make_cert(tmp)
    me = [sys.executable, __file__]
    procs = []
    try:
        up = subprocess.Popen(
            [*me, "--role", "upstream", "--cert", str(cert), "--key", str(key),
             "--port-file", str(tmp / "up.port")]
        )  # fmt: skip
        procs.append(up)
        upstream_port = wait_port(tmp / "up.port", up)
        if args.upstream_port_file:
            Path(args.upstream_port_file).write_text(str(upstream_port))
        if args.proxy == "ours":
            ours = subprocess.Popen(
                [*me, "--role", "ours", "--upstream-port", str(upstream_port),
                 "--port-file", str(tmp / "proxy.port")]
            )  # fmt: skip
            procs.append(ours)
            proxy = ("127.0.0.1", wait_port(tmp / "proxy.port", ours))
        else:
            host, port = args.proxy.rsplit(":", 1)
            proxy = (host, int(port))
            wait = tmp / "go"
            print(f"upstream on localhost:{upstream_port}; waiting for {wait}", flush=True)
            deadline = time.monotonic() + 120
            while not wait.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        ctx = ssl.create_default_context(cafile=str(cert))
        direct = measure(ctx, upstream_port, None, args.requests, args.mib)
        through = measure(ctx, upstream_port, proxy, args.requests, args.mib)
        print(
            json.dumps(
                {
                    "proxy": args.proxy,
                    "direct": direct,
                    "through": through,
                    "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3),
                    "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 3),
                    "throughput_ratio": round(through["mib_per_s"] / direct["mib_per_s"], 3),
                }
            )
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
