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
