"""runtime/tree.py: iterative walking and deletion against hostile trees, in-process.

Trees are built with ``*at`` calls relative to a descriptor (as hostile code can), so
depths far beyond PATH_MAX and Python's recursion limit are cheap to make.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_ops import fast_tmp_dir, unprivileged_argv

from sandbox_workspace.runtime import tree


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def make_chain(top: Path, depth: int, leaf: str = "bottom.txt") -> None:
    """top/d/d/d/.../leaf, ``depth`` directories deep."""
    fd = _open(top)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open(leaf, os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture
def fast_tmp(tmp_path: Path):
    d = Path(fast_tmp_dir(tmp_path))
    yield d
    fd = _open(d.parent)
    try:
        tree.remove_tree(fd, d.name)
    finally:
        os.close(fd)


def open_fds() -> dict[str, str]:
    """This process's open descriptors and what each points at ("?" when the kernel cannot
    name it, as for a directory deeper than PATH_MAX)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile (the listing's own descriptor)
        except OSError:
            fds[fd] = "?"
    return fds


def left_open_in(tree: Path, before: dict[str, str]) -> list[str]:
    """Descriptors opened since ``before`` on ``tree`` (or too deep to name). Counting all
    of them would be random: a thread an earlier test left (an event loop's socket) may
    open or close one of its own meanwhile."""
    return [
        target
        for fd, target in open_fds().items()
        if before.get(fd) != target
        and (target == "?" or target == str(tree) or target.startswith(f"{tree}/"))
    ]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "canary.txt").write_text("canary")
    return d


def remove(parent: Path, name: str) -> None:
    fd = _open(parent)
    try:
        tree.remove_tree(fd, name)
    finally:
        os.close(fd)


def walk(top: Path, max_entries: int = 1_000_000) -> tuple[list[str], bool]:
    fd = _open(top)
    try:
        w = tree.walk_files(fd, max_entries=max_entries)
        files = ["/".join(rel) for rel, _ in w]
        return files, w.complete
    finally:
        os.close(fd)


def test_deep_chain_is_walked_and_removed_without_recursion(fast_tmp: Path) -> None:
    """5,000 levels: far past the recursion limit and PATH_MAX; fds stay bounded."""
    depth = 5000
    assert depth > sys.getrecursionlimit()
    top = fast_tmp / "t"
    top.mkdir()
    make_chain(top, depth)
    before = open_fds()
    files, complete = walk(top)
    assert files == ["/".join(["d"] * depth + ["bottom.txt"])] and complete
    assert left_open_in(top, before) == []  # the walk closed every directory it opened
    remove(fast_tmp, "t")
    assert not top.exists()
    assert left_open_in(top, before) == []


def test_remove_tree_many_files_in_bounded_batches(fast_tmp: Path) -> None:
    """More entries than one read batch: deletion re-reads the directory until empty."""
    top = fast_tmp / "many"
    top.mkdir()
    fd = _open(top)
    for i in range(tree._BATCH * 2 + 1):
        os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    start = time.monotonic()
    remove(fast_tmp, "many")
    assert not top.exists()
    assert time.monotonic() - start < 10


def test_remove_tree_never_follows_symlinks(tmp_path: Path, outside: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "to-outside").symlink_to(outside, target_is_directory=True)
    (victim / "sub" / "to-file").symlink_to(outside / "canary.txt")
    (victim / "loop").symlink_to(".", target_is_directory=True)
    (victim / "dangling").symlink_to("/nonexistent/x")
    remove(tmp_path, "victim")
    assert not victim.exists()
    assert (outside / "canary.txt").read_text() == "canary"


def test_remove_tree_of_a_symlink_removes_only_the_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    remove(tmp_path, "link")
    assert not (tmp_path / "link").is_symlink()
    assert (outside / "canary.txt").read_text() == "canary"


def test_remove_tree_special_files_and_hostile_names(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    os.mkfifo(victim / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(victim / "sock"))
    sock.close()
    fd = _open(victim)
    os.mkdir(b"-rf", dir_fd=fd)
    for raw in (b"new\nline", b"\xff\xfe-not-utf8", b"x" * 255, b" lead", b"*", b"\\"):
        os.close(os.open(raw, os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    remove(tmp_path, "victim")
    assert not victim.exists()


def test_remove_tree_is_idempotent(tmp_path: Path) -> None:
    remove(tmp_path, "missing")
    (tmp_path / "f").write_text("x")
    remove(tmp_path, "f")
    remove(tmp_path, "f")
    assert not (tmp_path / "f").exists()


def test_walk_skips_links_fifos_and_loops(tmp_path: Path, outside: Path) -> None:
    top = tmp_path / "t"
    (top / "a").mkdir(parents=True)
    (top / "a" / "f.txt").write_text("x")
    (top / "a" / "loop").symlink_to("..", target_is_directory=True)
    (top / "out").symlink_to(outside, target_is_directory=True)
    (top / "file-link").symlink_to(outside / "canary.txt")
    os.mkfifo(top / "fifo")
    files, complete = walk(top)
    assert files == ["a/f.txt"] and complete


def test_walk_is_bounded_and_says_so(tmp_path: Path) -> None:
    top = tmp_path / "t"
    top.mkdir()
    for i in range(50):
        (top / f"f{i:02}").write_text("")
    files, complete = walk(top, max_entries=10)
    assert len(files) == 10 and not complete
    files, complete = walk(top, max_entries=50)
    assert len(files) == 50 and complete


def test_climbing_to_a_moved_parent_is_refused(tmp_path: Path) -> None:
    """'..' is checked against where we came from: a moved tree stops the walk."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    fd = _open(tmp_path / "a" / "b")
    a_ident = tree._ident(os.stat(tmp_path / "a"))
    os.rename(tmp_path / "a" / "b", tmp_path / "elsewhere" / "b")
    try:
        with pytest.raises(tree.TreeChanged):
            tree._climb(fd, a_ident)
    finally:
        os.close(fd)


def test_walk_entries_goes_on_when_code_moves_the_directory_it_is_in(tmp_path: Path) -> None:
    """Code moves the directory the walk is in (a loop of 'mv a/S b/S; mv b/S a/S'): the
    walk goes back down from the top and counts the rest. It used to end there, so what
    it had not visited yet was never counted — a way past the conversation's quota."""
    (tmp_path / "a" / "S" / "inner").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    for i in range(10):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "data").write_bytes(b"x")
    inner = os.stat(tmp_path / "a" / "S" / "inner").st_ino
    fd = _open(tmp_path)
    seen, moved = set(), False
    try:
        for st in tree.walk_entries(fd):
            seen.add(st.st_ino)
            if st.st_ino == inner and not moved:  # the walk is inside S now
                os.rename(tmp_path / "a" / "S", tmp_path / "b" / "S")
                moved = True
    finally:
        os.close(fd)
    assert moved
    data = {os.stat(tmp_path / f"d{i}" / "data").st_ino for i in range(10)}
    assert data <= seen, f"{len(data - seen)} of 10 files never counted"


# -- permissions: only meaningful without CAP_DAC_OVERRIDE (as in a pod) ---------------

_UNPRIVILEGED_REMOVE = """
import os, sys
from sandbox_workspace.runtime import tree
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
w = tree.walk_files(fd)
print(len(list(w)), w.complete)
tree.remove_tree(fd, sys.argv[2])
"""


_UNPRIVILEGED_LOCK_DURING_WALK = """
import os, sys
from sandbox_workspace.runtime import tree
top = sys.argv[1]
parent = os.path.join(top, "p")
depth3 = set()
for i in range(10):  # p/d{i}/data: whichever d the walk enters first, 9 are still to go
    os.makedirs(os.path.join(parent, f"d{i}"))
    with open(os.path.join(parent, f"d{i}", "data"), "wb") as f:
        f.write(b"x")
    depth3.add(os.stat(os.path.join(parent, f"d{i}", "data")).st_ino)
fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
seen, locked = set(), False
for st in tree.walk_entries(fd, reclaim=True):
    seen.add(st.st_ino)
    if st.st_ino in depth3 and not locked:  # the walk is in a d: code locks p
        os.chmod(parent, 0o000)
        locked = True
print(len(depth3 & seen))
"""


def test_walk_entries_goes_on_when_code_locks_a_directory_it_is_in(tmp_path: Path) -> None:
    """Without permission-bypassing capabilities (a pod): code takes r-x away from a
    directory the walk is inside; the climb back fails, and the walk goes back down from
    the top, reclaiming the mode. It used to end there (what was still to visit never
    counted: a way past the quota)."""
    argv = [*unprivileged_argv(), sys.executable, "-c", _UNPRIVILEGED_LOCK_DURING_WALK]
    out = subprocess.run([*argv, str(tmp_path)], capture_output=True, text=True, timeout=60)
    (tmp_path / "p").chmod(0o700)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10"]


def test_remove_tree_unprivileged_handles_directories_code_locked(tmp_path: Path) -> None:
    """Modes 000, 500 (no write), 600 (no search) at several depths, and a deep chain
    under a 000 directory: all removed by a process that cannot bypass permissions."""
    victim = tmp_path / "victim"
    for sub in ("locked/inner", "readonly/inner", "nosearch/inner", "deep"):
        (victim / sub).mkdir(parents=True)
        (victim / sub / "f.txt").write_text("x")
    make_chain(victim / "deep", 300)
    (victim / "locked" / "inner").chmod(0)
    (victim / "locked").chmod(0)
    (victim / "readonly").chmod(0o500)
    (victim / "nosearch").chmod(0o600)
    (victim / "deep").chmod(0)
    victim.chmod(0o500)
    argv = [*unprivileged_argv(), sys.executable, "-c", _UNPRIVILEGED_REMOVE]
    out = subprocess.run(
        [*argv, str(tmp_path), "victim"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # The read-only walk could not enter the locked directories, and said so.
    assert out.stdout.split()[1] == "False"
    assert not victim.exists()
