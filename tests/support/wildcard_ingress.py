"""A loopback stand-in for the chart's wildcard Ingress, for E2B host-routing tests.

The E2B SDK reaches ``https://api.{domain}`` and ``https://{port}-{id}.{domain}`` on
port 443. On loopback there is no DNS for the domain and no port 443, so the SDK is
given this as its HTTPS proxy (``HTTPS_PROXY``, which the SDK's transport honours as
it honours the ``proxy`` option): each ``CONNECT name:443`` for a name under the domain
is answered by TLS with a wildcard certificate for ``*.{domain}`` (signed by a CA made
here; the SDK trusts it through ``SSL_CERT_FILE``), and the decrypted bytes are passed
unchanged — Host header included — to the API's plain HTTP port, as an Ingress
terminating TLS passes them to the API pod. Any other CONNECT is refused (403).
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from contextlib import suppress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool, names=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        san = x509.SubjectAlternativeName([x509.DNSName(n) for n in names])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class WildcardIngress:
    """``with WildcardIngress(domain, upstream_port, tmp) as ingress``: ``ingress.proxy``
    is the proxy URL, ``ingress.ca_file`` the CA to trust."""

    def __init__(self, domain: str, upstream_port: int, directory: Path) -> None:
        self.domain = domain
        self.upstream = ("127.0.0.1", upstream_port)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("wildcard-ingress test CA", ca_key, "wildcard-ingress test CA", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = _cert(
            f"*.{domain}", key, "wildcard-ingress test CA", ca_key, ca=False,
            names=[f"*.{domain}", domain],
        )  # fmt: skip
        self.ca_file = directory / "ingress-ca.pem"
        self.ca_file.write_bytes(_pem(ca))
        (directory / "ingress.pem").write_bytes(_pem(leaf) + _pem(key))
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(directory / "ingress.pem")
        self._tls.set_alpn_protocols(["http/1.1"])  # the API speaks HTTP/1.1
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.proxy = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connects: list[str] = []  # the names asked for, in order

    def __enter__(self) -> WildcardIngress:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._listener.close()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 8192:
                if not (chunk := conn.recv(4096)):
                    return
                head += chunk
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            name, _, port = target.rpartition(":")
            self.connects.append(name)
            if method != "CONNECT" or port != "443" or not name.endswith(f".{self.domain}"):
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                tls = self._tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                return
            with tls, socket.create_connection(self.upstream) as upstream:
                back = threading.Thread(target=_pump, args=(upstream, tls), daemon=True)
                back.start()
                _pump(tls, upstream)
                back.join(timeout=60)
