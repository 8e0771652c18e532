"""The object store contract (sandbox_workspace/store/base.py), held against both
implementations: ``DirStore`` on a temporary directory and ``S3Store`` on a real SeaweedFS
(tests/support/seaweedfs.py; no S3 mock)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from sandbox_workspace.store import (
    ObjectNotFound,
    PreconditionFailed,
    S3Settings,
    S3Store,
    StoreConfigError,
)


async def chunks(data: bytes, size: int = 1 << 20):
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def read_all(store, key: str) -> bytes:
    download = await store.get(key)
    return b"".join([c async for c in download])


async def test_put_get_head_round_trip(store):
    etag = await store.put("w/s/c/a.txt", b"hello")
    assert await read_all(store, "w/s/c/a.txt") == b"hello"
    info = await store.head("w/s/c/a.txt")
    assert (info.key, info.size, info.etag) == ("w/s/c/a.txt", 5, etag)
    data, read_etag = await store.read("w/s/c/a.txt")
    assert (data, read_etag) == (b"hello", etag)
    assert await store.put("w/s/c/a.txt", b"world") != etag


async def test_streamed_put_of_many_chunks_is_byte_identical(store):
    data = os.urandom(3 << 20) * 7  # 21 MiB: several multipart parts on S3
    await store.put("big/file.bin", chunks(data))
    download = await store.get("big/file.bin")
    assert download.info.size == len(data)
    digest = hashlib.sha256()
    async for chunk in download:
        digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


async def test_missing_objects(store):
    with pytest.raises(ObjectNotFound):
        await store.get("nothing/here")
    with pytest.raises(ObjectNotFound):
        await store.read("nothing/here")
    assert await store.head("nothing/here") is None
    await store.delete("nothing/here")  # gone is success


async def test_copy_is_an_independent_object(store):
    """A copy (server-side on S3, a reflink or copy on a directory) has the bytes; later
    writes or a deletion of either never show in the other."""
    await store.put("w/s/c/a.txt", b"origin")
    await store.copy("w/s/c/a.txt", "w/s/fork/a.txt")
    assert await read_all(store, "w/s/fork/a.txt") == b"origin"
    await store.put("w/s/fork/a.txt", b"changed")
    assert await read_all(store, "w/s/c/a.txt") == b"origin"
    await store.delete("w/s/c/a.txt")
    assert await read_all(store, "w/s/fork/a.txt") == b"changed"
    with pytest.raises(ObjectNotFound):
        await store.copy("w/s/c/a.txt", "w/s/other/a.txt")


async def test_list_is_exactly_the_prefix(store):
    for key in ("p/a/1", "p/a/sub/2", "p/ab/3", "p/b"):
        await store.put(key, b"x")
    assert sorted(i.key for i in [i async for i in store.list("p/a/")]) == ["p/a/1", "p/a/sub/2"]
    assert len([i async for i in store.list("p/")]) == 4
    assert [i async for i in store.list("q/")] == []


async def test_delete_prefix_leaves_neighbours(store):
    for key in ("d/c1/x", "d/c1/y/z", "d/c10/x", "d/c2/x"):
        await store.put(key, b"x")
    assert await store.delete_prefix("d/c1/") == 0
    assert await store.delete_prefix("d/c1/") == 0  # idempotent
    assert sorted([i.key async for i in store.list("d/")]) == ["d/c10/x", "d/c2/x"]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a b%20c.txt", id="space-percent"),
        pytest.param("ü é #?&+=.txt", id="unicode-reserved"),
        pytest.param(".hidden", id="leading-dot"),
        pytest.param("...", id="dots"),
    ],
)
async def test_names_round_trip(store, name):
    key = f"names/{name}"
    await store.put(key, name.encode())
    assert await read_all(store, key) == name.encode()
    assert [i.key async for i in store.list("names/")] == [key]


@pytest.mark.parametrize("key", ["", "a//b", "a/../b", "./a", "a/.", "/a"])
async def test_invalid_keys_are_refused(store, key):
    with pytest.raises(ValueError):
        await store.put(key, b"x")


async def test_conditional_puts(store):
    first = await store.put("cas/doc", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        await store.put("cas/doc", b"2", if_absent=True)
    second = await store.put("cas/doc", b"2", if_match=first)
    with pytest.raises(PreconditionFailed):
        await store.put("cas/doc", b"3", if_match=first)  # stale
    assert await store.read("cas/doc") == (b"2", second)
    with pytest.raises(PreconditionFailed):
        await store.put("cas/absent", b"x", if_match=second)


async def test_compare_and_swap_loses_no_update(store):
    """Twelve writers each add one to a counter with read + put(if_match), retrying on a
    lost race: the counter ends at twelve (what the metadata's consistency rests on)."""
    await store.put("cas/counter", b"0", if_absent=True)

    async def increment() -> None:
        while True:
            data, etag = await store.read("cas/counter")
            try:
                await store.put("cas/counter", str(int(data) + 1).encode(), if_match=etag)
                return
            except PreconditionFailed:
                await asyncio.sleep(0)

    await asyncio.gather(*(increment() for _ in range(12)))
    assert (await store.read("cas/counter"))[0] == b"12"


# -- configuration errors name the setting (S3 only) -----------------------------------


async def test_missing_bucket_names_the_setting(seaweedfs):
    store = S3Store(seaweedfs.settings("no-such-bucket-here"))
    with pytest.raises(StoreConfigError, match="SANDBOX_WORKSPACE_S3__BUCKET"):
        await store.check()


async def test_bad_credentials_name_the_setting(seaweedfs, s3_bucket):
    store = S3Store(seaweedfs.settings(s3_bucket, secret_access_key="wrong-secret-key"))
    with pytest.raises(StoreConfigError, match="SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY"):
        await store.check()
    store = S3Store(seaweedfs.settings(s3_bucket, access_key_id="nobody"))
    with pytest.raises(StoreConfigError, match="SANDBOX_WORKSPACE_S3__ACCESS_KEY_ID"):
        await store.check()


def test_no_bucket_setting_names_it():
    with pytest.raises(StoreConfigError, match="SANDBOX_WORKSPACE_S3__BUCKET"):
        S3Store(S3Settings())


async def test_unreachable_endpoint_names_the_setting(tmp_path):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = S3Settings(
        endpoint_url=f"http://127.0.0.1:{port}",
        bucket="b",
        access_key_id="k",
        secret_access_key="s",
    )
    with pytest.raises(StoreConfigError, match="SANDBOX_WORKSPACE_S3__ENDPOINT_URL"):
        await S3Store(settings).check()
