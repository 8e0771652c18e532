"""``store.snapshots``: snapshots, restores and forks by server-side copies, against both
store implementations (the ``store`` fixture: a directory and a real SeaweedFS)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.store import ObjectNotFound
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import Metadata, Written
from sandbox_workspace.store.snapshots import SnapshotNotFound, StoreCopies

SCOPE = Scope("default", "sb-session-a")
LAYOUT = Layout("w/")


async def conversation(store, meta: Metadata, cid: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        etag = await store.put(LAYOUT.file(SCOPE, cid, path), data)
        written = Written(path, len(data), f"sum-{data.decode()}", "text/plain", etag)
        await meta.record_write(SCOPE, cid, written, uploaded=False)


async def keys(store, cid: str) -> set[str]:
    prefix = LAYOUT.conversation(SCOPE, cid)
    return {i.key[len(prefix) :] async for i in store.list(prefix)}


async def test_snapshot_restore_and_fork_copy_and_never_share(store) -> None:
    meta = Metadata(store, LAYOUT)
    copies = StoreCopies(store, LAYOUT, meta)
    await conversation(store, meta, "c", {"outputs/a.txt": b"1", "outputs/b.txt": b"2"})
    snap = await copies.create(SCOPE, "c", "one")
    assert (snap.file_count, snap.bytes) == (2, 2)
    await conversation(store, meta, "c", {"outputs/a.txt": b"9", "outputs/new.txt": b"n"})
    await copies.restore(SCOPE, "c", snap.snapshot_id)
    live = {k for k in await keys(store, "c") if not k.startswith(".sbw/")}
    assert live == {"outputs/a.txt", "outputs/b.txt"}
    data, _ = await store.read(LAYOUT.file(SCOPE, "c", "outputs/a.txt"))
    assert data == b"1"
    active = {r.file_path for r in (await meta.get(SCOPE, "c")).files if r.active}
    assert active == live

    forked = await copies.fork(SCOPE, "c", "f", snap.snapshot_id)
    assert {r.file_path for r in forked} == live
    assert not {r.file_id for r in forked} & {r.file_id for r in snap.records}
    await store.delete_prefix(LAYOUT.conversation(SCOPE, "c"))  # the origin goes
    data, _ = await store.read(LAYOUT.file(SCOPE, "f", "outputs/b.txt"))
    assert data == b"2"  # the fork's own object

    with pytest.raises(SnapshotNotFound):
        await copies.get(SCOPE, "f", "../../x")  # never a key


class SlowFailing:
    """A store whose copy of ``bad`` fails at once and every other copy takes a while."""

    def __init__(self, store) -> None:
        self.store = store
        self.in_flight = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def copy(self, src: str, dst: str) -> None:
        if src.endswith("bad.txt"):
            raise ObjectNotFound("gone")
        self.in_flight += 1
        try:
            await asyncio.sleep(0.05)
            await self.store.copy(src, dst)
        finally:
            self.in_flight -= 1


async def test_a_failed_fork_has_no_copy_still_in_flight(store) -> None:
    """The caller undoes a failed fork by deleting its prefix: no copy may land after."""
    meta = Metadata(store, LAYOUT)
    files = {f"outputs/{i}.txt": b"x" for i in range(40)} | {"outputs/bad.txt": b"b"}
    await conversation(store, meta, "c", files)
    slow = SlowFailing(store)
    with pytest.raises(ObjectNotFound):
        await StoreCopies(slow, LAYOUT, Metadata(slow, LAYOUT)).fork(SCOPE, "c", "f", None)
    assert slow.in_flight == 0
    await store.delete_prefix(LAYOUT.conversation(SCOPE, "f"))
    assert await keys(store, "f") == set()


async def test_a_snapshot_cut_off_before_its_document_is_swept(store, monkeypatch) -> None:
    """A crash between the copies and ``snapshot.json`` leaves copies no document names:
    never listed, removed by the next snapshot's sweep once old enough."""
    from datetime import timedelta

    from sandbox_workspace.store import snapshots

    meta = Metadata(store, LAYOUT)
    copies = StoreCopies(store, LAYOUT, meta)
    await conversation(store, meta, "c", {"outputs/a.txt": b"1"})
    cut = LAYOUT.metadata(SCOPE, "c", "snapshots/" + "0" * 32) + "/files/outputs/a.txt"
    await store.copy(LAYOUT.file(SCOPE, "c", "outputs/a.txt"), cut)
    assert await copies.list(SCOPE, "c") == []
    assert await copies.sweep(SCOPE, "c") == 0  # younger than an hour: maybe in progress
    monkeypatch.setattr(snapshots, "_SWEEP_AFTER", timedelta(0))
    kept = await copies.create(SCOPE, "c", "kept")  # sweeps first
    assert await store.head(cut) is None
    assert [s.snapshot_id for s in await copies.list(SCOPE, "c")] == [kept.snapshot_id]
