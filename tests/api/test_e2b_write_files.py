"""E2B's ``write_files`` of many files through the official SDK: one multipart request,
written by as few file programs as the code's size allows (``write_batches``), each file
at its path with its bytes, an error naming the file the write stopped at."""

from __future__ import annotations

import hashlib
import json
import os
import shlex

import pytest
from e2b.exceptions import InvalidArgumentException
from e2b_sandboxes import e2b_sandbox

from sandbox_workspace.api.e2b.conversation import FS_PROGRAM, fs_code, write_batches
from sandbox_workspace.api.e2b.envd import MAX_WRITE_BYTES, WRITE_BATCH_BYTES

KEY = "e2b_" + "7a" * 16


@pytest.fixture
def sandbox(dev_server):
    with e2b_sandbox(dev_server.url, KEY) as sbx:
        yield sbx


def test_many_files_in_one_upload_land_each_at_its_path(sandbox):
    # 300 files of 1 KiB each plus three of 120 KiB: more than one program's code holds.
    entries = [{"path": f"batch/d{i % 7}/f{i}.bin", "data": bytes([i % 251]) * 1024}
               for i in range(300)]  # fmt: skip
    entries += [{"path": f"big/{n}.bin", "data": n.encode() * (120 << 10)} for n in "xyz"]
    written = sandbox.files.write_files(entries)
    assert [w.path for w in written] == [f"/home/user/{e['path']}" for e in entries]
    sums = sandbox.commands.run(
        "cd batch && find . -type f | wc -l && cat d3/f3.bin | sha256sum && "
        "cat ../big/z.bin | wc -c"
    ).stdout.split()
    assert sums[0] == "300"
    assert sums[1] == hashlib.sha256(bytes([3]) * 1024).hexdigest()
    assert sums[3] == str(120 << 10)
    assert sandbox.files.read("big/y.bin", format="bytes") == b"y" * (120 << 10)


def test_an_upload_stops_at_the_file_it_cannot_write_and_says_which(sandbox):
    sandbox.files.make_dir("blocked")
    sandbox.commands.run("mkdir -p blocked/dir")
    entries = [
        {"path": "first.txt", "data": b"1"},
        {"path": "blocked/dir", "data": b"2"},  # a directory is there
        {"path": "third.txt", "data": b"3"},
    ]
    with pytest.raises(InvalidArgumentException, match="blocked/dir"):
        sandbox.files.write_files(entries)
    assert sandbox.files.read("first.txt") == "1"
    assert not sandbox.files.exists("third.txt")


def test_batches_keep_the_order_and_each_fits_its_budget():
    files = [(f"p{i}/{'q' * (i % 40)}'s.bin", "A" * (i * 997 % 30000)) for i in range(400)]
    batches = write_batches(files, WRITE_BATCH_BYTES)
    assert [f for batch in batches for f in batch] == files
    assert len(batches) > 1
    for batch in batches:
        argument = {"op": "write_many", "path": "", "files": [
            {"path": p, "data": d} for p, d in batch]}  # fmt: skip
        assert len(fs_code(argument).encode()) <= WRITE_BATCH_BYTES
        assert fs_code(argument).startswith(f"python3 -I -c {shlex.quote(FS_PROGRAM)} ")
    # A file alone past the budget is a batch of its own (its size is bounded before).
    huge = [("a", "B" * 10), ("h", "H" * WRITE_BATCH_BYTES), ("z", "C" * 10)]
    assert write_batches(huge, WRITE_BATCH_BYTES) == [[huge[0]], [huge[1]], [huge[2]]]
    assert json.loads(json.dumps(batches[0][0]))  # plain data, ready for the program


def test_a_file_of_the_largest_size_written_is_read_back_whole(sandbox):
    # Past 96 KiB its base64 was one argument over execve's 128 KiB: "file operation
    # failed" (a 502) for every file between ~96 KB and the ~186 KB documented.
    data = os.urandom(MAX_WRITE_BYTES)
    sandbox.files.write("largest.bin", data)
    assert sandbox.files.read("largest.bin", format="bytes") == data
    with pytest.raises(Exception, match="not supported yet"):
        sandbox.files.write("past.bin", data + b"x")
