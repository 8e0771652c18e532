"""``runtime.copies``: snapshots, restores and forks on the runtime's volume — every copy
a new inode (reflink or copy, never a hard link), no link ever followed, uploads still
uploads afterwards, a restore exactly the snapshot."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandbox_workspace.contract.errors import Conflict, NotFoundError
from sandbox_workspace.runtime import copies
from sandbox_workspace.runtime.copies import Copies
from sandbox_workspace.runtime.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path):
    ws = Workspace(tmp_path / "root", "/workspace")
    ws.ensure_conversation("c1")
    yield ws
    ws.close()


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def upload(ws: Workspace, name: str, data: bytes) -> None:
    import hashlib

    from sandbox_workspace.runtime.metastore import UploadMeta

    path = Path(ws.real_path("c1")) / "uploads" / "temparea" / name
    path.write_bytes(data)
    meta = UploadMeta.of(path.stat(), name=name, size=len(data),
                         sha256=hashlib.sha256(data).hexdigest(), mime_type="text/csv",
                         uploaded_at="2026-11-28T00:00:00+00:00")  # fmt: skip
    ws.meta.put("c1", meta)


def test_a_fork_is_new_inodes_and_follows_no_link(ws, tmp_path: Path) -> None:
    conv = Path(ws.real_path("c1"))
    (conv / "outputs" / "a.txt").write_bytes(b"a")
    os.link(conv / "outputs" / "a.txt", conv / "outputs" / "b.txt")
    (tmp_path / "secret").write_bytes(b"not this conversation's")
    os.symlink(tmp_path / "secret", conv / "outputs" / "link")
    os.symlink(tmp_path, conv / "outputs" / "dirlink")
    upload(ws, "in.csv", b"x,y\n")
    done = Copies(ws).fork("c1", "f1", None)
    fork = Path(ws.real_path("f1"))
    assert tree(fork) == {"outputs/a.txt": b"a", "outputs/b.txt": b"a",
                          "uploads/temparea/in.csv": b"x,y\n"}  # fmt: skip
    assert not (fork / "outputs" / "link").exists() and not (fork / "outputs" / "dirlink").exists()
    origin = {p.stat().st_ino for p in conv.rglob("*") if p.is_file()}
    for p in (q for q in fork.rglob("*") if q.is_file()):
        assert p.stat().st_ino not in origin and p.stat().st_nlink == 1
    assert done.files == 3
    assert [f.name for f in ws.list_uploads("f1")] == ["in.csv"]  # still an upload
    with pytest.raises(Conflict):
        Copies(ws).fork("c1", "f1", None)  # it holds files now


def test_restore_is_exactly_the_snapshot(ws) -> None:
    conv = Path(ws.real_path("c1"))
    upload(ws, "in.csv", b"1")
    (conv / "outputs" / "o.txt").write_bytes(b"v1")
    c = Copies(ws)
    doc = c.snapshot("c1", "s1", "first")
    assert (doc["file_count"], doc["bytes"]) == (2, 3)
    (conv / "outputs" / "o.txt").write_bytes(b"v2")
    (conv / "outputs" / "new.txt").write_bytes(b"n")
    (conv / "top.txt").write_bytes(b"t")
    upload(ws, "later.csv", b"2")
    c.restore("c1", "s1")
    assert tree(conv) == {"outputs/o.txt": b"v1", "uploads/temparea/in.csv": b"1"}
    assert [f.name for f in ws.list_uploads("c1")] == ["in.csv"]
    assert [d["snapshot_id"] for d in c.list("c1")] == ["s1"]
    c.delete("c1", "s1")
    with pytest.raises(NotFoundError):
        c.get("c1", "s1")


def test_an_upload_changed_by_code_stays_modified_in_the_copy(ws) -> None:
    conv = Path(ws.real_path("c1"))
    upload(ws, "in.csv", b"orig")
    with open(conv / "uploads" / "temparea" / "in.csv", "r+b") as f:
        f.write(b"CHNG")
    Copies(ws).fork("c1", "f1", None)
    assert [f.modified for f in ws.list_uploads("f1")] == [True]


def test_without_reflinks_a_plain_copy(ws, monkeypatch) -> None:
    def no_reflink(*_):
        raise OSError(errno.EOPNOTSUPP, "no")

    monkeypatch.setattr(copies.fcntl, "ioctl", no_reflink)
    (Path(ws.real_path("c1")) / "outputs" / "a.txt").write_bytes(b"x" * 100_000)
    done = Copies(ws).fork("c1", "f1", None)
    assert done.reflinked == 0
    assert (Path(ws.real_path("f1")) / "outputs" / "a.txt").read_bytes() == b"x" * 100_000


def test_deleting_the_conversation_drops_its_snapshots(ws, tmp_path: Path) -> None:
    c = Copies(ws)
    c.snapshot("c1", "s1", "")
    assert (tmp_path / "root" / ".runtime" / "snapshots" / "c1" / "s1").is_dir()
    c.drop("c1")
    assert not (tmp_path / "root" / ".runtime" / "snapshots" / "c1").exists()
