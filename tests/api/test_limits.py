"""Limits per execution through the real API and runtime: each limit ends only that
execution, with its own code; the runtime, the kernel of another conversation and its
variables carry on. Every bomb here runs under a low limit (256 MiB of memory per
execution), so a limit that failed would still be bounded by the test's own sizes."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_calls import execute as run
from polling import wait_for
from scripted_llm import Reply, text_reply, tool_reply, tool_results
from sse_stream import Stream

from sandbox_workspace.runtime.pids import start_time

pytestmark = pytest.mark.local_backend

LIMITS = {
    "SANDBOX_WORKSPACE_LIMITS__MEMORY": "256Mi",
    "SANDBOX_WORKSPACE_LIMITS__CPU_SECONDS": "1",
    "SANDBOX_WORKSPACE_LIMITS__FILE_SIZE": "1Mi",
    "SANDBOX_WORKSPACE_LIMITS__CONVERSATION_SIZE": "8Mi",
    "SANDBOX_WORKSPACE_LOCAL_SESSION_MEMORY": "400Mi",
}


@pytest.fixture(scope="module")
def limited_server(start_server, scripted_llm_server, chat_env_factory):
    return start_server(
        "dev", "--data-dir", "data", **chat_env_factory(scripted_llm_server, **LIMITS)
    )


@pytest.fixture
def lim(limited_server) -> Iterator[tuple[httpx.Client, str]]:
    user = f"u-{uuid.uuid4().hex[:10]}"
    url = f"/api/v1/sessions/sb-session-{user}"
    with httpx.Client(
        base_url=limited_server.url, headers={"X-User-Id": user}, timeout=60
    ) as client:
        yield client, url
        client.delete(url)


def _neighbour_is_intact(api: httpx.Client, url: str) -> None:
    """Conversation 'b' kept its interpreter and its variable; the runtime answers."""
    result = run(api, url, "kept", cid="b")
    assert result["error"] is None, result
    assert result["results"] == [{"data": {"text/plain": "'still here'"}}]
    assert result["kernel_restarted"] is False


def _with_neighbour(api: httpx.Client, url: str) -> None:
    assert run(api, url, "kept = 'still here'", cid="b")["error"] is None


def test_python_allocation_past_the_memory_limit_is_a_memory_error(lim):
    api, url = lim
    _with_neighbour(api, url)
    run(api, url, "small = 41", cid="a")
    result = run(api, url, "x = bytearray(1 << 30)", cid="a")  # 1 GiB > 256 MiB
    assert result["error"]["name"] == "MemoryError"
    assert result["error"]["code"] == "memory_limit_exceeded"
    # RLIMIT_AS refused the allocation: the interpreter and its state live on.
    after = run(api, url, "small + 1", cid="a")
    assert after["results"] == [{"data": {"text/plain": "42"}}]
    _neighbour_is_intact(api, url)


def test_a_process_tree_past_the_memory_limit_is_killed(lim):
    api, url = lim
    _with_neighbour(api, url)
    # Four processes of 120 MiB each: every one under the per-process limit, the tree
    # (480 MiB) past it — the reaper's watch kills the tree.
    code = (
        "for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(120 << 20); "
        'b[::4096] = b"x" * len(b[::4096]); time.sleep(30)\' & done; wait'
    )
    result = run(api, url, code, cid="a", language="bash", timeout=60)
    assert result["error"]["code"] == "memory_limit_exceeded", result
    assert result["duration_ms"] < 20_000
    _neighbour_is_intact(api, url)


def test_python_cpu_spin_past_the_cpu_limit_is_stopped(lim):
    api, url = lim
    _with_neighbour(api, url)
    run(api, url, "small = 41", cid="a")
    result = run(api, url, "while True: pass", cid="a", timeout=60)
    assert result["error"]["code"] == "cpu_limit_exceeded", result
    assert result["error"]["name"] == "CpuLimitExceeded"
    assert result["duration_ms"] < 20_000
    assert result["kernel_restarted"] is True  # 'small' of an earlier cell is gone
    # The next cell starts a fresh interpreter, and its CPU is counted afresh.
    again = run(api, url, "sum(range(1000))", cid="a")
    assert again["kernel_restarted"] is False and again["error"] is None
    _neighbour_is_intact(api, url)


def test_cpu_is_counted_per_cell_not_per_interpreter(lim):
    api, url = lim
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    for _ in range(3):  # 1.8 s of CPU in one interpreter, 0.6 s per cell: under 1 s each
        result = run(api, url, spin, cid="a", timeout=60)
        assert result["error"] is None, result


def test_bash_cpu_spin_is_stopped(lim):
    api, url = lim
    result = run(api, url, "while :; do :; done", cid="a", language="bash", timeout=60)
    assert result["error"]["code"] == "cpu_limit_exceeded", result


def test_a_file_past_the_file_size_limit(lim):
    api, url = lim
    _with_neighbour(api, url)
    py = run(api, url, "open('big', 'wb').write(b'x' * (2 << 20))", cid="a")
    assert py["error"]["code"] == "file_too_large", py
    assert run(api, url, "1 + 1", cid="a")["kernel_restarted"] is False
    sh = run(api, url, "head -c 2M /dev/zero > big2", cid="a", language="bash")
    assert sh["error"]["code"] == "file_too_large", sh
    _neighbour_is_intact(api, url)


def test_a_bash_script_that_carries_on_after_the_file_size_limit(lim):
    """As docs/api.md says: the limit stops the write and kills the tool (exit 153, bash
    names the signal on stderr); the script's own outcome is the answer."""
    api, url = lim
    code = "head -c 2M /dev/zero > big; echo status=$?; echo after"
    sh = run(api, url, code, cid="a", language="bash")
    assert sh["exit_code"] == 0 and sh["error"] is None, sh
    assert sh["stdout"] == "status=153\nafter\n", sh
    assert "File size limit exceeded" in sh["stderr"], sh
    strict = run(api, url, "set -e\n" + code, cid="a", language="bash")
    assert strict["error"]["code"] == "file_too_large", strict


def test_a_conversation_past_its_quota_is_stopped(lim):
    api, url = lim
    _with_neighbour(api, url)
    # 1 MiB files (each under the file limit) until the 8 MiB quota; 64 would be 64 MiB.
    code = "for i in $(seq 64); do head -c 1000K /dev/zero > f$i; sleep 0.05; done"
    result = run(api, url, code, cid="a", language="bash", timeout=60)
    assert result["error"]["code"] == "conversation_quota_exceeded", result
    # Overshoot bounded: at most what 0.5 s of writing adds (here ~10 files).
    listing = run(api, url, "du -sk . | cut -f1", cid="a", language="bash")
    assert int(listing["stdout"]) < 8 * 1024 + 12 * 1000
    # Code may still run, and delete to get under the quota again.
    cleanup = run(api, url, "rm -f f*; echo ok", cid="a", language="bash")
    assert cleanup["stdout"] == "ok\n" and cleanup["error"] is None
    _neighbour_is_intact(api, url)


def test_a_command_that_writes_past_the_quota_and_ends_at_once_is_told(lim):
    """9 MiB written in a few ms and the command ends, before any walk while it ran: the
    reaper's last walk finds it (it used to be exit 0, and as much again every call)."""
    api, url = lim
    code = "for i in $(seq 9); do head -c 1000K /dev/zero > g$i; done"
    result = run(api, url, code, cid="a", language="bash")
    assert result["error"]["code"] == "conversation_quota_exceeded", result
    cleanup = run(api, url, "rm -f g*; echo ok", cid="a", language="bash")
    assert cleanup["stdout"] == "ok\n" and cleanup["error"] is None


def test_the_model_is_told_which_limit_was_hit(lim, scripted_llm):
    api, _ = lim

    def respond(body: dict) -> Reply:
        if not tool_results(body):
            return tool_reply("execute_code", {"code": "x = bytearray(1 << 30)"})
        return text_reply("done")

    scripted_llm.responder = respond
    with api.stream("POST", "/api/v1/chat", json={"conversation_id": "a", "query": "go"}) as r:
        events = Stream(r).rest()
    end = next(d for _, k, d in events if k == "tool_end")
    assert end["ok"] is False
    told = tool_results(scripted_llm.requests[-1])[-1]["content"]
    assert "memory_limit_exceeded" in told and "MemoryError" in told


def test_code_is_what_the_oom_killer_takes_never_the_runtime(lim, limited_server, runtime_pids):
    api, url = lim
    code = (
        "import os\n"
        "mine = open('/proc/self/oom_score_adj').read().strip()\n"
        "reaper = open(f'/proc/{os.getppid()}/oom_score_adj').read().strip()\n"
        "print(mine, reaper)"
    )
    assert run(api, url, code, cid="a")["stdout"] == "1000 0\n"
    child = "python3 -c \"print(open('/proc/self/oom_score_adj').read().strip())\""
    assert run(api, url, child, cid="a", language="bash")["stdout"] == "1000\n"
    # The runtime and its spawner (a child of the runtime) keep the default.
    runtimes = runtime_pids(limited_server.workdir)
    assert runtimes
    for pid in runtimes:
        spawners = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for each in [pid, *map(int, spawners)]:
            assert Path(f"/proc/{each}/oom_score_adj").read_text().strip() == "0", each


def test_the_sessions_memory_ceiling_stops_the_largest_execution(lim):
    api, url = lim
    _with_neighbour(api, url)
    held = "import time\nx = bytearray({size} << 20)\nx[::4096] = b'x' * len(x[::4096])"
    # 180 MiB held by conversation 'a' (under its 256 MiB), then 220 MiB in 'c' while it
    # sleeps: 400 MiB together, past the session's 400Mi — 'c' holds the most.
    assert run(api, url, held.format(size=180), cid="a")["error"] is None
    result = run(api, url, held.format(size=220) + "\ntime.sleep(20)", cid="c", timeout=60)
    assert result["error"]["code"] == "memory_limit_exceeded", result
    assert "session" in result["error"]["value"] and result["duration_ms"] < 15_000
    assert run(api, url, "len(x) >> 20", cid="a")["results"] == [{"data": {"text/plain": "180"}}]
    _neighbour_is_intact(api, url)


def test_code_runs_niced_and_each_conversation_has_its_own_cpu_share(lim):
    api, url = lim
    code = (
        "import os\n"
        "cpu = [l for l in open('/proc/self/cgroup') if l.split(':')[1].split(',')[0] == 'cpu']\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0), cpu[0].strip().split(':')[2] if cpu else '')"
    )
    a = run(api, url, code, cid="a")["stdout"].split()
    b = run(api, url, code, cid="b")["stdout"].split()
    assert a[0] == b[0] == "5"
    if os.geteuid() == 0 and os.access("/sys/fs/cgroup/cpu", os.W_OK):  # cgroup v1 here
        assert "/sandbox-workspace/runtime-" in a[1] and a[1] != b[1]


def _upload(api: httpx.Client, url: str, name: str, size: int, **where) -> httpx.Response:
    files = {"file": (name, os.urandom(size))}
    if "query" in where:
        return api.post(f"{url}/files/upload", files=files, params={"conversation_id": "q"})
    return api.post(f"{url}/files/upload", files=files, data={"conversation_id": "q"})


def _temparea(api: httpx.Client, url: str) -> list[str]:
    code = "import os; print(sorted(os.listdir('uploads/temparea')))"
    return eval(run(api, url, code, cid="q")["stdout"])


@pytest.mark.parametrize("where", [{}, {"query": True}], ids=["form-field", "query"])
def test_an_upload_past_the_conversations_quota_is_refused(lim, where):
    api, url = lim
    assert _upload(api, url, "first.pkl", 5 << 20, **where).status_code == 201
    # 5 + 5 MiB > the 8 MiB quota: refused, nothing written.
    refused = _upload(api, url, "second.pkl", 5 << 20, **where)
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "conversation_quota_exceeded"
    assert "quota of 8 MiB" in error["message"] and "delete files first" in error["message"]
    assert _temparea(api, url) == ["first.pkl"]
    # Replacing a file frees its room; another conversation has a quota of its own.
    replaced = _upload(api, url, "first.pkl", 6 << 20, **where)
    assert replaced.status_code == 201 and replaced.json()["replaced"] is True
    other = api.post(
        f"{url}/files/upload",
        files={"file": ("o.pkl", os.urandom(5 << 20))},
        data={"conversation_id": "other"},
    )
    assert other.status_code == 201, other.text


def test_an_upload_naming_its_conversation_after_the_file_is_checked_before_commit(lim):
    api, url = lim
    assert _upload(api, url, "first.pkl", 6 << 20).status_code == 201
    boundary = "sbw-quota-boundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="late.pkl"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
        + os.urandom(3 << 20)
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"\r\n\r\n'
        f"q\r\n--{boundary}--\r\n".encode()
    )
    refused = api.post(
        f"{url}/files/upload",
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["code"] == "conversation_quota_exceeded"
    assert _temparea(api, url) == ["first.pkl"]


def _used_kib(api: httpx.Client, url: str, cid: str) -> int:
    return int(run(api, url, "du -sk . | cut -f1", cid=cid, language="bash")["stdout"])


def _says_delete_files(result: dict) -> None:
    error = result["error"]
    assert error["code"] == "conversation_quota_exceeded", result
    assert "quota of 8 MiB" in error["value"] and "delete files first" in error["value"]


def test_a_conversation_over_its_quota_cannot_grow_again_burst_by_burst(lim):
    """9 MiB written in a few ms, the command ends before the reaper's first walk: told,
    but the bytes stayed, and every later call added as much again (36 MiB after four
    calls past an 8 MiB quota). A call that starts over the quota can write no file."""
    api, url = lim
    for i in range(4):
        code = f"for j in $(seq 9); do head -c 1000K /dev/zero > g{i}-$j; done"
        result = run(api, url, code, cid="a", language="bash")
        assert result["error"]["code"] == "conversation_quota_exceeded", result
        assert _used_kib(api, url, "a") < 9 * 1000 + 64, i  # 18, 27, 36 MiB on main
        if i:  # frozen: the first write of the call was refused, its tool killed
            _says_delete_files(result)
    for write in ("echo x >> g0-1", "printf x | dd of=g0-2 conv=notrunc", "mkdir d"):
        _says_delete_files(run(api, url, write, cid="a", language="bash"))
    # A new file: Landlock's EACCES (the shell says "Permission denied", the answer why).
    new = run(api, url, "echo x > new", cid="a", language="bash")
    assert new["exit_code"] == 1 and "Permission denied" in new["stderr"], new
    _says_delete_files(new)
    assert "exit status: 1" in new["error"]["value"]
    py = run(api, url, "open('new.csv', 'w')", cid="a")
    _says_delete_files(py)
    assert "PermissionError: [Errno 13] Permission denied: 'new.csv'" in py["error"]["value"]
    # Deleting (and truncating) still work; the next call is under the quota and writes.
    cleanup = run(api, url, ": > g0-1; rm g0-[2-9]; echo ok", cid="a", language="bash")
    assert cleanup["stdout"] == "ok\n" and cleanup["error"] is None, cleanup
    again = run(api, url, "echo x > new && cat new", cid="a", language="bash")
    assert again["stdout"] == "x\n" and again["error"] is None, again


def test_a_python_interpreter_over_the_quota_writes_nothing_until_files_are_deleted(lim):
    """The interpreter lives on between cells: one that starts over the quota (its last
    one was killed past it) can write no file, in any cell, nor can what it starts; the
    first cell once code deleted enough starts a fresh one, which can."""
    api, url = lim
    burst = "for i in range(9):\n  with open(f'{n}{i}', 'wb') as f: f.write(b'x' * 1024000)"
    began = run(api, url, "import os\nstate = 1\nos.getpid()", cid="p")
    assert began["error"] is None, began
    interpreter = _process(int(began["results"][0]["data"]["text/plain"]))
    first = run(api, url, burst.replace("{n}", "h"), cid="p")
    assert first["error"] is None, first  # written and ended before any walk
    _until_gone(interpreter)  # the reaper's next walk kills that interpreter, between cells
    for i in range(3):  # each cell: a fresh interpreter, frozen
        again = run(api, url, burst.replace("{n}", f"n{i}-"), cid="p")
        assert again["kernel_restarted"] is (i == 0), again
        _says_delete_files(again)
        assert _used_kib(api, url, "p") < 9 * 1000 + 64
    kept = run(api, url, "kept = 41", cid="p")
    assert kept["error"] is None and kept["kernel_restarted"] is False, kept
    child = "import subprocess\nsubprocess.run(['sh', '-c', 'echo x >> h0'], check=True)"
    assert "SIGXFSZ" in run(api, url, child, cid="p")["error"]["value"]
    shrink_grow = "import os; os.truncate('h1', 500 << 10); os.truncate('h1', 600 << 10)"
    grown = run(api, url, shrink_grow, cid="p")
    _says_delete_files(grown)  # shrinking is fine, growing is not
    deleted = run(api, url, "import os\nfor i in range(2, 9): os.remove(f'h{i}')\nkept", cid="p")
    assert deleted["error"] is None and deleted["results"][0]["data"]["text/plain"] == "41"
    # Under the quota now: a fresh interpreter (state lost, and said), which writes.
    write = "with open('after', 'w') as f: f.write('ok')\nopen('after').read()"
    after = run(api, url, write, cid="p")
    assert after["error"] is None and after["kernel_restarted"] is True, after
    assert after["results"] == [{"data": {"text/plain": "'ok'"}}]


def _process(pid: int) -> tuple[int, int | None]:
    """A process named so that a later holder of its pid is not taken for it."""
    return pid, start_time(pid)


def _until_gone(process: tuple[int, int | None], timeout: float = 30.0) -> None:
    """Until that process has ended (gone, a zombie, or its pid another's now)."""
    pid, started = process

    def gone() -> bool:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        return start_time(pid) != started

    wait_for(gone, f"the interpreter (pid {pid}) to end", timeout)


def test_files_unlinked_and_held_open_count_in_the_quota(lim):
    """A file unlinked while open keeps its blocks and no walk finds it: the interpreter
    held 20 MiB so past an 8 MiB quota between cells, unseen. The reaper counts them."""
    api, url = lim
    hold = (
        "import os, time\nheld = []\nfor i in range(12):\n"
        "    fd = os.open(f'u{i}', os.O_RDWR | os.O_CREAT); os.unlink(f'u{i}')\n"
        "    os.write(fd, b'x' * 1000 * 1024); held.append(fd)\n"
        "time.sleep(5)"
    )
    result = run(api, url, hold, cid="u", timeout=30)
    assert result["error"]["code"] == "conversation_quota_exceeded", result
    assert result["kernel_restarted"] is True and result["duration_ms"] < 4000, result
    # Under the quota, a held file is fine.
    small = "import os\nf = open('v', 'w+b'); os.unlink('v'); f.write(b'x' * 4096)"
    assert run(api, url, small, cid="u")["error"] is None
