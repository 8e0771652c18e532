"""Connect protocol, JSON codec: the framing envd's RPCs use (connectrpc.com/docs/protocol).

Unary calls are plain JSON bodies (``application/json``); errors are HTTP statuses with
``{"code", "message"}``. Server streams (``application/connect+json``) are envelopes:
one flags byte, a 4-byte big-endian length, the JSON message; the last envelope has
flag 0x02 and carries ``{}`` or ``{"error": {"code", "message"}}`` — errors of a stream
travel in it with HTTP 200.

Requests are hostile input (``request_message``, ``message_of``, ``field``): a body that
is not one JSON object, nests too deep, holds a non-finite number, or is framed other
than as one plain envelope, and a field of the wrong type, are refused with a message
naming what to change (``invalid_argument``; compression ``unimplemented``) — never a
server error. Nothing is allocated from a declared length: an envelope is read only
from the body the API already holds (bounded by ``request_bounds``).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from sandbox_workspace.contract.errors import ApiError, BadRequest

STREAM_MEDIA_TYPE = "application/connect+json"
JSON_ONLY = (
    "this envd speaks Connect's JSON codec only: send Content-Type application/json "
    "(unary calls) or application/connect+json (streams), uncompressed"
)
COMPRESSED = 0x01
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


def frames(body: bytes) -> list[tuple[int, bytes]]:
    """The (flags, raw message) envelopes of a body, in order; a length past the body's
    end is refused from the header alone."""
    out = []
    at = 0
    while at < len(body):
        if len(body) - at < 5:
            raise BadRequest("truncated Connect envelope header (5 bytes: flags, length)")
        flags, size = struct.unpack_from(">BI", body, at)
        at += 5
        if len(body) - at < size:
            raise BadRequest(
                f"truncated Connect envelope: it declares {size} bytes, {len(body) - at} follow"
            )
        out.append((flags, body[at : at + size]))
        at += size
    return out


def read_envelopes(body: bytes) -> list[tuple[int, dict]]:
    """The messages of an enveloped body (a server's answer, in tests), in order."""
    return [(flags, json.loads(data or b"{}")) for flags, data in frames(body)]


class Unimplemented(ApiError):
    """What this envd does not speak (a codec, a compression): ``unimplemented``."""

    status, code = 501, "not_supported"


def request_message(body: bytes, encoding: str | None = None) -> dict:
    """The one message of a server-stream request: exactly one envelope, flags 0."""
    if (encoding or "identity") != "identity":
        raise Unimplemented(f"Connect-Content-Encoding {encoding[:40]!r}: {JSON_ONLY}")
    envelopes = frames(body)
    if len(envelopes) != 1:
        raise BadRequest(
            f"a server-stream request carries one message; this one has {len(envelopes)}"
        )
    flags, data = envelopes[0]
    if flags & COMPRESSED:
        raise Unimplemented(f"a compressed envelope (flag 0x01): {JSON_ONLY}")
    if flags:
        raise BadRequest(
            f"envelope flags {flags:#04x} on a request: send 0 (end-stream, 0x02, is the "
            "server's last message)"
        )
    return message_of(data)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"number {text[:24]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise BadRequest(f"{name} is not JSON: send finite numbers")


def message_of(raw: bytes, what: str = "the message") -> dict:
    """A request message (``what``: its name in errors): one JSON object; an empty body
    is the empty message."""
    try:
        message = json.loads(raw or b"{}", parse_float=_finite, parse_constant=_constant)
    except RecursionError:  # the C decoder's nesting bound
        raise BadRequest(f"{what} nests too deep to be a request") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise BadRequest(f"{what} is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise BadRequest(f"{what} must be a JSON object, not {type(message).__name__}")
    return message


_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a whole number"}


def field(message: dict, name: str, kind: type, default: Any = None) -> Any:
    """``message[name]`` if it has the type (absent or null: ``default``), else the
    ``invalid_argument`` naming the field."""
    value = message.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadRequest(f"'{name}' must be {_KINDS.get(kind, kind.__name__)}")
    return value


def whole(message: dict, name: str, default: int, low: int, high: int) -> int:
    """A whole-number field (proto JSON: a number or its decimal string) in [low, high]."""
    value = message.get(name)
    if value is None:
        return default
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 20:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a whole number from {low} to {high}")
    return value


def timeout_seconds(header: str | None) -> float | None:
    """``Connect-Timeout-Ms`` (at most 10 digits, the protocol's bound) in seconds; None
    for none (absent or 0)."""
    if not header:
        return None
    if not (header.isascii() and header.isdigit() and len(header) <= 10):
        raise BadRequest("Connect-Timeout-Ms must be a whole number of milliseconds (≤ 10 digits)")
    return int(header) / 1000 or None


def code_for_status(status: int) -> str:
    for code, http in HTTP_STATUS.items():
        if http == status:
            return code
    return "invalid_argument" if 400 <= status < 500 else "internal"
