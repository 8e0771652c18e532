"""The hostile catalogue through E2B's official SDK fails exactly as through ``/execute``
(issue 37; docs/security.md, docs/e2b.md).

Conversation A is an E2B sandbox driven by ``e2b-code-interpreter``; B is a chat
conversation of the same user. ``tests/support/hostile_code.play`` runs every attack of
the catalogue with ``run_code`` and judges it as ``test_confinement.py`` does. Then what
only the SDK adds: its file calls on links that code made, a 2,500-deep tree that
``kill()`` must still delete, and a fork bomb through ``commands.run``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

import httpx
import pytest
from e2b.exceptions import InvalidArgumentException, RateLimitException, SandboxException
from e2b_code_interpreter import CommandExitException, Sandbox
from e2b_sandboxes import e2b_sandbox
from hostile_code import ATTACKS, HOLD_THE_CEILING, play
from hostile_ids import API_HOSTILE_CONVERSATION_IDS
from script_files import script_files

KEY = "e2b_" + "5e" * 16
KEY_USER = "e2b-" + hashlib.sha256(KEY.encode()).hexdigest()[:16]  # docs/e2b.md
FORK_LIMIT_AVAILABLE = os.geteuid() != 0 or os.access("/sys/fs/cgroup/pids", os.W_OK)


@pytest.fixture
def sandbox(dev_server):
    with e2b_sandbox(dev_server.url, KEY) as sbx:
        yield sbx


def _stdout(sbx: Sandbox, code: str) -> str:
    # The catalogue's relative paths start at the conversation's directory, as /execute's
    # code does; a fresh sandbox's code starts in its home, outputs/, one level below.
    start = "import os; os.chdir(os.environ['WORKSPACE_DIR'])\n"
    execution = sbx.run_code(start + code, timeout=240)
    return "".join(execution.logs.stdout)


def test_the_hostile_catalogue_through_the_sdk_finds_no_leak(dev_server, sandbox):
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": KEY_USER}, timeout=60) as api:
        _, failures = play(
            api,
            f"/api/v1/sessions/sb-session-{KEY_USER}",
            ATTACKS,
            a=f"e2b-{sandbox.sandbox_id}",
            run_a=lambda code: _stdout(sandbox, code),
        )
    found = [f"{name}: {problem}" for name, problems in failures.items() for problem in problems]
    assert not found, "\n".join(found)
    # The sandbox is healthy afterwards.
    assert sandbox.commands.run("echo still working").stdout == "still working\n"


def test_sdk_file_calls_do_not_follow_links_that_code_made(dev_server, sandbox):
    """The catalogue's "symlinks the code makes" and "hard links", through the SDK's own
    file calls (which run as the sandbox's code: no second way in)."""
    up = httpx.post(
        f"{dev_server.url}/api/v1/sessions/sb-session-{KEY_USER}/files/upload",
        files={"file": ("secret.csv", b"b's secret")},
        data={"conversation_id": "hostile-b"},
        headers={"X-User-Id": KEY_USER},
        timeout=60,
    )
    b_file = up.json()["path"]
    b_dir = str(Path(b_file).parents[2])
    root = str(Path(b_dir).parent)
    sandbox.commands.run(f"ln -s {b_file} ln-file && ln -s {b_dir} ln-dir && ln -s {root} ln-root")
    for call in (
        lambda: sandbox.files.read("ln-file"),
        lambda: sandbox.files.list("ln-dir"),
        lambda: sandbox.files.write("ln-dir/outputs/planted.txt", "x"),
        lambda: sandbox.files.list("ln-root"),
        lambda: sandbox.files.rename("ln-dir/uploads/temparea/secret.csv", "stolen.csv"),
        lambda: sandbox.files.remove("ln-dir/uploads/temparea/secret.csv"),
    ):
        with pytest.raises(SandboxException) as refused:
            call()
        assert "Permission" in str(refused.value), refused.value
    with pytest.raises(CommandExitException) as hard:
        sandbox.commands.run(f"ln {b_file} hl-b")
    # Landlock refuses a link across hierarchies with EXDEV (the catalogue counts it too).
    assert "Invalid cross-device link" in hard.value.stderr, hard.value.stderr
    assert Path(b_file).read_bytes() == b"b's secret"
    assert not (Path(b_dir) / "outputs" / "planted.txt").exists()


def test_kill_deletes_a_2500_deep_tree_code_made(dev_server, sandbox):
    directory = Path(sandbox.commands.run("pwd").stdout.strip()).parent  # home: outputs/
    assert directory.is_dir() and directory.name == f"e2b-{sandbox.sandbox_id}"
    sandbox.run_code(
        "import os\nos.makedirs('outputs', exist_ok=True)\nos.chdir('outputs')\n"
        "for _ in range(2500):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('bottom.txt', 'w').write('deep')\nos.chdir('/home/user')"
    )
    assert sandbox.commands.run("find outputs -name bottom.txt | wc -l").stdout == "1\n"
    # A path past PATH_MAX is a clear 400 through the SDK, not a server error.
    with pytest.raises(InvalidArgumentException, match="File name too long"):
        sandbox.files.read("outputs/" + "d/" * 2500 + "bottom.txt")
    assert sandbox.kill() is True
    deadline = time.monotonic() + 60
    while directory.exists():
        assert time.monotonic() < deadline, "the deep tree outlived kill()"
        time.sleep(0.3)


@pytest.mark.skipif(
    not FORK_LIMIT_AVAILABLE,
    reason="root without a writable pids cgroup: the runtime has no process limit here",
)
def test_a_fork_bomb_through_commands_hits_the_ceiling(sandbox):
    # The command's own timeout or exit may raise: the point is what follows.
    with contextlib.suppress(Exception):
        sandbox.commands.run("bomb() { bomb | bomb & }; bomb", timeout=3)
    # The SDK stops waiting at its 3 s as the runtime starts killing the tree: a command
    # started before the last of the bomb is reaped may still find the ceiling full (the
    # bomb's processes count until reaped). The process leaves the list once its reaper
    # has killed and reaped every descendant, so that is the condition to wait for.
    deadline = time.monotonic() + 60
    while sandbox.commands.list():
        assert time.monotonic() < deadline, "the bomb's tree outlived its timeout by 60 s"
        time.sleep(0.2)
    assert sandbox.commands.run("echo recovered").stdout == "recovered\n"


@pytest.mark.skipif(
    not FORK_LIMIT_AVAILABLE,
    reason="root without a writable pids cgroup: the runtime has no process limit here",
)
def test_a_command_at_a_full_ceiling_is_told_to_wait_not_that_the_sandbox_is_gone(
    sandbox, dev_server
):
    """Code holding every process it may have is the code's doing: a new command answers
    429 (the SDK's RateLimitException, "try again later"), naming what to do — not 503,
    which the SDK reports as the sandbox being unreachable, maybe killed."""
    filler = sandbox.commands.run(HOLD_THE_CEILING, background=True, timeout=0)
    deadline = time.monotonic() + 60
    refused = None
    while refused is None:
        assert time.monotonic() < deadline, "the ceiling was never reached"
        try:
            sandbox.commands.run("true")
            time.sleep(0.1)
        except RateLimitException as e:
            refused = str(e)
    assert "commands.kill" in refused, refused
    # A large command refused there (the spawner's fork failed) leaves no script file.
    with pytest.raises(RateLimitException):
        sandbox.commands.run("#" * 120_000 + "\ntrue")
    assert filler.kill() is True
    deadline = time.monotonic() + 60
    while sandbox.commands.list():
        assert time.monotonic() < deadline, "the filler's tree outlived its kill by 60 s"
        time.sleep(0.2)
    assert sandbox.commands.run("echo recovered").stdout == "recovered\n"
    if dev_server.proc is not None:
        assert script_files(dev_server.proc.pid) == []


@pytest.mark.parametrize("cid", API_HOSTILE_CONVERSATION_IDS)
def test_forged_attach_metadata_reaches_no_directory(dev_server, cid):
    """``metadata`` naming a hostile conversation id attaches nothing: a clear 404 (only
    conversations the runtime lists for the caller can be attached), never a 5xx."""
    opts = {
        "api_url": f"{dev_server.url}/e2b",
        "sandbox_url": f"{dev_server.url}/e2b/envd",
        "api_key": KEY,
    }
    try:
        with pytest.raises(SandboxException, match="404: sandbox 'conv"):
            Sandbox.create(metadata={"sandbox-workspace.conversation": cid}, **opts)
    finally:
        httpx.delete(
            f"{dev_server.url}/api/v1/sessions/sb-session-{KEY_USER}",
            headers={"X-User-Id": KEY_USER},
            timeout=60,
        )
