"""What runs modified and presented, kept by the runtime with the files (``runtime/marks``),
against a real runtime process: answered in listings, kept across restarts, gone with the
conversation, refused for other conversations' paths, and forged documents never trusted."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from runtime_ops import assert_healthy, execute, restart

from sandbox_workspace.contract.errors import ConversationDeleting
from sandbox_workspace.runtime.marks import doc_name
from sandbox_workspace.runtime.schemas import ChangedFile, MarksReport
from sandbox_workspace.runtime.workspace import Workspace

CANARY = b"CANARY-outside-marks"


def marks_dir(runtime) -> Path:
    return runtime.root / ".runtime" / "marks"


def conversation_path(runtime, cid: str) -> str:
    r = runtime.client.put(f"/v1/conversations/{cid}")
    assert r.status_code == 200, r.text
    return r.json()["path"]


def record(runtime, cid: str, changed=(), presented=()):
    return runtime.client.post(
        f"/v1/conversations/{cid}/marks",
        json={"changed": [{"path": p, "status": s} for p, s in changed], "presented": [*presented]},
    )


def outputs(runtime, cid: str) -> dict[str, dict]:
    r = runtime.client.get(f"/v1/conversations/{cid}/outputs")
    assert r.status_code == 200, r.text
    return {f["relative_path"]: f for f in r.json()["files"]}


def uploads(runtime, cid: str) -> dict[str, dict]:
    r = runtime.client.get(f"/v1/conversations/{cid}/uploads")
    assert r.status_code == 200, r.text
    return {f["name"]: f for f in r.json()["files"]}


def test_marks_answer_listings_and_survive_a_restart(runtime) -> None:
    assert runtime.upload("c1", "in.csv", b"x").status_code == 201
    base = conversation_path(runtime, "c1")
    execute(runtime, "c1", "mkdir -p outputs && echo a > outputs/a.txt && echo b > outputs/b.txt")
    r = record(
        runtime,
        "c1",
        changed=[(f"{base}/outputs/a.txt", "modified"), (f"{base}/outputs/b.txt", "created")],
        presented=[f"{base}/outputs/b.txt", f"{base}/uploads/temparea/in.csv"],
    )
    assert r.status_code == 200, r.text
    assert r.json()["modified"] == [f"{base}/outputs/a.txt"]

    def check() -> None:
        out = outputs(runtime, "c1")
        assert (out["a.txt"]["modified"], out["a.txt"]["presented"]) == (True, False)
        assert (out["b.txt"]["modified"], out["b.txt"]["presented"]) == (False, True)
        assert uploads(runtime, "c1")["in.csv"]["presented"] is True

    check()
    restart(runtime, signal.SIGKILL)  # no chance to tidy up: what was answered was on disk
    check()
    # A later run that creates a.txt anew (after deleting it) takes the "modified" back.
    record(runtime, "c1", changed=[(f"{base}/outputs/a.txt", "created")])
    assert outputs(runtime, "c1")["a.txt"]["modified"] is False


@pytest.mark.parametrize("cid", ["c1", "x" * 255], ids=["short", "longest-id"])
def test_marks_go_with_the_conversation(runtime, cid: str) -> None:
    """A conversation deleted and started again under the same id inherits nothing —
    the longest id too (its document's name must fit the file-name limit)."""
    base = conversation_path(runtime, cid)
    execute(runtime, cid, "mkdir -p outputs && echo a > outputs/a.txt")
    record(runtime, cid, [(f"{base}/outputs/a.txt", "modified")], [f"{base}/outputs/a.txt"])
    assert (marks_dir(runtime) / doc_name(cid)).is_file()

    assert runtime.client.delete(f"/v1/conversations/{cid}").status_code == 200
    assert not (marks_dir(runtime) / doc_name(cid)).exists()
    execute(runtime, cid, "mkdir -p outputs && echo again > outputs/a.txt")
    a = outputs(runtime, cid)["a.txt"]
    assert (a["modified"], a["presented"]) == (False, False)
    restart(runtime)
    a = outputs(runtime, cid)["a.txt"]
    assert (a["modified"], a["presented"]) == (False, False)


def test_marks_name_only_files_of_their_conversation(runtime) -> None:
    base = conversation_path(runtime, "c1")
    other = conversation_path(runtime, "c2")
    for bad in (f"{other}/outputs/x", f"{base}/../c2/outputs/x", "/etc/passwd", "outputs/x"):
        r = record(runtime, "c1", presented=[bad])
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_marks", r.text
        assert "starting" in r.json()["error"]["message"]
    r = record(runtime, "c1", changed=[(f"{base}/outputs/x", "deleted")])
    assert r.status_code in (400, 422), r.text
    r = record(runtime, "nope", presented=[f"{base}/outputs/x"])
    assert r.status_code == 404, r.text
    r = runtime.client.post("/v1/conversations/c1/marks", json={"presented": ["a" * 5000]})
    assert r.status_code in (400, 422), r.text
    assert not (marks_dir(runtime) / doc_name("c2")).exists()
    assert not (marks_dir(runtime) / doc_name("c1")).exists()  # nothing was recorded


def test_marks_refused_while_the_conversation_is_deleted(tmp_path: Path) -> None:
    """Record and delete never interleave: the gate is checked right before the write."""
    ws = Workspace(tmp_path, "/workspace")
    try:
        base = ws.ensure_conversation("c1").path
        report = MarksReport(
            changed=[ChangedFile(path=f"{base}/outputs/a", status="modified")], presented=[]
        )
        with ws.deleting("c1"), pytest.raises(ConversationDeleting):
            ws.record_marks("c1", report)
        assert ws.marks.get("c1").modified == {}
        ws.record_marks("c1", report)
        assert f"{base}/outputs/a" in ws.marks.get("c1").modified
    finally:
        ws.close()


def test_forged_marks_documents_are_removed_at_start(runtime, tmp_path: Path) -> None:
    base = conversation_path(runtime, "c1")
    execute(runtime, "c1", "mkdir -p outputs && echo a > outputs/a.txt")
    record(runtime, "c1", presented=[f"{base}/outputs/a.txt"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_bytes(CANARY)
    runtime.server.stop(signal.SIGTERM)

    d = marks_dir(runtime)
    doc = {"conversation_id": "c2", "modified": [], "presented": [f"{base}/outputs/a.txt"]}

    def forge(name: str, value) -> Path:
        path = d / name
        path.write_text(value if isinstance(value, str) else json.dumps(value))
        return path

    forge(doc_name("c2"), {**doc, "conversation_id": "c1"})  # another's id (hash mismatch)
    forge(doc_name("c3"), "{not json")
    forge(doc_name("c4"), {**doc, "conversation_id": "c4", "presented": [1]})
    forge(doc_name("c8"), {**doc, "conversation_id": "c8", "modified": "x"})
    forge(doc_name(".hidden"), {**doc, "conversation_id": ".hidden"})
    forge("c9.json", {**doc, "conversation_id": "c9"})  # not named by its hash
    (d / doc_name("c5")).symlink_to(outside / "secret.json")
    os.mkfifo(d / doc_name("c6"))
    (d / doc_name("c7")).mkdir()

    restart(runtime)
    assert sorted(p.name for p in d.iterdir()) == [doc_name("c1")]
    assert (outside / "secret.json").read_bytes() == CANARY
    assert outputs(runtime, "c1")["a.txt"]["presented"] is True
    assert_healthy(runtime)


def test_marks_directory_replaced_while_running_heals_without_following(
    runtime, tmp_path: Path
) -> None:
    base = conversation_path(runtime, "c1")
    execute(runtime, "c1", "mkdir -p outputs && echo a > outputs/a.txt")
    record(runtime, "c1", presented=[f"{base}/outputs/a.txt"])
    outside = tmp_path / "outside"
    outside.mkdir()
    d = marks_dir(runtime)
    for p in d.iterdir():
        p.unlink()
    d.rmdir()
    d.symlink_to(outside)  # code (unconfined) points our state at a directory of its own

    r = record(runtime, "c1", changed=[(f"{base}/outputs/a.txt", "modified")])
    assert r.status_code == 200, r.text
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert d.is_dir() and not d.is_symlink()
    restart(runtime, signal.SIGKILL)
    a = outputs(runtime, "c1")["a.txt"]
    assert (a["modified"], a["presented"]) == (True, True)  # memory wrote back both
