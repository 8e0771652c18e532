"""With bubblewrap, the local backend shows each session's workspace at /workspace."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="bubblewrap/nsenter not installed (make test installs bubblewrap where it can)",
)


@pytest.fixture(scope="module")
def bwrap_server(start_server):
    return start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="bwrap")


def _is_bwrap(pid: int) -> bool:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"bwrap")


def runtime_python_pid(session_dir: Path, runtime_pids) -> int:
    """The runtime below the session's bwrap (its own argv names no host path: it
    listens on a socket inside the sandbox)."""
    pending = [pid for pid in runtime_pids(session_dir) if _is_bwrap(pid)]
    found = set()
    while pending:
        pid = pending.pop()
        if not _is_bwrap(pid):
            found.add(pid)
            continue
        for task in Path(f"/proc/{pid}/task").iterdir():
            pending += [int(c) for c in (task / "children").read_text().split()]
    assert len(found) == 1, found
    return found.pop()


def in_runtime_view(pid: int, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "--", *command], capture_output=True, timeout=30
    )


def test_reported_path_is_where_the_sandbox_sees_the_file(bwrap_server, runtime_pids):
    data_dir = bwrap_server.workdir / "data"
    pids = {}
    for user in ("bw-alice", "bw-bob"):
        with httpx.Client(
            base_url=bwrap_server.url, headers={"X-User-Id": user}, timeout=60
        ) as api:
            url = f"/api/v1/sessions/sb-session-{user}"
            r = api.post(
                f"{url}/files/upload",
                files={"file": ("d.csv", user.encode())},
                data={"conversation_id": "c1"},
            )
            assert r.status_code == 201, r.text
            assert r.json()["path"] == "/workspace/c1/uploads/temparea/d.csv"
            assert api.get(url).json()["workspace_path"] == "/workspace"
            host_copy = data_dir / "sessions" / f"sb-session-{user}" / "workspace" / "c1"
            assert (host_copy / "uploads" / "temparea" / "d.csv").read_bytes() == user.encode()
            by_path = api.get(f"{url}/files//workspace/c1/uploads/temparea/d.csv")
            assert by_path.status_code == 200 and by_path.content == user.encode()
            pids[user] = runtime_python_pid(
                data_dir / "sessions" / f"sb-session-{user}", runtime_pids
            )

    seen = in_runtime_view(pids["bw-alice"], "cat", "/workspace/c1/uploads/temparea/d.csv")
    assert seen.returncode == 0 and seen.stdout == b"bw-alice"
    # Other sessions' data are hidden from alice's sandbox.
    listing = in_runtime_view(pids["bw-alice"], "ls", "-A", str(data_dir / "sessions"))
    assert listing.stdout.split() == [b"sb-session-bw-alice"]
    # Of its own session directory it sees only the run directory (its port file): its
    # record (session.json: the egress policy, read back when the API starts) is not
    # there to rewrite, even for code that Landlock does not confine.
    alice_dir = data_dir / "sessions" / "sb-session-bw-alice"
    own = in_runtime_view(pids["bw-alice"], "ls", "-A", str(alice_dir))
    assert own.stdout.split() == [b"run"], own
    assert (alice_dir / "session.json").exists()
    # The host's system directories are read-only inside.
    write = in_runtime_view(pids["bw-alice"], "touch", "/usr/sandbox-escape")
    assert write.returncode != 0 and not Path("/usr/sandbox-escape").exists()
