"""E2B ``write_files`` under hostile names and bytes (``write_many``: the JSON argument
in shell-quoted pieces, batches packed to the code bound): every name and byte lands as
given, nothing of them runs, the largest file under the longest path is a clear 4xx,
and a symlink code left in the way reaches nothing outside the conversation."""

from __future__ import annotations

import os
import tempfile

import pytest
from e2b.exceptions import InvalidArgumentException, SandboxException
from e2b_sandboxes import e2b_sandbox
from script_files import script_files

from sandbox_workspace.api.e2b.envd import MAX_WRITE_BYTES

KEY = "e2b_" + "5d" * 16

HOSTILE = [
    "q'uote.txt",
    "$(touch pwned-subst).txt",
    "`touch pwned-tick`.txt",
    "-leading-dash.txt",
    "--help",
    "back\\slash.txt",
    "sp ace; touch pwned-semi.txt",
    "uni-é✓𝄞.txt",
    "'$'\\n'; exit 3 #",
    "a" * 255,
]


@pytest.fixture
def sandbox(dev_server):
    with e2b_sandbox(dev_server.url, KEY) as sbx:
        yield sbx


def test_hostile_names_and_bytes_land_verbatim_and_nothing_runs(sandbox):
    head = b"'$(touch pwned-data)`id`\"\\\n"
    data = [head + bytes(range(256)) + bytes([i]) for i in range(len(HOSTILE))]
    entries = [{"path": f"h/{name}", "data": d} for name, d in zip(HOSTILE, data, strict=True)]
    written = sandbox.files.write_files(entries)
    assert [w.path for w in written] == [f"/home/user/h/{name}" for name in HOSTILE]
    for name, d in zip(HOSTILE, data, strict=True):
        assert sandbox.files.read(f"h/{name}", format="bytes") == d, name
    listing = sandbox.commands.run("find . -name 'pwned*' | wc -l").stdout.strip()
    assert listing == "0"
    # A multipart file name carries no '"' nor newline as such (the form encoding
    # escapes them): one file at a time, its path in the query, gets them through.
    for name in ('dq"uote\n$(touch pwned-q)', "nl\n`touch pwned-nl`"):
        sandbox.files.write(f"h/{name}", data[0])
        assert sandbox.files.read(f"h/{name}", format="bytes") == data[0], name
    assert sandbox.commands.run("find . -name 'pwned*' | wc -l").stdout.strip() == "0"


def test_the_largest_file_under_the_longest_quoted_path_is_a_clear_4xx(sandbox):
    # 4095 bytes of quotes and slashes: each quote is five bytes of shell quoting, so
    # the program's code outgrows the 256 KiB an execution may have.
    path = "/".join(["'" * 255] * 16)[:4095]
    data = b"x" * MAX_WRITE_BYTES
    with pytest.raises(SandboxException, match="its path exceed") as raised:
        sandbox.files.write_files(
            [{"path": "before.txt", "data": b"1"}, {"path": path, "data": data}]
        )
    assert str(raised.value).startswith("413"), raised.value
    assert not sandbox.files.exists("before.txt")  # refused before anything was written
    # The same file under a short path is written.
    sandbox.files.write("short.bin", data)
    assert sandbox.files.read("short.bin", format="bytes") == data


def test_a_symlink_code_left_reaches_nothing_outside(sandbox, dev_server):
    outside = tempfile.mkdtemp(prefix="sbw-outside-")
    os.chmod(outside, 0o777)
    target = os.path.join(outside, "planted")
    # Another sandbox of the same key: another conversation of the same session (its
    # end deletes the session, this sandbox's too: every check is made before).
    with e2b_sandbox(dev_server.url, KEY) as other:
        other.files.write("mine.txt", b"mine")
        theirs = other.commands.run("pwd").stdout.strip()
        sandbox.commands.run(
            f"ln -s {outside} esc && ln -s {target} file-link && ln -s {theirs} sibling"
        )
        entries = [("esc/planted", b"escaped"), ("file-link", b"escaped"),
                   ("sibling/mine.txt", b"overwritten"), ("sibling/new.txt", b"new")]  # fmt: skip
        for path, data in entries:
            # A 400 naming the file it stopped at (an OSError's message named none).
            with pytest.raises(InvalidArgumentException, match=f"^{path}: PermissionError"):
                sandbox.files.write_files([{"path": "ok.txt", "data": b"ok"},
                                           {"path": path, "data": data}])  # fmt: skip
        assert other.files.read("mine.txt") == "mine"
        assert not other.files.exists("new.txt")
        assert sandbox.files.read("ok.txt") == "ok"  # the files before it were written
    assert os.listdir(outside) == []


@pytest.fixture(scope="module")
def capped_server(start_server):
    return start_server(
        "dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_LIMITS__CONVERSATION_SIZE="4Mi",
    )  # fmt: skip


def test_a_write_into_a_conversation_over_its_quota_is_a_clear_4xx(capped_server):
    with e2b_sandbox(capped_server.url, "e2b_" + "6e" * 16) as sandbox:
        sandbox.files.write("kept.txt", b"kept")
        sandbox.commands.run("head -c 6M /dev/zero > fill.bin || true")
        entries = [{"path": "a.txt", "data": b"a"}, {"path": "b.txt", "data": b"b"}]
        with pytest.raises(SandboxException) as raised:
            sandbox.files.write_files(entries)
        # A 413 naming the quota (it was a 400 "PermissionError: Permission denied").
        assert str(raised.value).startswith("413: a.txt: ") and "quota of 4 MiB" in str(
            raised.value
        ), raised.value
        # A large command runs frozen (its file refused) and leaves no script file open.
        big = sandbox.commands.run("#" * 120_000 + "\necho x > new.txt || echo refused")
        assert big.stdout == "refused\n"
        assert script_files(capped_server.proc.pid) == []
        sandbox.commands.run("rm fill.bin")  # deleting still works; then writes do
        sandbox.files.write_files(entries)
        assert sandbox.files.read("b.txt") == "b"
        assert sandbox.files.read("kept.txt") == "kept"


def test_modules_code_left_in_home_take_no_part_in_file_calls(sandbox):
    """The file program ran ``python3 -c`` from home: the cwd first on ``sys.path``, so
    a ``datetime.py`` (or ``json.py``, ``base64.py``…) there — code's, or just the user's
    own file of that name — ran inside every file call: it could forge the answer (500s:
    "'int' object is not iterable") or break every read, write and listing."""
    forged = "import pathlib; pathlib.Path('ran-{0}').touch(); print('{{\"ok\": 5}}')\n"
    modules = ["datetime", "json", "base64", "shutil", "stat"]
    sandbox.files.write_files(
        [{"path": f"{m}.py", "data": forged.format(m)} for m in modules]
        + [{"path": "sitecustomize.py", "data": forged.format("site")}]
    )
    assert sandbox.files.write("x.txt", "x").path == "/home/user/x.txt"
    written = sandbox.files.write_files([{"path": "a", "data": b"a"}, {"path": "b", "data": b"b"}])
    assert [w.name for w in written] == ["a", "b"]
    assert sandbox.files.read("x.txt") == "x"
    assert {e.name for e in sandbox.files.list(".")} >= {"x.txt", "a", "b", "json.py"}
    assert sandbox.commands.run("ls ran-* 2>/dev/null | wc -l").stdout.strip() == "0"
