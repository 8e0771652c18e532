"""The runtime's raw upload route (``runtime/raw_upload.py``) against a real runtime
process: the file's bytes, then a trailer; every limit a form upload has, and a broken
trailer commits nothing."""

from __future__ import annotations

import hashlib
import json
import socket

import pytest

from sandbox_workspace.runtime.raw_upload import LENGTH_BYTES, MAX_TRAILER, Trailer, encode_trailer

LIMIT = 1048576  # SANDBOX_RUNTIME_MAX_FILE_SIZE_BYTES of the fixture


@pytest.fixture
def runtime_env() -> dict[str, str]:
    return {
        "SANDBOX_RUNTIME_ALLOWED_FILE_TYPES": "txt,csv,bin",
        "SANDBOX_RUNTIME_LIMIT_MEMORY": "512Mi",
        "SANDBOX_RUNTIME_LIMIT_CPU_SECONDS": "60",
        "SANDBOX_RUNTIME_LIMIT_FILE_SIZE": "1Mi",
        "SANDBOX_RUNTIME_LIMIT_CONVERSATION_SIZE": "4Mi",
    }


def _body(data: bytes, **fields: str) -> bytes:
    sha = hashlib.sha256(data).hexdigest()
    return data + encode_trailer(Trailer(fields=fields, size=len(data), sha256=sha))


def _raw(runtime, body: bytes, **params: str):
    return runtime.client.post("/v1/uploads/raw", params=params, content=body)


def _staged(runtime) -> list[str]:
    staging = runtime.root / ".sbw" / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []


def _listed(runtime, cid: str) -> list[str]:
    r = runtime.client.get(f"/v1/conversations/{cid}/uploads")
    return [f["name"] for f in r.json()["files"]]


def test_the_bytes_before_the_trailer_are_the_file(runtime):
    data = b"a,b\n" * 5000
    r = _raw(runtime, _body(data), conversation_id="c", filename="t.csv")
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["name"], got["size"]) == ("t.csv", len(data))
    assert got["sha256"] == hashlib.sha256(data).hexdigest()
    assert (runtime.root / "c" / "uploads" / "temparea" / "t.csv").read_bytes() == data
    # An empty file is a file.
    r = _raw(runtime, _body(b""), conversation_id="c", filename="empty.txt")
    assert r.status_code == 201 and r.json()["size"] == 0, r.text
    assert _staged(runtime) == []


def test_form_fields_in_the_trailer_count_as_in_a_form(runtime):
    r = _raw(runtime, _body(b"x", path="named.txt"), conversation_id="f", filename="a.txt")
    assert r.status_code == 201 and r.json()["name"] == "named.txt", r.text
    refused = [
        (_body(b"x", conversation_id="other"), "disagree"),
        (_body(b"x", subdir="../up"), "subdir"),
        (_body(b"x", path="../x.txt"), "single name"),
        (_body(b"x", path="x.exe"), "not allowed"),
    ]
    for body, says in refused:
        r = _raw(runtime, body, conversation_id="f", filename="b.txt")
        assert r.status_code in (400, 415), r.text
        assert says in r.json()["error"]["message"], r.text
    assert _listed(runtime, "f") == ["named.txt"]
    assert _staged(runtime) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(b"short", "ended before its trailer", id="no-trailer"),
        pytest.param(b"x" * 10 + (999).to_bytes(LENGTH_BYTES, "big"), "not possible", id="length"),
        pytest.param(
            b"x" + (MAX_TRAILER + 1).to_bytes(LENGTH_BYTES, "big"), "not possible", id="too-long"
        ),
        pytest.param(b"x{not json" + (9).to_bytes(LENGTH_BYTES, "big"), "not valid", id="json"),
        pytest.param(
            b"xy"
            + (raw := json.dumps({"size": 5, "sha256": "0" * 64}).encode())
            + len(raw).to_bytes(LENGTH_BYTES, "big"),
            "says 5 bytes; 2 came",
            id="size-disagrees",
        ),
        pytest.param(
            b"x"
            + (raw := json.dumps({"size": 1, "sha256": "nothex"}).encode())
            + len(raw).to_bytes(LENGTH_BYTES, "big"),
            "not valid",
            id="bad-digest",
        ),
    ],
)
def test_a_broken_trailer_commits_nothing(runtime, body, says):
    r = _raw(runtime, body, conversation_id="t", filename="x.txt")
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"], r.text
    assert _listed(runtime, "t") == []
    assert _staged(runtime) == []


def test_limits_refuse_as_for_a_form(runtime):
    # The type, before a byte is written.
    r = _raw(runtime, _body(b"x"), conversation_id="l", filename="x.exe")
    assert r.status_code == 415 and "not allowed" in r.json()["error"]["message"], r.text
    r = _raw(runtime, _body(b"x"), conversation_id="l")
    assert r.status_code == 400 and "filename" in r.json()["error"]["message"], r.text
    # The size: exactly one byte past the limit, and far past it while streaming.
    for size in (LIMIT + 1, LIMIT + MAX_TRAILER + 4096):
        r = _raw(runtime, _body(b"z" * size), conversation_id="l", filename="big.bin")
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "file_too_large"
    r = _raw(runtime, _body(b"z" * LIMIT), conversation_id="l", filename="max.bin")
    assert r.status_code == 201, r.text
    # The conversation's quota (4 MiB): three full files and their directories fit, a
    # fourth does not.
    for name in ("b.bin", "c.bin"):
        r = _raw(runtime, _body(b"q" * LIMIT), conversation_id="l", filename=name)
        assert r.status_code == 201, r.text
    r = _raw(runtime, _body(b"q" * LIMIT), conversation_id="l", filename="d.bin")
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "conversation_quota_exceeded"
    assert sorted(_listed(runtime, "l")) == ["b.bin", "c.bin", "max.bin"]
    assert _staged(runtime) == []


def test_a_raw_upload_cut_off_by_its_client_is_discarded(runtime):
    data = b"w" * 200_000
    body = _body(data)
    host, port = runtime.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            (
                "POST /v1/uploads/raw?conversation_id=cut&filename=cut.bin HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: Bearer {runtime.token}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body[: len(body) // 2]
        )
    r = _raw(runtime, _body(b"after"), conversation_id="cut", filename="after.txt")
    assert r.status_code == 201, r.text  # the runtime served on; the cut one never landed
    assert _listed(runtime, "cut") == ["after.txt"]


def test_the_runtime_names_raw_uploads_among_its_features(runtime):
    """The API asks /healthz before sending a runtime a raw upload."""
    import asyncio

    import httpx

    from sandbox_workspace.runtime.client import RuntimeClient
    from sandbox_workspace.runtime.raw_upload import FEATURE

    async def ask():
        async with httpx.AsyncClient() as http:
            return await RuntimeClient(http, runtime.server.url, runtime.token).features()

    assert FEATURE in asyncio.run(ask())
