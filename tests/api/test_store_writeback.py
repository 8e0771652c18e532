"""The write-back of many files in ``SANDBOX_WORKSPACE_STORE=s3`` mode (real SeaweedFS):
small outputs read from the runtime a batch at a time, larger ones streamed, all recorded
in one metadata change (the head written once per write-back, however many files)."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from .test_store_mode import manifest, objects

pytestmark = pytest.mark.local_backend

SID = "sb-session-wb"


@pytest.fixture(scope="module")
def store_server(start_server, seaweedfs, tmp_path_factory):
    bucket = f"t-wb-{tmp_path_factory.mktemp('b').name[-6:].lower()}"
    seaweedfs.make_bucket(bucket)
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(bucket)}
    data = tmp_path_factory.mktemp("data")
    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "wb"}, timeout=120) as api:
        assert api.post("/api/v1/sessions", json={}).status_code == 201
    return server, bucket


def execute(server, code: str, cid: str) -> dict:
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "wb"}, timeout=300) as api:
        body = {"conversation_id": cid, "language": "python", "code": code}
        r = api.post(f"/api/v1/sessions/{SID}/execute", json=body)
    assert r.status_code == 200, f"{r.text}\n{server.log()[-3000:]}"
    assert r.json()["exit_code"] == 0, r.json()
    return r.json()


def head_versions(seaweedfs, bucket: str, cid: str) -> int:
    """How many objects the metadata's shards are (each commit replaces what it touched)."""
    keys = objects(seaweedfs, bucket, f"workspaces/default/{SID}/{cid}/.sbw/")
    return len(keys)


WRITE = """
import os
os.makedirs('outputs/deep/er', exist_ok=True)
for i in range(600):
    open(f'outputs/f{i:03}.txt', 'w').write('x' * (i % 7) + str(i))
open('outputs/deep/er/big.bin', 'wb').write(bytes(range(256)) * 8192)  # 2 MiB: streamed
open('outputs/empty.txt', 'w').close()
"""


def test_many_small_outputs_and_a_large_one_are_all_stored_and_recorded(store_server, seaweedfs):
    server, bucket = store_server
    execute(server, WRITE, "many")
    doc = manifest(seaweedfs, bucket, SID, "many")
    files = {f["file_path"]: f for f in doc["files"]}
    assert len(files) == 602
    assert all(f["status"] == "active" and f["version"] == 1 for f in files.values())
    assert files["outputs/f123.txt"]["checksum"] == hashlib.sha256(b"x" * 4 + b"123").hexdigest()
    big = files["outputs/deep/er/big.bin"]
    assert (big["file_size"], big["checksum"]) == (
        2 * 1024 * 1024,
        hashlib.sha256(bytes(range(256)) * 8192).hexdigest(),
    )
    assert files["outputs/empty.txt"]["file_size"] == 0
    prefix = f"workspaces/default/{SID}/many/outputs/"
    assert len(objects(seaweedfs, bucket, prefix)) == 602
    got = asyncio.run(_read(seaweedfs, bucket, prefix + "f599.txt"))
    assert got == b"x" * (599 % 7) + b"599"

    # A second execution that changes two files: two new versions, nothing else copied.
    execute(server, "open('outputs/f001.txt','w').write('new')\n"
            "open('outputs/f002.txt','w').write('new2')", "many")  # fmt: skip
    files = {f["file_path"]: f for f in manifest(seaweedfs, bucket, SID, "many")["files"]}
    changed = {p for p, f in files.items() if f["version"] > 1}
    assert changed == {"outputs/f001.txt", "outputs/f002.txt"}
    assert files["outputs/f001.txt"]["source"] == "ai_modified"


def test_more_outputs_than_a_listing_window_all_reach_the_store(store_server, seaweedfs):
    """The runtime lists 2,000 outputs by default (result events); the write-back asks
    for the whole conversation, so an execution writing 2,100 loses none of them."""
    server, bucket = store_server
    execute(server, "for i in range(2100): open(f'outputs/w{i:04}.txt', 'w').write(str(i))", "wide")
    prefix = f"workspaces/default/{SID}/wide/outputs/"
    assert len(objects(seaweedfs, bucket, prefix)) == 2100
    files = {f["file_path"] for f in manifest(seaweedfs, bucket, SID, "wide")["files"]}
    assert {f"outputs/w{i:04}.txt" for i in (0, 1999, 2000, 2099)} <= files
    assert len(files) == 2100


async def _read(seaweedfs, bucket: str, key: str) -> bytes:
    from sandbox_workspace.store import S3Store

    store = S3Store(seaweedfs.settings(bucket))
    try:
        return (await store.read(key))[0]
    finally:
        await store.aclose()
