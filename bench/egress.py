"""What the egress proxy adds (issue 40 item 6), on loopback, in one run:

- a tunnel (CONNECT, TLS passed through untouched) against the same request direct;
- the local backend's two hops (the in-namespace relay, then the proxy's Unix socket)
  against the same request direct;
- a host whose secret the proxy injects (TLS terminated by the proxy's CA, placeholder
  swapped, answer scrubbed) against the floor of the same proxy relaying TLS.

Each request is a new connection + TLS handshake + ``GET`` of 2 bytes (p50/p99 ms), then
downloads (MiB/s, the median of ``DOWNLOAD_ROUNDS``, the ways alternated; a ratio is the
median of each round's ratio, the two downloads of a round back to back). The upstream
(a blocking TLS server, a thread per connection), the proxy (all listeners on one
``EgressProxy``) and the relay run in their own processes, so the client's GIL is not
theirs. Writes ``bench/results/egress.json`` (``egress-quick.json`` with --quick):
``added_p50_ms``, ``added_p99_ms``, ``throughput_ratio`` for the tunnel, the same under
``relayed`` for the two hops and under ``intercepted`` for the injected host, the
machine's load and, per process, the CPU seconds each download way cost.

    python -m bench egress [--quick]
    python -m bench.egress --role upstream|proxy ...   (the two helper processes)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import Figure

RESULTS = Path(__file__).resolve().parent / "results"
# Random bytes, like a compressed download. (A run of one byte is a slow case for
# CPython's bytes.find, which the scrubber of an injected host's answer uses: ~55 MiB/s
# on b"x" * n against 600+ MiB/s on random bytes or text, measured here.)
CHUNK = os.urandom(1 << 20)
PLACEHOLDER = "sbw-secret-bench-0123456789abcdef0123"
VALUE = "bench-secret-value-0123456789"
# Downloads per way, alternated; the median is reported (one download is ~0.3 s here,
# short enough for a neighbour's burst to halve it). A ratio is the median of the
# rounds' own ratios: the two ways of a round run back to back, so a drift of the
# machine's speed over the run (seen: 400 to 1,000 MiB/s direct within a minute) hits
# both sides of a ratio alike, where a ratio of the ways' medians took rounds apart.
DOWNLOAD_ROUNDS = 9


def serve_upstream(chain: str, port_file: str) -> None:
    """GET /small → 2 bytes, GET /big?N → N MiB; a thread per connection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(chain)
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
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (mib << 20 or 2))
                for _ in range(mib):
                    tls.sendall(CHUNK)
                if not mib:
                    tls.sendall(b"ok")
        except (OSError, ssl.SSLError):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def serve_proxy(
    upstream_port: int, upstream_ca: str, ca_dir: str, port_file: str, unix_path: str
) -> None:
    """One proxy, three listeners: session ``tunnel`` (allowed, no secret) on TCP and on
    the Unix socket ``unix_path`` (as the local backend binds it for the relay), and
    ``inject`` (a secret bound to localhost)."""
    from sandbox_workspace.egress.ca import InterceptCA
    from sandbox_workspace.egress.policy import (
        DEFAULT_FORBIDDEN,
        EgressPolicy,
        Rule,
        SecretBinding,
    )
    from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig
    from sandbox_workspace.egress.secrets import MemorySecretSource

    rule = Rule.make("localhost", ports=[upstream_port])
    binding = SecretBinding.make("bench", "localhost", placeholder=PLACEHOLDER)
    policies = {"tunnel": EgressPolicy((rule,)), "inject": EgressPolicy((rule,), (binding,))}
    loopback = ipaddress.ip_network("127.0.0.0/8")

    async def resolve(host: str, port: int):
        return [ipaddress.ip_address("127.0.0.1")]

    async def main() -> None:
        proxy = EgressProxy(
            policies.get,
            resolve=resolve,
            config=ProxyConfig(
                forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != loopback),
                upstream_ca=upstream_ca,
            ),
            ca=InterceptCA.load_or_create(ca_dir),
            secrets=MemorySecretSource({"inject": {"bench": VALUE}}),
        )
        ports = []
        for session in ("tunnel", "inject"):
            server = await proxy.serve_tcp("127.0.0.1", 0, lambda peer, s=session: s)
            ports.append(server.sockets[0].getsockname()[1])
        await proxy.serve_unix(unix_path, "tunnel")
        await asyncio.to_thread(Path(port_file).write_text, " ".join(map(str, ports)))
        await asyncio.Event().wait()

    asyncio.run(main())


def open_tls(ctx, upstream_port: int, proxy: int | None) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", proxy or upstream_port), timeout=30)
    if proxy:
        sock.sendall(f"CONNECT localhost:{upstream_port} HTTP/1.1\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                raise OSError(f"proxy closed: {answer!r}")
            answer += data
        if not answer.startswith(b"HTTP/1.1 200"):
            raise OSError(answer.split(b"\r\n")[0].decode())
    return ctx.wrap_socket(sock, server_hostname="localhost")


def get(ctx, upstream_port: int, proxy: int | None, path: str) -> int:
    """Bytes of body received for one request on a new connection."""
    with open_tls(ctx, upstream_port, proxy) as tls:
        tls.sendall(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {PLACEHOLDER}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = tls.recv(65536)
            if not data:
                raise OSError(f"closed before the answer: {head[:200]!r}")
            head += data
        head, _, body = head.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        got, buf = len(body), bytearray(1 << 20)
        while got < length and (n := tls.recv_into(buf)):
            got += n
        return got


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far of each helper process and of this one."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    me = os.times()
    out["client"] = me.user + me.system
    return out


def measure(
    ways: dict[str, tuple], upstream_port: int, requests: int, mib: int, pids: dict[str, int]
) -> dict:
    """Each way (ctx, proxy port or None) measured in turn, request by request, so a
    burst of load on the machine falls on all of them alike, then their downloads."""
    out: dict[str, dict] = {name: {"times_ms": []} for name in ways}
    for i in range(requests + 3):
        for name, (ctx, proxy) in ways.items():
            started = time.perf_counter()
            get(ctx, upstream_port, proxy, "/small")
            if i >= 3:  # the first three warm up
                out[name]["times_ms"].append((time.perf_counter() - started) * 1000)
    for name, got in downloads(ways, upstream_port, mib, pids).items():
        out[name].update(got)
    return out


def downloads(ways: dict[str, tuple], upstream_port: int, mib: int, pids: dict[str, int]) -> dict:
    """``DOWNLOAD_ROUNDS`` downloads per way, the ways alternated: per way the median
    round's MiB/s and the CPU seconds per GiB each process spent in it (on 2 cores the
    processes' sum, not the proxy's share alone, bounds a way's throughput), and every
    round's MiB/s in order (``rates``: a ratio pairs the rounds)."""
    rounds: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name in ways}
    for _ in range(DOWNLOAD_ROUNDS):
        for name, (ctx, proxy) in ways.items():
            cpu_before, started = cpu_seconds(pids), time.perf_counter()
            got = get(ctx, upstream_port, proxy, f"/big?{mib}")
            rate = got / (1 << 20) / (time.perf_counter() - started)
            cpu = {k: v - cpu_before[k] for k, v in cpu_seconds(pids).items()}
            gib = got / (1 << 30)
            rounds[name].append((rate, {k: round(v / gib, 2) for k, v in cpu.items() if v}))
    out = {}
    for name, results in rounds.items():
        rates = [r[0] for r in results]
        rate, cpu = sorted(results, key=lambda r: r[0])[len(results) // 2]
        out[name] = {"mib_per_s": rate, "cpu_s_per_gib": cpu, "rates": rates}
    return out


def paired_ratio(through: dict, base: dict) -> float:
    """The median of the rounds' ratios (``DOWNLOAD_ROUNDS``)."""
    pairs = zip(through["rates"], base["rates"], strict=True)
    return round(statistics.median(t / b for t, b in pairs), 3)


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of each process (0: this one) onto ``cpus``; threads started later
    inherit it from the thread that starts them (the upstream's accepting thread)."""
    for pid in pids:
        tasks: list[Path] = []
        with contextlib.suppress(FileNotFoundError):  # a helper that died: its error shows
            tasks = list(Path(f"/proc/{pid or os.getpid()}/task").iterdir())
        for task in tasks:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(task.name), cpus)


def pinned_downloads(
    ways: dict[str, tuple], upstream_port: int, mib: int, pids: dict[str, int]
) -> dict | None:
    """Direct against the tunnel with the client and the upstream on one half of this
    process's CPUs and the proxy on the other, the same pinning for both ways: the only
    difference left is the proxy's hop, not a third busy process taking the client's or
    the upstream's CPU (in production the proxy is a pod of its own). None with one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    near, far = set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2 :])
    try:
        pin([0, pids["upstream"]], near)
        pin([pids["proxy"]], far)
        got = downloads(ways, upstream_port, mib, pids)
    finally:
        pin([0, pids["upstream"], pids["proxy"]], set(cpus))
    tunnel, direct = got["tunnel"], got["direct"]
    return {
        "throughput_ratio": paired_ratio(tunnel, direct),
        "ratio_of_medians": round(tunnel["mib_per_s"] / direct["mib_per_s"], 3),
        "mib_per_s": round(tunnel["mib_per_s"], 1),
        "baseline_mib_per_s": round(direct["mib_per_s"], 1),
        "cpu_s_per_gib": tunnel["cpu_s_per_gib"],
        "baseline_cpu_s_per_gib": direct["cpu_s_per_gib"],
        "client_upstream_cpus": sorted(near),
        "proxy_cpus": sorted(far),
    }


def wait_ports(path: Path, proc: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()):
            return [int(p) for p in text.split()]
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args} did not start")


def compare(through: dict, base: dict) -> dict:
    t, b = sorted(through["times_ms"]), sorted(base["times_ms"])
    p99 = lambda xs: xs[max(int(len(xs) * 0.99) - 1, 0)]  # noqa: E731
    return {
        "added_p50_ms": round(statistics.median(t) - statistics.median(b), 3),
        "added_p99_ms": round(p99(t) - p99(b), 3),
        "throughput_ratio": paired_ratio(through, base),
        "ratio_of_medians": round(through["mib_per_s"] / base["mib_per_s"], 3),
        "p50_ms": round(statistics.median(t), 3),
        "baseline_p50_ms": round(statistics.median(b), 3),
        "mib_per_s": round(through["mib_per_s"], 1),
        "baseline_mib_per_s": round(base["mib_per_s"], 1),
        "cpu_s_per_gib": through["cpu_s_per_gib"],
        "baseline_cpu_s_per_gib": base["cpu_s_per_gib"],
    }


def run(quick: bool) -> list[Figure]:
    from sandbox_workspace.egress.ca import InterceptCA

    requests, mib = (30, 16) if quick else (300, 256)
    tmp = Path(tempfile.mkdtemp(prefix="bench-egress-"))
    # The upstream's certificate comes from a CA of its own (not the proxy's).
    cert = tmp / "upstream-ca" / "ca.pem"
    chain = tmp / "upstream.pem"
    chain.write_bytes(InterceptCA.load_or_create(cert.parent).issue_pem("localhost"))
    me = [sys.executable, "-m", "bench.egress"]
    procs: list[subprocess.Popen] = []
    load_before = os.getloadavg()[0]
    try:
        up = subprocess.Popen([*me, "--role", "upstream", "--cert", str(chain),
                               "--port-file", str(tmp / "up.port")])  # fmt: skip
        procs.append(up)
        (upstream_port,) = wait_ports(tmp / "up.port", up)
        proxy = subprocess.Popen([*me, "--role", "proxy", "--upstream-port", str(upstream_port),
                                  "--cert", str(cert), "--ca-dir", str(tmp / "ca"),
                                  "--port-file", str(tmp / "proxy.port"),
                                  "--unix", str(tmp / "proxy.sock")])  # fmt: skip
        procs.append(proxy)
        tunnel_port, inject_port = wait_ports(tmp / "proxy.port", proxy)
        # The local backend's two hops: the in-namespace relay (its own process, as the
        # runtime is) → the proxy's Unix socket.
        relay = subprocess.Popen([sys.executable, "-m", "sandbox_workspace.egress.relay",
                                  "--listen", "127.0.0.1:0", "--to", str(tmp / "proxy.sock"),
                                  "--ready-file", str(tmp / "relay.port")])  # fmt: skip
        procs.append(relay)
        (relay_port,) = wait_ports(tmp / "relay.port", relay)
        direct_ctx = ssl.create_default_context(cafile=str(cert))
        ca_ctx = ssl.create_default_context(cafile=str(tmp / "ca" / "ca.pem"))
        ways = {
            "direct": (direct_ctx, None),
            "tunnel": (direct_ctx, tunnel_port),
            "relayed": (direct_ctx, relay_port),
            "injected": (ca_ctx, inject_port),
        }
        pids = {"upstream": up.pid, "proxy": proxy.pid, "relay": relay.pid}
        got = measure(ways, upstream_port, requests, mib, pids)
        pinned = pinned_downloads(
            {k: ways[k] for k in ("direct", "tunnel")}, upstream_port, mib, pids
        )
        direct, tunnel, injected = got["direct"], got["tunnel"], got["injected"]
        relayed = got["relayed"]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)  # its CAs' keys and the proxy's socket
    result = {
        **compare(tunnel, direct),
        "intercepted": compare(injected, tunnel),
        "relayed": compare(relayed, direct),
        "pinned": pinned,
        "quick": quick,
        "requests": requests,
        "download_mib": mib,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RESULTS.mkdir(exist_ok=True)
    # Quick mode (the test command's) never overwrites the full run's committed figures.
    name = "egress-quick.json" if quick else "egress.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print("egress: " + json.dumps(result), flush=True)
    return [
        Figure.of("egress tunnel request", "ms", tunnel["times_ms"], "direct",
                  direct["times_ms"], "≤ +2 ms p50"),
        Figure.of("egress injected-secret request", "ms", injected["times_ms"],
                  "the proxy's tunnel", tunnel["times_ms"]),
        Figure.of("egress tunnel download", "MiB/s", [tunnel["mib_per_s"]], "direct",
                  [direct["mib_per_s"]], "≥ 0.8× direct"),
        *([Figure.of("egress tunnel download, proxy on CPUs of its own", "MiB/s",
                     [pinned["mib_per_s"]], "direct, same pinning",
                     [pinned["baseline_mib_per_s"]], "≥ 0.8× direct")] if pinned else []),
        Figure.of("egress relay + tunnel download (local backend)", "MiB/s",
                  [relayed["mib_per_s"]], "direct", [direct["mib_per_s"]], "≥ 0.8× direct"),
        Figure.of("egress injected-secret download", "MiB/s", [injected["mib_per_s"]],
                  "the proxy's tunnel", [tunnel["mib_per_s"]]),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.egress")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--role", choices=["upstream", "proxy"])
    parser.add_argument("--cert")
    parser.add_argument("--ca-dir")
    parser.add_argument("--upstream-port", type=int)
    parser.add_argument("--port-file")
    parser.add_argument("--unix")
    args = parser.parse_args(argv)
    if args.role == "upstream":
        serve_upstream(args.cert, args.port_file)
    elif args.role == "proxy":
        serve_proxy(args.upstream_port, args.cert, args.ca_dir, args.port_file, args.unix)
    else:
        run(args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
