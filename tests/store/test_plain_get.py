"""The plain GET of ``S3Store`` downloads (sandbox_workspace/store/s3_get.py): taken for an
http:// endpoint, never passes a short object off as whole, leaves no socket behind, and
names what went wrong. A real SeaweedFS wherever the store's own behaviour is under test;
a loopback server speaking broken HTTP only for answers no real store gives on request."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from seaweedfs import start_seaweedfs

from sandbox_workspace.store import ObjectNotFound, S3Store, StoreUnavailable
from sandbox_workspace.store.s3_get import PlainGet, open_get


async def _chunks(data: bytes, size: int = 1 << 20):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _fds_back_to(count: int) -> int:
    """The process's open descriptors once they are back to ``count`` (or after 5 s)."""
    for _ in range(250):  # closes of the loopback server's side land on its own turns
        if _open_fds() <= count:
            break
        await asyncio.sleep(0.02)
    return _open_fds()


async def test_an_http_endpoint_downloads_over_the_plain_get(seaweedfs, s3_bucket):
    store = S3Store(seaweedfs.settings(s3_bucket))
    try:
        await store.put("c/a.bin", b"x" * 3000)
        download = await store.get("c/a.bin")
        assert isinstance(download, PlainGet)
        assert (download.info.size, len(b"".join([c async for c in download]))) == (3000, 3000)
        assert download.info.etag == (await store.head("c/a.bin")).etag
    finally:
        await store.aclose()


async def test_the_setting_off_uses_the_s3_client(seaweedfs, s3_bucket):
    store = S3Store(seaweedfs.settings(s3_bucket, plain_get=False))
    try:
        await store.put("c/a.bin", b"abc")
        assert not isinstance(await store.get("c/a.bin"), PlainGet)
    finally:
        await store.aclose()


async def test_a_refused_signature_is_store_unavailable_with_the_status(seaweedfs, s3_bucket):
    good = S3Store(seaweedfs.settings(s3_bucket))
    bad = S3Store(seaweedfs.settings(s3_bucket, secret_access_key="wrong-secret"))
    try:
        await good.put("c/a.bin", b"abc")
        with pytest.raises(StoreUnavailable, match="answered 403"):
            await bad.get("c/a.bin")
        with pytest.raises(ObjectNotFound):
            await good.get("c/none.bin")
    finally:
        await good.aclose(), await bad.aclose()


async def test_an_abandoned_download_closes_its_socket(seaweedfs, s3_bucket):
    store = S3Store(seaweedfs.settings(s3_bucket))
    try:
        await store.put("c/big.bin", _chunks(os.urandom(1 << 20) * 16))
        await (await store.get("c/big.bin")).aclose()  # warm: the client's own sockets
        before = _open_fds()
        for _ in range(20):
            download = await store.get("c/big.bin")
            stream = aiter(download)
            await anext(stream)  # a client that reads a little, then goes away
            await stream.aclose()
        assert await _fds_back_to(before) <= before
    finally:
        await store.aclose()


async def test_a_store_killed_mid_download_is_an_error_not_a_short_file(tmp_path):
    server = start_seaweedfs(tmp_path / "weed")
    bucket = "killed"
    server.make_bucket(bucket)
    store = S3Store(server.settings(bucket))
    size = 48 << 20  # far beyond what loopback's socket buffers hold
    try:
        await store.put("c/big.bin", _chunks(os.urandom(1 << 20) * 48))
        download = await store.get("c/big.bin")
        stream, got = aiter(download), 0
        got += len(await anext(stream))
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        with pytest.raises(StoreUnavailable, match=f"after \\d+ of {size} bytes"):
            async for chunk in stream:
                got += len(chunk)
        assert got < size
    finally:
        await store.aclose()
        server.stop()


async def _broken_store(answer: bytes):
    """A loopback server that answers every request with ``answer`` and hangs up."""

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/b/k?X-Amz=1"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "no plain Content-Length",
            id="chunked",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\nabc", "no plain Content-Length", id="no-length"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000, "head is over", id="huge-head"),
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "no HTTP/1 status", id="not-http"),
        pytest.param(b"", "before answering", id="hung-up"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "after 3 of 10 bytes", id="short"
        ),
    ],
)
async def test_answers_no_store_gives_are_named_errors(answer, message):
    server, url = await _broken_store(answer)
    before = _open_fds()
    try:
        with pytest.raises(StoreUnavailable, match=message):
            download = await open_get(url, "b/k")
            b"".join([c async for c in download])
    finally:
        server.close()
        await server.wait_closed()
    assert await _fds_back_to(before) <= before


async def test_only_http_urls_take_the_plain_get():
    with pytest.raises(ValueError, match="http://"):
        await open_get("https://store.example/b/k", "b/k")
