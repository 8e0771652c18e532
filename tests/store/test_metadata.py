"""Seed 003's metadata in the store: the rules of a record, and consistency when two
processes write the same conversation (a real SeaweedFS, and the local directory store)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest

from sandbox_workspace.store import S3Store
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import Metadata, Written

SCOPE = Scope("tenant-a", "sb-session-alice")


@pytest.fixture
def meta(store) -> Metadata:
    return Metadata(store, Layout("workspaces/"))


def written(path: str, checksum: str, size: int = 1) -> Written:
    return Written(path, size, checksum, "text/plain")


A = "uploads/temparea/a.txt"


async def test_record_rules(meta):
    up = await meta.record_write(SCOPE, "c1", written(A, "h1"), uploaded=True, description="d")
    assert (up.version, up.source, up.status, up.description) == (1, "user_upload", "active", "d")
    uuid.UUID(up.file_id)
    same = await meta.record_write(SCOPE, "c1", written(A, "h1"), uploaded=False)
    assert same == up  # agent code left it unchanged
    edited = await meta.record_write(SCOPE, "c1", written(A, "h2"), uploaded=False)
    assert (edited.file_id, edited.version, edited.source) == (up.file_id, 2, "ai_modified")
    assert edited.description == "d"
    created = await meta.record_write(SCOPE, "c1", written("outputs/r.png", "h3"), uploaded=False)
    assert (created.version, created.source, created.is_presented) == (1, "ai_created", False)
    [presented] = await meta.mark_presented(SCOPE, "c1", ["outputs/r.png", "outputs/none"])
    assert presented.is_presented
    gone = await meta.mark_deleted(SCOPE, "c1", file_id=up.file_id)
    assert gone.status == "deleted"
    again = await meta.record_write(SCOPE, "c1", written(A, "h1"), uploaded=True)
    assert again.file_id != up.file_id and again.version == 1
    manifest = await meta.get(SCOPE, "c1")
    assert [(f.file_path, f.status) for f in manifest.files] == [
        ("uploads/temparea/a.txt", "deleted"),
        ("outputs/r.png", "active"),
        ("uploads/temparea/a.txt", "active"),
    ]
    assert await meta.get(Scope("tenant-b", "sb-session-alice"), "c1") is None  # scoped


async def test_two_processes_lose_no_version_and_share_no_file_id(meta, request, tmp_path):
    """Two processes each change one shared file 15 times and add 15 files of their own,
    at the same time: the shared file ends at version 30 with one file_id, and every
    file_id is distinct."""
    if isinstance(meta.store, S3Store):
        s = meta.store.settings
        kind, config = (
            "s3",
            {
                "endpoint_url": s.endpoint_url,
                "bucket": s.bucket,
                "region": s.region,
                "access_key_id": s.access_key_id.get_secret_value(),
                "secret_access_key": s.secret_access_key.get_secret_value(),
            },
        )
    else:
        kind, config = "dir", str(meta.store.root)
    rounds = 15
    writer = Path(__file__).parents[1] / "support" / "metadata_writer.py"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(writer), kind, json.dumps(config), me, str(rounds)
        )
        for me in ("p1", "p2")
    ]
    assert await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 120) == [0, 0]
    manifest = await meta.get(Scope("t", "sb-session-x"), "shared")
    shared = [f for f in manifest.files if f.file_path == "outputs/same.txt"]
    assert len(shared) == 1
    assert shared[0].version == 2 * rounds
    assert len(manifest.files) == 1 + 2 * rounds
    assert len({f.file_id for f in manifest.files}) == len(manifest.files)


class Counting:
    """The store, with the requests made through it counted by kind."""

    def __init__(self, store) -> None:
        self.store = store
        self.puts: list[str] = []
        self.reads: list[str] = []

    async def put(self, key, body, **kw):
        self.puts.append(key)
        return await self.store.put(key, body, **kw)

    async def read(self, key):
        self.reads.append(key)
        return await self.store.read(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def outputs(n: int, checksum: str = "h") -> list[tuple[Written, bool]]:
    return [(written(f"outputs/f{i:04}.txt", checksum), False) for i in range(n)]


async def test_a_batch_is_one_commit_and_a_change_rewrites_only_its_shards(store):
    """2,000 writes in one batch: one head write and at most 64 shard writes (not 2,000
    rewrites of everything). Then one file changed: one shard and the head written, the
    other shards neither written nor read again (parsed once per process)."""
    counting = Counting(store)
    meta = Metadata(counting, Layout("workspaces/"))
    head = Layout("workspaces/").manifest(SCOPE, "big")
    records = await meta.record_writes(SCOPE, "big", outputs(2000))
    assert len(records) == 2000
    assert counting.puts.count(head) == 1
    assert len(counting.puts) == 1 + 64
    counting.puts.clear(), counting.reads.clear()
    [changed] = await meta.record_writes(
        SCOPE, "big", [(written("outputs/f0007.txt", "h2"), False)]
    )
    assert (changed.version, changed.source) == (2, "ai_modified")
    assert counting.puts.count(head) == 1 and len(counting.puts) == 2
    assert counting.reads == [head]
    # The replaced shard is gone: the metadata's objects are the head and 64 shards.
    keys = [i.key async for i in store.list(Layout("workspaces/").conversation(SCOPE, "big"))]
    assert len([k for k in keys if "/.sbw/" in k]) == 65
    # Another process (no parsed shards) reads the same records; unchanged writes write
    # nothing at all.
    other = Metadata(Counting(store), Layout("workspaces/"))
    m = await other.get(SCOPE, "big")
    assert len(m.files) == 2000 and m.active("outputs/f0007.txt").version == 2
    again = Counting(store)
    same = [w for w in outputs(2000) if w[0].file_path != "outputs/f0007.txt"]
    await Metadata(again, Layout("workspaces/")).record_writes(SCOPE, "big", same)
    assert again.puts == []


async def test_tombstones_stay_in_their_shard_and_the_old_format_is_read(store):
    """A deleted record stays (a tombstone) across later commits of other shards; a
    format-1 document (one JSON of every record) is read as it is and sharded by the next
    change."""
    layout = Layout("workspaces/")
    meta = Metadata(store, layout)
    first = await meta.record_write(SCOPE, "t", written(A, "h1"), uploaded=True)
    await meta.mark_deleted(SCOPE, "t", file_id=first.file_id)
    await meta.record_writes(SCOPE, "t", outputs(50))
    m = await Metadata(store, layout).get(SCOPE, "t")
    assert m.by_id(first.file_id).status == "deleted" and m.active(A) is None

    from dataclasses import asdict

    legacy = {
        "conversation_id": "old",
        "workspace_enabled": False,
        "workspace_created_at": "2026-01-01T00:00:00+00:00",
        "files": [asdict(first)],
    }
    await store.put(layout.manifest(SCOPE, "old"), json.dumps(legacy).encode())
    m = await meta.get(SCOPE, "old")
    assert (m.workspace_enabled, [f.file_id for f in m.files]) == (False, [first.file_id])
    await meta.record_write(SCOPE, "old", written("outputs/n.txt", "n"), uploaded=False)
    doc = json.loads((await store.read(layout.manifest(SCOPE, "old")))[0])
    assert doc["format"] == 2 and "files" not in doc and not doc["workspace_enabled"]
    m = await Metadata(store, layout).get(SCOPE, "old")
    assert {f.file_path for f in m.files} == {A, "outputs/n.txt"}
