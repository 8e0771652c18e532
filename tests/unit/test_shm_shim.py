"""runtime/shm.py and its preload library: built once, found prebuilt, and what it does
to POSIX names (unconfined here: the API tier runs it under Landlock)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_workspace.runtime import shm

needs_cc = pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    path = shm.library(shm.SOURCE, tmp_path_factory.mktemp("shim") / "sbw_shm.so")
    assert path is not None
    return path


def _run(built: str, directory: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LD_PRELOAD": built, "SBW_SHM_DIR": str(directory)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


@needs_cc
def test_semaphores_and_segments_land_in_the_directory(built: str, tmp_path: Path) -> None:
    code = """
import _multiprocessing, _posixshmem, os
sem = _multiprocessing.SemLock(1, 1, 1, "/sbw-unit", False)
fd = _posixshmem.shm_open("/sbw-unit-seg", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
print(sorted(os.listdir(os.environ["SBW_SHM_DIR"])))
try:
    _multiprocessing.SemLock(1, 1, 1, "/sbw-unit", False)
except FileExistsError:
    print("exists")
for bad in ("/a/b", "/", "/.."):
    try:
        _posixshmem.shm_open(bad, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as e:
        print(e.errno)
_multiprocessing.sem_unlink("/sbw-unit"); _posixshmem.shm_unlink("/sbw-unit-seg")
print(os.listdir(os.environ["SBW_SHM_DIR"]))
"""
    out = _run(built, tmp_path / "shm", code)
    assert out.stdout.splitlines() == [
        "['sbw-unit-seg', 'sem.sbw-unit']", "exists", "22", "22", "22", "[]",
    ], out.stderr  # fmt: skip


@needs_cc
def test_without_a_directory_glibc_answers(built: str, tmp_path: Path) -> None:
    env = {**os.environ, "LD_PRELOAD": built}
    env.pop("SBW_SHM_DIR", None)
    code = "import multiprocessing; multiprocessing.Lock(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout == "ok\n", out.stderr  # /dev/shm, as without the library


def test_a_prebuilt_library_is_used_without_a_compiler(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert shm.library(shm.SOURCE, tmp_path / "missing.so") is None
    prebuilt = tmp_path / "prebuilt.so"
    prebuilt.write_bytes(b"")
    os.utime(prebuilt, (0, 0))  # older than the source, as an image's COPY may make it
    assert shm.library(shm.SOURCE, prebuilt) == str(prebuilt)
    assert shm.environment(None, "/scratch") == {}
    assert shm.environment("/lib.so", "/scratch") == {
        "LD_PRELOAD": "/lib.so", "SBW_SHM_DIR": "/scratch/shm",
    }  # fmt: skip
