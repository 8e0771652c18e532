"""Connect protocol, JSON codec: the framing envd's RPCs use (connectrpc.com/docs/protocol).

Unary calls are plain JSON bodies (``application/json``); errors are HTTP statuses with
``{"code", "message"}``. Server streams (``application/connect+json``) are envelopes:
one flags byte, a 4-byte big-endian length, the JSON message; the last envelope has
flag 0x02 and carries ``{}`` or ``{"error": {"code", "message"}}`` — errors of a stream
travel in it with HTTP 200.
"""

from __future__ import annotations

import json
import struct

STREAM_MEDIA_TYPE = "application/connect+json"
END_STREAM = 0x02

# Connect codes → HTTP statuses of a unary error (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "failed_precondition": 412,
    "resource_exhausted": 429,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
}


def envelope(message: dict, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(code: str | None = None, message: str = "") -> bytes:
    body = {} if code is None else {"error": {"code": code, "message": message}}
    return envelope(body, END_STREAM)


def read_envelopes(body: bytes) -> list[tuple[int, dict]]:
    """The messages of a (client's) enveloped body, in order."""
    out = []
    at = 0
    while at < len(body):
        if len(body) - at < 5:
            raise ValueError("truncated Connect envelope header")
        flags, size = struct.unpack_from(">BI", body, at)
        at += 5
        if len(body) - at < size:
            raise ValueError("truncated Connect envelope")
        out.append((flags, json.loads(body[at : at + size] or b"{}")))
        at += size
    return out


def code_for_status(status: int) -> str:
    for code, http in HTTP_STATUS.items():
        if http == status:
            return code
    return "invalid_argument" if 400 <= status < 500 else "internal"
