"""``output_batch.read_outputs``: many small outputs in one framed answer, each through
the same path rules as a single download (no link followed), bounded in bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_workspace.runtime.output_batch import read_outputs
from sandbox_workspace.runtime.output_frames import Frame, parse_frames
from sandbox_workspace.runtime.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path):
    ws = Workspace(tmp_path / "root", "/workspace")
    ws.ensure_conversation("c1")
    yield ws
    ws.close()


def test_frames_hold_each_file_or_say_why_not(ws, tmp_path: Path) -> None:
    out = Path(ws.real_path("c1")) / "outputs"
    (out / "sub").mkdir()
    (out / "a.txt").write_bytes(b'alpha\n{"x":1}\n')  # newlines and JSON in the bytes
    (out / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (out / "empty").write_bytes(b"")
    (out / "big").write_bytes(b"x" * 2000)
    (tmp_path / "secret").write_bytes(b"other conversation's")
    os.symlink(tmp_path / "secret", out / "link")
    paths = ["a.txt", "sub/b.bin", "empty", "gone", "../../x", "link", "big", "sub/b.bin"]
    frames = parse_frames(b"".join(read_outputs(ws, "c1", paths, 10_000, per_file=1000)))
    assert frames == [
        Frame("a.txt", b'alpha\n{"x":1}\n'),
        Frame("sub/b.bin", bytes(range(256))),
        Frame("empty", b""),
        Frame("gone", None, "not_found"),
        Frame("../../x", None, "invalid_path"),
        Frame("link", None, "invalid_path"),
        Frame("big", None, "too_large"),
        Frame("sub/b.bin", bytes(range(256))),
    ]
    # The answer's bytes are bounded: what does not fit is named, not sent.
    frames = parse_frames(b"".join(read_outputs(ws, "c1", ["sub/b.bin"] * 3, 600)))
    assert [f.error for f in frames] == [None, None, "over_budget"]
