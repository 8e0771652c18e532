"""Scratch roots are recorded in the runtime's state and a dead runtime's is removed
(runtime/scratch.py) — but a record is trusted only as far as it names the very
directory a runtime made: a symlink, a stranger's directory, a look-alike elsewhere, a
parent others could swap entries of, a malformed or oversized record delete nothing."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from sandbox_workspace.runtime import scratch
from sandbox_workspace.runtime.pathsafe import SafeRoot
from sandbox_workspace.runtime.scratch import Root, ScratchLeft, ScratchRecords, remove_recorded
from sandbox_workspace.runtime.state import StateDir


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory scratch roots are made in: sticky and world-writable, as
    /tmp is, but the test's own."""
    d = tmp_path / "tmp"
    d.mkdir()
    d.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


def _records(workspace: Path) -> ScratchRecords:
    return ScratchRecords(StateDir(SafeRoot(workspace)))


def _recorded(workspace: Path) -> list[Root]:
    raw = (workspace / ".runtime" / scratch.RECORD).read_bytes()
    return [Root(**r) for r in json.loads(raw)]


def _record(workspace: Path, roots: list[dict]) -> None:
    (workspace / ".runtime" / scratch.RECORD).write_text(json.dumps(roots))


def _as_recorded(path: Path) -> dict:
    st = os.stat(path, follow_symlinks=False)
    return {"path": str(path), "dev": st.st_dev, "ino": st.st_ino}


def _fill(root: Path, depth: int = 300) -> Path:
    """Code's leftovers: files, a deep tree, a locked directory, a link out."""
    (root / "c" / "pip-cache").mkdir(parents=True)
    (root / "c" / "pip-cache" / "wheel").write_bytes(b"x" * 1000)
    deep = root / "c"
    for _ in range(depth):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (root / "c" / "locked").mkdir()
    (root / "c" / "locked" / "f").write_text("f")
    (root / "c" / "locked").chmod(0)
    (root / "c" / "out").symlink_to("/")
    return root


def test_a_runtime_start_removes_what_a_killed_one_left_and_records_its_own(temp, workspace):
    first = Path(_records(workspace).create())  # then SIGKILLed: no release
    assert first.parent == temp and first.name.startswith(scratch.PREFIX)
    assert (first.stat().st_mode & 0o777) == 0o700
    _fill(first)
    second = Path(_records(workspace).create())
    assert not first.exists() and second.is_dir()
    assert _recorded(workspace) == [Root(**_as_recorded(second))]


def test_a_clean_stop_removes_and_forgets_its_root(temp, workspace):
    records = _records(workspace)
    root = Path(records.create())
    _fill(root)
    records.release(str(root))
    assert not root.exists() and _recorded(workspace) == []


def test_leftovers_go_while_the_runtime_is_down(temp, workspace):
    root = _fill(Path(_records(workspace).create()))
    _records(workspace).remove_leftovers()  # the local backend's offline deletion
    assert not root.exists() and _recorded(workspace) == []


def test_a_deleted_session_takes_its_recorded_roots(temp, workspace):
    root = _fill(Path(_records(workspace).create()))
    remove_recorded(workspace)
    assert not root.exists()
    remove_recorded(workspace)  # again: nothing to do
    remove_recorded(workspace / "missing")  # no workspace at all


def test_a_symlinked_state_directory_is_not_followed(temp, workspace, tmp_path):
    root = Path(_records(workspace).create())
    elsewhere = tmp_path / "elsewhere"
    (workspace / ".runtime").rename(elsewhere)
    (workspace / ".runtime").symlink_to(elsewhere)
    remove_recorded(workspace)
    assert root.is_dir()


def _victim(tmp_path: Path, name: str = "victim") -> Path:
    victim = tmp_path / name
    victim.mkdir()
    (victim / "precious").write_text("keep")
    return victim


def _symlink_at_the_path(temp: Path, victim: Path) -> tuple[dict, Path]:
    link = temp / f"{scratch.PREFIX}link"
    link.symlink_to(victim)  # the victim's identity, a scratch root's name
    return {**_as_recorded(victim), "path": str(link)}, victim


def _not_a_scratch_name(temp: Path, victim: Path) -> tuple[dict, Path]:
    return _as_recorded(victim), victim


def _dot_dot(temp: Path, victim: Path) -> tuple[dict, Path]:
    path = f"{temp}/../{victim.name}/../{scratch.PREFIX}a"
    return {**_as_recorded(victim), "path": path}, victim


def _relative(temp: Path, victim: Path) -> tuple[dict, Path]:
    return {**_as_recorded(victim), "path": f"{scratch.PREFIX}a"}, victim


def _another_identity(temp: Path, victim: Path) -> tuple[dict, Path]:
    look_alike = temp / f"{scratch.PREFIX}look"
    victim.rename(look_alike)  # ours, well named, where roots are made: not the one made
    return {**_as_recorded(look_alike), "ino": 1}, look_alike


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(_symlink_at_the_path, id="symlink-at-the-recorded-path"),
        pytest.param(_not_a_scratch_name, id="not-a-scratch-name"),
        pytest.param(_dot_dot, id="dot-dot"),
        pytest.param(_relative, id="relative"),
        pytest.param(_another_identity, id="another-device-inode"),
    ],
)
def test_a_forged_record_deletes_nothing(temp, workspace, tmp_path, forge):
    _records(workspace)  # the state directory
    record, survivor = forge(temp, _victim(tmp_path))
    _record(workspace, [record])
    root = Path(_records(workspace).create())
    assert (survivor / "precious").read_text() == "keep"
    assert _recorded(workspace) == [Root(**_as_recorded(root))]  # the forgery is dropped


def test_an_exact_record_outside_the_temporary_directory_is_only_what_we_made(
    temp, workspace, tmp_path
):
    """Any parent is accepted: the identity is what counts. A record naming a directory
    elsewhere passes only if that is a scratch-named directory of ours with the recorded
    device and inode — which only our own runtime made (or code running as us, unconfined,
    which could delete it itself)."""
    _records(workspace)
    ours = tmp_path / f"{scratch.PREFIX}elsewhere"
    ours.mkdir(mode=0o700)
    _record(workspace, [_as_recorded(ours)])
    _records(workspace).create()
    assert not ours.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("reused", [False, True], ids=["ours-chowned", "name-taken-since"])
def test_a_directory_of_another_user_at_the_recorded_path_is_left_alone(temp, workspace, reused):
    root = Path(_records(workspace).create())
    if reused:
        # Removed by some cleaner; another user made a directory of that name since (the
        # file system may well give it the same inode number: the owner tells them apart).
        os.rmdir(root)
        root.mkdir()
    (root / "theirs").write_text("x")
    os.chown(root, 65534, 65534)
    _records(workspace).create()
    assert (root / "theirs").exists()


def test_a_parent_others_may_rename_in_is_not_trusted(temp, workspace):
    root = Path(_records(workspace).create())
    (root / "f").write_text("x")
    temp.chmod(0o777)  # world-writable, not sticky: another user could swap the entry
    _records(workspace).create()
    assert (root / "f").exists()


@pytest.mark.parametrize(
    "junk",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(b'{"path": "/"}', id="not-a-list"),
        pytest.param(b'[{"path": "/"}, 7, null]', id="malformed-entries"),
        pytest.param(b"[" + b" " * (scratch._MAX_RECORD_BYTES + 1) + b"]", id="oversized"),
    ],
)
def test_a_junk_record_is_ignored_and_replaced(temp, workspace, junk):
    _records(workspace)
    (workspace / ".runtime" / scratch.RECORD).write_bytes(junk)
    root = Path(_records(workspace).create())
    assert _recorded(workspace) == [Root(**_as_recorded(root))]


def test_a_record_that_is_a_symlink_is_not_read(temp, workspace, tmp_path):
    _records(workspace)
    victim = _victim(tmp_path, scratch.PREFIX + "v")
    outside = tmp_path / "forged.json"
    outside.write_text(json.dumps([_as_recorded(victim)]))
    (workspace / ".runtime" / scratch.RECORD).symlink_to(outside)
    _records(workspace).create()
    assert (victim / "precious").exists()


def test_a_root_that_could_not_be_removed_stays_recorded(temp, workspace, monkeypatch):
    root = Path(_records(workspace).create())
    records = _records(workspace)

    def failing(root: Root) -> None:
        raise PermissionError(13, "Permission denied", root.path)

    monkeypatch.setattr(scratch, "remove_root", failing)
    second = Path(records.create())  # a start goes on: logged, kept
    assert {r.path for r in _recorded(workspace)} == {str(root), str(second)}
    with pytest.raises(ScratchLeft):
        records.remove_leftovers()  # a deletion says so (503, retry)
    with pytest.raises(ScratchLeft):
        remove_recorded(workspace)
    monkeypatch.undo()
    remove_recorded(workspace)
    assert not root.exists() and not second.exists()


def test_a_root_that_is_not_the_private_directory_just_made_is_refused(
    temp, workspace, monkeypatch
):
    """mkdtemp's directory swapped before it was looked at (a temporary directory that is
    not sticky): code would write into a stranger's directory — the start fails instead."""
    swapped = temp / f"{scratch.PREFIX}swapped"
    swapped.mkdir(mode=0o755)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(swapped))
    with pytest.raises(OSError, match="not the private directory"):
        _records(workspace).create()
