"""``SANDBOX_WORKSPACE_S3__SIGN_PAYLOAD``: whether the S3 client hashes each body into its
signature (``x-amz-content-sha256``), seen on the wire by a loopback server that records
the request and refuses it."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from sandbox_workspace.store import S3Settings, S3Store, StoreUnavailable


async def _sent_sha256_header(**settings) -> str:
    """The x-amz-content-sha256 of a put of b"abc" as the store client sends it."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = S3Store(
        S3Settings(
            endpoint_url=f"http://127.0.0.1:{port}",
            bucket="b",
            access_key_id="k",
            secret_access_key="s",
            **settings,
        )
    )
    async with server:
        with pytest.raises(StoreUnavailable):
            await store.put("x/y", b"abc")
    for line in heads[0].decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "x-amz-content-sha256":
            return value.strip()
    raise AssertionError(f"no x-amz-content-sha256 in {heads[0]!r}")


async def test_over_http_the_body_is_signed_unless_told_not_to():
    digest = hashlib.sha256(b"abc").hexdigest()
    assert await _sent_sha256_header() == digest
    assert await _sent_sha256_header(sign_payload=True) == digest
    assert await _sent_sha256_header(sign_payload=False) == "UNSIGNED-PAYLOAD"


def test_over_tls_the_body_is_not_signed_unless_told_to():
    assert S3Settings(endpoint_url="https://s3.example:443").signs_payload() is False
    assert S3Settings().signs_payload() is False  # AWS itself: https
    assert S3Settings(endpoint_url="https://s", sign_payload=True).signs_payload() is True
    assert S3Settings(endpoint_url="http://seaweedfs:8333").signs_payload() is True
