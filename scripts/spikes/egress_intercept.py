"""Spike for issue 40 (docs/egress-spike.md): can our own asyncio proxy terminate TLS for a
host that has a secret bound to it, swap the placeholder for the real value in a header,
and re-originate TLS to the real host — and what does that cost against a plain tunnel?

    python scripts/spikes/egress_intercept.py [--requests N] [--mib M]

A per-install CA (generated here) signs a leaf certificate per host (cached); the client
trusts that CA. The SNI the client sends must be the CONNECT host (ssl's sni_callback
refuses any other). The upstream is the loopback TLS server of egress_bench.py, whose
``/echo`` answers with the request head it received, so the swap is checked end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

sys.path.insert(0, str(Path(__file__).parent))
import egress_bench

PLACEHOLDER = b"sbw-placeholder-0000"
SECRET = b"real-secret-value-42"


class CA:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-workspace egress CA")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = directory / "ca.pem"
        self.cert_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._contexts: dict[str, ssl.SSLContext] = {}

    def server_context(self, host: str) -> ssl.SSLContext:
        if host in self._contexts:
            return self._contexts[host]
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), False)
            .sign(self.key, hashes.SHA256())
        )
        chain = self.directory / f"{host}.pem"
        chain.write_bytes(
            leaf.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(chain)
        ctx.set_alpn_protocols(["http/1.1"])  # h2 would need a real HTTP/2 parser here

        def sni_must_match(sslobj, name, _ctx):
            if (name or "").lower() != host:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            return None

        ctx.sni_callback = sni_must_match
        self._contexts[host] = ctx
        return ctx


async def copy(src, dst) -> None:
    try:
        while data := await src.read(256 * 1024):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, ssl.SSLError):
        pass


def swap(head: bytes, inject: bool) -> bytes:
    lines = head.split(b"\r\n")
    out = [lines[0]]
    for line in lines[1:]:
        if line.lower().startswith((b"connection:", b"proxy-")):
            continue
        out.append(line.replace(PLACEHOLDER, SECRET) if inject else line)
    out.append(b"Connection: close")
    return b"\r\n".join(out)


async def intercept(reader, writer, upstream_ctx, ca: CA, inject: bool) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", int(port), ssl=upstream_ctx, server_hostname=host
        )
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await writer.start_tls(ca.server_context(host))
        # One request per connection (Content-Length bodies only in this spike).
        request = await reader.readuntil(b"\r\n\r\n")
        up_writer.write(swap(request[:-4], inject) + b"\r\n\r\n")
        await copy(up_reader, writer)
        up_writer.close()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        writer.close()


def start(ca: CA, upstream_cert: Path, inject: bool) -> int:
    upstream_ctx = ssl.create_default_context(cafile=str(upstream_cert))
    loop = asyncio.new_event_loop()

    async def serve():
        return await asyncio.start_server(
            lambda r, w: intercept(r, w, upstream_ctx, ca, inject), "127.0.0.1", 0
        )

    server = loop.run_until_complete(serve())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return server.sockets[0].getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--mib", type=int, default=128)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="egress-intercept-"))
    cert, key = egress_bench.make_cert(tmp)
    up = subprocess.Popen(
        [sys.executable, egress_bench.__file__, "--role", "upstream", "--cert", str(cert),
         "--key", str(key), "--port-file", str(tmp / "up.port")]
    )  # fmt: skip
    try:
        upstream_port = egress_bench.wait_port(tmp / "up.port", up)
        ca = CA(tmp)
        proxies = {"terminate": start(ca, cert, False), "inject": start(ca, cert, True)}
        client_ctx = ssl.create_default_context(cafile=str(ca.cert_file))
        results = {}
        # The swap, end to end: the upstream saw the secret, the client never sent it.
        with egress_bench.open_tls(
            client_ctx, upstream_port, ("127.0.0.1", proxies["inject"])
        ) as tls:
            tls.sendall(
                b"GET /echo HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
                + PLACEHOLDER
                + b"\r\n\r\n"
            )
            seen = b""
            while chunk := tls.recv(65536):
                seen += chunk
        results["upstream_saw_secret"] = SECRET in seen and PLACEHOLDER not in seen
        # A tunnel opened for localhost whose TLS names another host: refused by the CA's
        # sni_callback (the leaf would not verify either, but the proxy must not rely on it).
        try:
            wrong = ssl.create_default_context(cafile=str(ca.cert_file))
            wrong.check_hostname = False

            raw = socket.create_connection(("127.0.0.1", proxies["inject"]))
            raw.sendall(f"CONNECT localhost:{upstream_port} HTTP/1.1\r\n\r\n".encode())
            raw.recv(100)
            wrong.wrap_socket(raw, server_hostname="other.test").close()
            results["other_sni"] = "accepted"
        except ssl.SSLError as exc:
            results["other_sni"] = f"refused: {exc.reason}"
        direct_ctx = ssl.create_default_context(cafile=str(cert))
        results["direct"] = egress_bench.measure(
            direct_ctx, upstream_port, None, args.requests, args.mib
        )
        for mode, port in proxies.items():
            results[mode] = egress_bench.measure(
                client_ctx, upstream_port, ("127.0.0.1", port), args.requests, args.mib
            )
        print(json.dumps(results))
    finally:
        up.terminate()
        up.wait(10)


if __name__ == "__main__":
    main()
