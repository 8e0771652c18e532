"""Deleting a conversation whatever its code did to it, against a real runtime process.

The runtime runs without the capabilities that bypass permission checks (as in a pod:
non-root, no capabilities), so a directory code made mode 000 really is locked. Trees
that only the set-up needs fast (100,000 files) are made by the test process with
``*at`` calls on a tmpfs root; trees code makes are made through ``/execute``. After
each deletion: the directory and the conversation's metadata are gone, nothing outside
or in a neighbour changed, and upload, list, download and execute still work.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from runtime_ops import (
    assert_healthy,
    execute,
    fast_tmp_dir,
    listed,
    restart,
    unprivileged_argv,
)

from sandbox_workspace.runtime import tree


@pytest.fixture
def hostile(runtime, tmp_path: Path):
    """The runtime, unprivileged, on a fast (tmpfs) root when the machine has one."""
    root = Path(fast_tmp_dir(tmp_path))
    runtime.server.stop(signal.SIGTERM)
    argv = runtime.server.argv
    argv[argv.index("--root") + 1] = str(root)
    runtime.server.argv = [*unprivileged_argv(), *argv]
    runtime.root = root
    runtime.server.env["SANDBOX_RUNTIME_MAX_FILE_COUNT"] = "1000"  # the race uploads many
    restart(runtime)
    yield runtime
    runtime.server.stop(signal.SIGTERM)
    parent = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tree.remove_tree(parent, root.name)  # gives back modes code took, never follows links
    finally:
        os.close(parent)


def delete(runtime, cid: str) -> dict:
    r = runtime.client.delete(f"/v1/conversations/{cid}", timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exists"] is False
    assert not os.path.lexists(runtime.root / cid)
    assert not os.path.lexists(runtime.root / ".runtime" / "meta" / cid)
    return body


def snapshot(path: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            out[p] = (
                os.readlink(p)
                if os.path.islink(p)
                else (Path(p).read_bytes() if os.path.isfile(p) else "dir")
            )
    return out


def test_delete_a_tree_2500_levels_deep_made_by_code(hostile) -> None:
    hostile.upload("c1", "a.csv", b"1,2")
    result = execute(
        hostile,
        "c1",
        "import os\nos.chdir('outputs')\n"
        "for _ in range(2500):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('bottom.txt', 'w').write('deep')\nos.chdir('/')",
        language="python",
    )
    assert result["exit_code"] == 0, result
    # Walks are iterative too: counting and listing answer, and see the bottom file.
    info = hostile.client.get("/v1/conversations/c1").json()
    assert (info["file_count"], info["complete"]) == (2, True)
    outs = hostile.client.get("/v1/conversations/c1/outputs").json()
    assert [f["relative_path"].count("/") for f in outs["files"]] == [2500]
    assert delete(hostile, "c1")["deleted"] is True
    assert_healthy(hostile)


def test_delete_100k_files_and_list_them_first(hostile) -> None:
    """100,000 files in outputs: the outputs listing stays bounded, counting answers,
    deletion finishes, and each step is timed."""
    assert hostile.client.put("/v1/conversations/c1").status_code == 200
    many = hostile.root / "c1" / "outputs" / "many"
    many.mkdir()
    start = time.monotonic()
    fd = os.open(many, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(100_000):
            os.close(os.open(f"f{i:06}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    made = time.monotonic() - start

    start = time.monotonic()
    outs = hostile.client.get("/v1/conversations/c1/outputs").json()
    listing = time.monotonic() - start
    assert outs["truncated"] is True and len(outs["files"]) == 2000
    info = hostile.client.get("/v1/conversations/c1").json()
    assert info["file_count"] == 100_000 and info["complete"] is True

    start = time.monotonic()
    delete(hostile, "c1")
    deleting = time.monotonic() - start
    print(f"100k files: made {made:.2f}s, outputs listing {listing:.2f}s, deleted {deleting:.2f}s")
    assert listing < 5
    assert_healthy(hostile)


LOCKING_CODE = r"""
set -e
mkdir -p outputs/a/b/c uploads/temparea/sub/inner "outputs/new
line" outputs/-rf
echo x > outputs/a/b/c/f.txt; echo y > uploads/temparea/sub/inner/g.txt
mkfifo outputs/a/fifo
python3 -c "import os, stat; os.mknod('outputs/a/sock', stat.S_IFSOCK | 0o600)"
ln -s / outputs/a/root-link; ln -s ../../c2 outputs/a/neighbour; ln -s "$OUTSIDE" outside-link
ln -s . outputs/loop
ln uploads/temparea/keep.csv outputs/hardlink.csv
touch "outputs/$(printf '\xff\xfe')-not-utf8"
chmod 000 outputs/a/b/c outputs/a/b uploads/temparea/sub/inner
chmod 500 outputs/a uploads/temparea/sub
chmod 600 "outputs/new
line"
chmod 000 outputs uploads/temparea
chmod 000 .
"""


def test_delete_what_code_locked_linked_and_scattered(hostile, tmp_path: Path) -> None:
    """Modes 000/500/600 at every level (the conversation directory itself included),
    FIFOs, sockets, links to /, to a neighbour and outside, a hard link of an upload,
    odd names: all of it goes; the neighbour, the link targets and the outside stay."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("canary")
    assert hostile.upload("c1", "keep.csv", b"c1 data").status_code == 201
    assert hostile.upload("c2", "other.csv", b"c2 data").status_code == 201
    before_c2, before_outside = snapshot(hostile.root / "c2"), snapshot(outside)
    code = LOCKING_CODE.replace("$OUTSIDE", str(outside))
    result = execute(hostile, "c1", code)
    assert result["exit_code"] == 0, result
    assert stat.S_IMODE((hostile.root / "c1").stat().st_mode) == 0

    # Counting a locked tree answers (not a 5xx) and says it is partial.
    info = hostile.client.get("/v1/conversations/c1")
    assert info.status_code == 200, info.text
    assert info.json()["complete"] is False
    # The upload is still the user's: the runtime takes back its own directories.
    assert listed(hostile, "c1") == ["keep.csv"]
    r = hostile.client.get("/v1/conversations/c1/uploads/keep.csv")
    assert r.status_code == 200 and r.content == b"c1 data"
    assert hostile.client.get("/v1/conversations/c1/outputs").status_code == 200

    assert delete(hostile, "c1")["deleted"] is True
    assert snapshot(hostile.root / "c2") == before_c2
    assert snapshot(outside) == before_outside
    assert listed(hostile, "c2") == ["other.csv"]
    assert_healthy(hostile)


def test_uploads_racing_a_deletion_never_survive_it(hostile) -> None:
    """Uploads and executions sent while a deletion runs answer 409 conversation_deleting
    and leave nothing; one that answers 201 committed after the deletion and is whole."""
    assert hostile.client.put("/v1/conversations/c1").status_code == 200
    bulk = hostile.root / "c1" / "outputs" / "bulk"
    bulk.mkdir()
    fd = os.open(bulk, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(40_000):  # enough that the deletion takes a while
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)

    deleted: list = []
    deleter = threading.Thread(target=lambda: deleted.append(delete(hostile, "c1")))
    deleter.start()
    deadline = time.monotonic() + 30
    while hostile.client.put("/v1/conversations/c1").status_code != 409:
        assert time.monotonic() < deadline, "the deletion gate was never observed"

    def attempt(i: int):
        if i % 8 == 0:
            return None, hostile.client.post(
                "/v1/conversations/c1/execute", json={"language": "bash", "code": "touch x"}
            )
        name = f"race-{i}.txt"
        return name, hostile.upload("c1", name, f"payload {i}".encode())

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(48)))
    deleter.join(timeout=120)
    assert deleted, "the deletion did not answer"

    statuses = [r.status_code for _, r in results]
    assert set(statuses) <= {200, 201, 409}, statuses
    refused = [(n, r) for n, r in results if r.status_code == 409]
    assert refused, "no attempt landed inside the deletion window"
    assert all(r.json()["error"]["code"] == "conversation_deleting" for _, r in refused)
    assert not bulk.exists()
    names = set(listed(hostile, "c1"))
    temparea = hostile.root / "c1" / "uploads" / "temparea"
    on_disk = set(os.listdir(temparea)) if temparea.exists() else set()
    for name, r in results:
        if name is None:
            continue
        if r.status_code == 201:  # committed after the deletion: present and whole
            assert name in names and (temparea / name).read_bytes() == r.request.content
        else:
            assert name not in names and name not in on_disk
    assert on_disk == names
    assert os.listdir(hostile.root / ".runtime" / "staging") == []
    assert_healthy(hostile)


def test_hostile_outputs_keep_listing_and_counting_bounded(hostile) -> None:
    """A symlink loop, links to / and a FIFO in outputs: the listing and the count answer
    at once and show only real files."""
    code = (
        "mkdir -p outputs/x && echo hi > outputs/x/real.txt && ln -s .. outputs/x/up && "
        "ln -s / outputs/root && ln -s outputs outputs/self && mkfifo outputs/pipe"
    )
    assert execute(hostile, "c1", code)["exit_code"] == 0
    start = time.monotonic()
    outs = hostile.client.get("/v1/conversations/c1/outputs").json()
    assert [f["relative_path"] for f in outs["files"]] == ["x/real.txt"]
    info = hostile.client.get("/v1/conversations/c1").json()
    assert info["file_count"] == 1 and info["complete"] is True
    assert time.monotonic() - start < 5
    delete(hostile, "c1")
    shutil.rmtree(hostile.root / "health-check", ignore_errors=True)
    assert_healthy(hostile)
