"""Bash scripts up to the 256 KiB an execution may have run whole, through ``/execute``
and E2B's ``commands.run`` (a process that outlives the request), where one past 128 KiB
failed to start ("Argument list too long": one execve argument's bound) and one past
~208 KB could not reach the spawner ("Message too long"): ``runtime/bash_script.py``."""

from __future__ import annotations

import hashlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b_sandboxes import e2b_sandbox
from script_files import script_files

from sandbox_workspace.runtime.bash_script import ARGV_CODE_BYTES


@pytest.fixture
def api(dev_server):
    user = f"big-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": user}, timeout=60) as c:
        c.base_url = f"{dev_server.url}/api/v1/sessions/sb-session-{user}"
        yield c
        c.delete("")


def _script(size: int) -> str:
    """A script of ``size`` bytes whose output proves every byte of it was run: a long
    variable, a quote and a newline inside it, and a last command after it."""
    head, tail = "x='a\"b\nc", '\'\necho ${#x} $(printf %s "$x" | sha256sum | cut -c1-16)\nexit 7'
    return head + "y" * (size - len(head) - len(tail)) + tail


def _expected(script: str) -> str:
    value = script[3 : script.rindex("'")]
    return f"{len(value)} {hashlib.sha256(value.encode()).hexdigest()[:16]}\n"


@pytest.mark.parametrize("size", [90_000, 140_000, 262_000])
def test_a_large_script_runs_whole_through_execute(api, size):
    script = _script(size)
    r = api.post("/execute", json={"conversation_id": "c", "language": "bash", "code": script})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["error"] is None, result
    assert (result["stdout"], result["exit_code"]) == (_expected(script), 7), result
    # The script's own variable is all it sees: none of the reader's.
    r = api.post(
        "/execute",
        json={"conversation_id": "c", "language": "bash", "code": script.replace(
            "exit 7", 'echo "[${__sbw_script-unset}]"')},
    )  # fmt: skip
    assert r.json()["stdout"].endswith("[unset]\n"), r.text


def test_a_script_either_side_of_the_bound_behaves_the_same(api):
    """One byte under ``ARGV_CODE_BYTES`` goes by argument, one over from the memfd:
    same output, status, ``$0``, ``$LINENO``, trap, stdin and fds."""
    probe = (
        "trap 'echo trap $?' EXIT\n"
        'echo "$0 $LINENO $# $-" $(ls /proc/$$/fd | wc -l); cat; f() { return 4; }\n'
        "set -e; f || echo f=$?; false\n#"
    )
    answers = []
    for size in (ARGV_CODE_BYTES, ARGV_CODE_BYTES + 1):
        code = probe + "x" * (size - len(probe))
        r = api.post("/execute", json={"conversation_id": "c", "language": "bash", "code": code})
        result = r.json()
        answers.append((result["stdout"], result["stderr"], result["exit_code"]))
    assert answers[0] == answers[1], answers
    assert answers[0][0].startswith("bash 2 0 hB") and answers[0][0].endswith("f=4\ntrap 1\n")
    assert answers[0][2] == 1


def test_a_large_script_with_a_syntax_error_says_so_and_runs_nothing_after(api):
    script = "echo before\n" + "#" * 150_000 + "\nif then\necho after\n"
    r = api.post("/execute", json={"conversation_id": "c", "language": "bash", "code": script})
    result = r.json()
    assert result["stdout"] == "before\n" and result["exit_code"] == 2, result
    assert "syntax error" in result["stderr"], result


def test_a_large_script_holding_nul_is_refused_before_it_runs(api):
    script = "echo ran-the-prefix\n" + "#" * 150_000 + "\0\necho after\n"
    r = api.post("/execute", json={"conversation_id": "c", "language": "bash", "code": script})
    assert r.status_code == 422 and "NUL" in r.text, r.text


def test_a_large_command_runs_whole_through_e2b(dev_server):
    with e2b_sandbox(dev_server.url, "e2b_" + "3c" * 16) as sbx:
        script = _script(200_000).replace("\nexit 7", "")
        assert sbx.commands.run(script).stdout == _expected(script)
        big = sbx.commands.run(script, background=True)
        assert big.wait().stdout == _expected(script)


@pytest.mark.local_backend
def test_no_script_file_stays_open_in_the_code_or_the_runtime(api, dev_server):
    """The code never holds its script's memfd (the reader closes it before the script
    runs), and none is left in the runtime, spawner or reaper by a call that ran, failed
    to parse, was refused (past the executions allowed at once) or whose client left."""
    pad = "#" * 100_000 + "\n"
    root = dev_server.proc.pid
    assert api.post("/execute", json={"conversation_id": "c", "language": "bash",
                                      "code": pad + "true"}).status_code == 200  # fmt: skip
    # While a large script runs, nothing of the tree holds a script file.
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(api.post, "/execute", json={
            "conversation_id": "c", "language": "bash",
            "code": pad + "ls -l /proc/$$/fd | grep -c memfd; sleep 2"})  # fmt: skip
        time.sleep(1)
        assert script_files(root) == []
        assert held.result().json()["stdout"] == "0\n", held.result().text
    codes = [pad + "sleep 1", pad + "if then", pad + "exit 3"]

    def one(i: int) -> int:
        body = {"conversation_id": f"p{i % 4}", "language": "bash", "code": codes[i % 3]}
        try:
            with httpx.Client(base_url=str(api.base_url), headers=api.headers,
                              timeout=0.3 if i % 5 == 0 else 60) as c:  # fmt: skip
                return c.post("/execute", json=body).status_code
        except httpx.TimeoutException:
            return 0  # the client left while the call started or ran

    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(one, range(24)))
    assert set(statuses) <= {0, 200, 429}, statuses
    deadline = time.monotonic() + 10
    while script_files(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert script_files(root) == []
