"""The server name (SNI) of a TLS ClientHello, read without terminating TLS.

Contract of ``client_hello_sni(data)``: ``data`` is the first bytes a client sent in a
tunnel. It returns
- ``NEED_MORE`` while the ClientHello is not complete yet (it may span TLS records),
- the server name (lower case) when it is a complete ClientHello with an SNI extension,
- raises ``NotClientHello`` for anything else (not TLS, a malformed hello, no SNI): the
  proxy refuses such a tunnel, because it could not check where the client is going.
A hello is at most ``MAX_HELLO`` bytes (post-quantum key shares make hellos ~2 KiB).
"""

from __future__ import annotations

MAX_HELLO = 64 * 1024
NEED_MORE = None

_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000


class NotClientHello(ValueError):
    pass


def _handshake_bytes(data: bytes) -> bytes | None:
    """The handshake-layer bytes of the leading TLS records (None: need another record)."""
    out = bytearray()
    offset = 0
    while True:
        if len(data) - offset < 5:
            return bytes(out) if out else None
        content_type, length = data[offset], int.from_bytes(data[offset + 3 : offset + 5])
        if content_type != _HANDSHAKE or data[offset + 1] != 0x03:
            raise NotClientHello("not a TLS handshake record")
        if length == 0 or length > 16384 + 2048:
            raise NotClientHello("bad TLS record length")
        if len(data) - offset - 5 < length:
            return bytes(out) if out else None
        out += data[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if len(out) >= 4 and len(out) >= 4 + int.from_bytes(out[1:4]):
            return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotClientHello("truncated ClientHello")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n))

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def client_hello_sni(data: bytes) -> str | None:
    if len(data) > MAX_HELLO:
        raise NotClientHello("ClientHello too large")
    if data[:1] and data[0] != _HANDSHAKE:
        raise NotClientHello("the tunnel did not start with TLS")
    handshake = _handshake_bytes(data)
    if handshake is None or len(handshake) < 4:
        return NEED_MORE
    if handshake[0] != _CLIENT_HELLO:
        raise NotClientHello("first handshake message is not a ClientHello")
    body_length = int.from_bytes(handshake[1:4])
    if len(handshake) < 4 + body_length:
        return NEED_MORE
    hello = _Reader(handshake[4 : 4 + body_length])
    hello.take(2 + 32)  # legacy_version, random
    hello.vector(1)  # session id
    hello.vector(2)  # cipher suites
    hello.vector(1)  # compression methods
    if hello.pos == len(hello.data):
        raise NotClientHello("ClientHello without extensions (no server name)")
    extensions = _Reader(hello.vector(2))
    while extensions.pos < len(extensions.data):
        kind, payload = extensions.number(2), extensions.vector(2)
        if kind != _EXT_SERVER_NAME:
            continue
        names = _Reader(_Reader(payload).vector(2))
        while names.pos < len(names.data):
            name_type, name = names.number(1), names.vector(2)
            if name_type == 0:
                try:
                    return name.decode("ascii").lower()
                except UnicodeDecodeError:
                    raise NotClientHello("server name is not ASCII") from None
    raise NotClientHello("ClientHello has no server name (SNI)")
