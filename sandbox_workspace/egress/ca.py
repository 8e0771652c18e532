"""The per-install CA with which the egress proxy terminates TLS for hosts that have a
secret bound to them (and only those).

Contract:
- ``InterceptCA.load_or_create(directory)`` generates the CA once (EC P-256, ten years)
  and reloads it afterwards. The directory is the proxy's own (mode 0700); the key file
  is 0600 and is never given to a sandbox. The cluster wiring may instead build it from
  a Kubernetes Secret's two PEMs with ``from_pem``.
- What a sandbox gets is ``write_trust_bundle(path)``: the system's CA bundle followed by
  this CA's *certificate*, no key, plus ``trust_env(path)``, the environment variables
  that point common clients at it.
- ``server_context(host)`` is a TLS server context with a leaf certificate for ``host``
  (SAN = host, a week long, renewed a day before it ends), cached per host. Its
  ``sni_callback`` refuses a ClientHello that names any other server.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_NAME = "sandbox-workspace egress CA"
LEAF_DAYS = 7
CACHE_LIMIT = 1024  # leaf contexts kept; hosts with a bound secret are few


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _builder(subject: str, issuer: x509.Name, key, days: float) -> x509.CertificateBuilder:
    """A certificate for ``subject`` (its public key from ``key``), valid from five
    minutes ago (clock skew) for ``days``."""
    return x509.CertificateBuilder(
        subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]),
        issuer_name=issuer,
        public_key=key.public_key(),
        serial_number=x509.random_serial_number(),
        not_valid_before=_now() - datetime.timedelta(minutes=5),
        not_valid_after=_now() + datetime.timedelta(days=days),
    )


def trust_env(bundle: str | Path) -> dict[str, str]:
    """Variables that make OpenSSL-based clients (Python ssl/httpx, curl, git), requests,
    pip and Node trust ``bundle`` (system CAs + this CA)."""
    path = str(bundle)
    return {
        "SSL_CERT_FILE": path,  # OpenSSL default (Python ssl, httpx, urllib, curl)
        "REQUESTS_CA_BUNDLE": path,  # requests (its own certifi otherwise)
        "PIP_CERT": path,  # pip's vendored requests
        "CURL_CA_BUNDLE": path,
        "GIT_SSL_CAINFO": path,
        "NODE_EXTRA_CA_CERTS": path,  # added to Node's built-in roots
    }


@dataclass
class InterceptCA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    _leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = field(default_factory=dict)

    @classmethod
    def generate(cls) -> InterceptCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
        cert = (
            _builder(CA_NAME, name, key, 3650)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> InterceptCA:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the egress CA key must be an EC key")
        return cls(key, x509.load_pem_x509_certificate(cert_pem))

    @classmethod
    def load_or_create(cls, directory: str | Path) -> InterceptCA:
        directory = Path(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        cert_file, key_file = directory / "ca.pem", directory / "ca-key.pem"
        if cert_file.exists() and key_file.exists():
            os.chmod(key_file, 0o600)  # whatever an earlier hand left it at
            return cls.from_pem(cert_file.read_bytes(), key_file.read_bytes())
        ca = cls.generate()
        _write_private(key_file, _pem_key(ca.key))
        cert_file.write_bytes(ca.cert_pem)
        return ca

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The key (PEM, unencrypted): for the proxy's own store only."""
        return _pem_key(self.key)

    def write_trust_bundle(self, path: str | Path, system_bundle: str | None = None) -> Path:
        """The bundle a sandbox trusts (``trust_bundle``), written to ``path``."""
        path = Path(path)
        path.write_bytes(trust_bundle(self.cert_pem, system_bundle))
        path.chmod(0o644)
        return path

    def issue_pem(self, host: str) -> bytes:
        """A leaf certificate for ``host`` and its key, PEM (the key is unencrypted)."""
        key = ec.generate_private_key(ec.SECP256R1())
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        leaf = (
            _builder(host, self.cert.subject, key, LEAF_DAYS)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False
            )
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(self.key, hashes.SHA256())
        )
        return leaf.public_bytes(serialization.Encoding.PEM) + _pem_key(key)

    def server_context(self, host: str) -> ssl.SSLContext:
        cached = self._leaves.get(host)
        if cached and cached[1] - _now() > datetime.timedelta(days=1):
            return cached[0]
        not_after = _now() + datetime.timedelta(days=LEAF_DAYS)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a key only from a file: a private one, removed at once.
        with tempfile.TemporaryDirectory(prefix="sbw-egress-leaf-") as tmp:
            chain = Path(tmp) / "leaf.pem"
            _write_private(chain, self.issue_pem(host))
            ctx.load_cert_chain(chain)
        ctx.set_alpn_protocols(["http/1.1"])  # the proxy parses HTTP/1.1 only

        def sni_must_match(_sslobj, name, _ctx):
            if (name or "").lower().rstrip(".") != host:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            return None

        ctx.sni_callback = sni_must_match
        if len(self._leaves) >= CACHE_LIMIT:
            self._leaves.pop(next(iter(self._leaves)))
        self._leaves[host] = (ctx, not_after)
        return ctx


def trust_bundle(cert_pem: bytes, system_bundle: str | None = None) -> bytes:
    """The bundle a sandbox trusts: the system's roots (so tunnelled hosts still verify)
    and the CA's certificate. Never the key."""
    system = system_bundle or ssl.get_default_verify_paths().cafile
    if not system or not Path(system).exists():
        try:  # an image without ca-certificates: the roots Python's HTTP clients ship
            import certifi

            system = certifi.where()
        except ImportError:
            system = None
    roots = Path(system).read_bytes() if system and Path(system).exists() else b""
    return roots.rstrip(b"\n") + b"\n" + cert_pem if roots else cert_pem
