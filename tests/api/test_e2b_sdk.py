"""E2B's official Python SDK, unchanged, against `sandbox-workspace dev` (issue 37).

The program below is written for E2B's cloud; it runs in a separate process whose only
configuration is E2B's three environment variables (docs/e2b.md), against a real dev
server on loopback: create, write, list, a command with streamed output, Python twice
keeping state, a PNG result, kill — then the sandbox's conversation directory must be
gone from disk (the deletion guarantee of DELETE …/conversations/{cid}).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
from e2b_program import e2b_env, run_program

PROGRAM = r"""
import json, sys
from e2b import PtySize
from e2b_code_interpreter import Sandbox

report = {}
sbx = Sandbox.create()
report["id"] = sbx.sandbox_id
sbx.files.write("/home/user/hello.txt", "hello from e2b")
sbx.files.write("notes/relative.txt", b"relative")
report["listed"] = sorted(e.name for e in sbx.files.list("/home/user"))
report["read"] = sbx.files.read("hello.txt")
report["nested"] = sbx.files.read("/home/user/notes/relative.txt")
streamed = []
cmd = sbx.commands.run(
    "echo first; sleep 0.3; echo oops >&2; cat hello.txt", on_stdout=streamed.append
)
report["cmd"] = [cmd.exit_code, cmd.stdout, cmd.stderr, streamed]
sbx.run_code("counter = 41")
second = sbx.run_code("counter + 1")
report["state"] = [second.text, second.execution_count]
plot = sbx.run_code(
    "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
    "plt.plot([1, 3, 2])\nplt.show()"
)
report["png"] = plot.results[0].png[:12] if plot.results else None
try:
    sbx.pty.create(PtySize(24, 80))
    report["unsupported"] = "answered"
except Exception as e:
    report["unsupported"] = f"{type(e).__name__}: {e}"
try:
    sbx.files.read("/etc/passwd")
    report["outside"] = "answered"
except Exception as e:
    report["outside"] = f"{type(e).__name__}: {e}"
other = Sandbox.create()
other.files.write("secret.txt", "other's secret")
other_dir = other.commands.run("pwd").stdout.strip()
try:
    leaked = sbx.commands.run(f"cat {other_dir}/secret.txt").stdout
except Exception as e:
    leaked = f"{type(e).__name__}: {e.stderr}"
report["cross"] = [other_dir, leaked, sbx.commands.run("pwd").stdout.strip()]
other.kill()
report["running_before_kill"] = [s.sandbox_id for s in Sandbox.list().next_items()]
report["killed"] = sbx.kill()
print(json.dumps(report))
"""

KEY = "e2b_0123456789abcdef0123456789abcdef"


def _conversation_dirs(root: Path, sandbox_id: str) -> list[Path]:
    return [p for p in root.rglob(f"e2b-{sandbox_id}") if p.is_dir()]


def test_an_e2b_program_runs_unchanged_and_kill_deletes_its_files(dev_server, tmp_path):
    report = run_program(
        [sys.executable, "-c", PROGRAM], e2b_env(dev_server.url, KEY), tmp_path, timeout=180
    )
    assert {"hello.txt", "notes"} <= set(report["listed"])
    assert report["read"] == "hello from e2b"
    assert report["nested"] == "relative"
    exit_code, stdout, stderr, streamed = report["cmd"]
    assert (exit_code, stdout, stderr) == (0, "first\nhello from e2b", "oops\n")
    assert len(streamed) >= 2 and streamed[0] == "first\n"  # arrived in pieces, in order
    assert report["state"] == ["42", 2]
    assert report["png"].startswith("iVBORw0KGgo")  # base64 of the PNG signature
    assert "not supported" in report["unsupported"]
    assert "outside the sandbox" in report["outside"]
    other_dir, leaked, own_dir = report["cross"]
    # Another sandbox's directory is a sibling this one's commands cannot read (Landlock).
    assert "/e2b-" in other_dir and other_dir != own_dir
    assert leaked.startswith("CommandExitException") and "Permission denied" in leaked, leaked
    assert report["id"] in report["running_before_kill"]
    assert report["killed"] is True
    deadline = time.monotonic() + 30
    while _conversation_dirs(dev_server.workdir, report["id"]):
        assert time.monotonic() < deadline, "the killed sandbox's files are still on disk"
        time.sleep(0.2)


def test_an_access_token_opens_only_its_own_sandbox(dev_server):
    headers = {"X-API-KEY": KEY}
    with httpx.Client(base_url=f"{dev_server.url}/e2b", timeout=60) as api:
        first = api.post("/v2/sandboxes", json={"templateID": "base"}, headers=headers).json()
        second = api.post("/v2/sandboxes", json={"templateID": "base"}, headers=headers).json()
        try:
            stolen = api.get(
                "/envd/files",
                params={"path": "/home/user/.e2b"},
                headers={
                    "E2b-Sandbox-Id": second["sandboxID"],
                    "X-Access-Token": first["envdAccessToken"],
                },
            )
            assert stolen.status_code == 401
            assert "another sandbox" in stolen.json()["message"]
            unknown = api.post("/v2/sandboxes", json={"templateID": "gpu-xl"}, headers=headers)
            assert unknown.status_code == 400 and "gpu-xl" in unknown.json()["message"]
            assert api.post("/v2/sandboxes", json={}, headers={"X-API-KEY": "k"}).status_code == 401
            big = api.post(
                "/envd/files",
                params={"path": "big.bin"},
                content=b"x" * 300_000,
                headers={
                    "E2b-Sandbox-Id": first["sandboxID"],
                    "X-Access-Token": first["envdAccessToken"],
                    "Content-Type": "application/octet-stream",
                },
            )
            assert big.status_code == 413 and "not supported" in big.json()["message"]
        finally:
            for sandbox in (first, second):
                api.delete(f"/sandboxes/{sandbox['sandboxID']}", headers=headers)


def test_kill_deletes_the_files_it_made(dev_server):
    """The disk check of the SDK test above, with its precondition seen: the directory
    exists while the sandbox lives, and is gone after DELETE."""
    headers = {"X-API-KEY": KEY}
    with httpx.Client(base_url=f"{dev_server.url}/e2b", timeout=60) as api:
        sandbox = api.post(
            "/sandboxes", json={"templateID": "code-interpreter-v1"}, headers=headers
        )
        assert sandbox.status_code == 201
        sid = sandbox.json()["sandboxID"]
        assert _conversation_dirs(dev_server.workdir, sid)
        assert api.get(f"/sandboxes/{sid}", headers=headers).status_code == 200
        assert api.delete(f"/sandboxes/{sid}", headers=headers).status_code == 204
        deadline = time.monotonic() + 30
        while _conversation_dirs(dev_server.workdir, sid):
            assert time.monotonic() < deadline, "the killed sandbox's files are still on disk"
            time.sleep(0.2)
        assert api.get(f"/sandboxes/{sid}", headers=headers).status_code == 404
        assert api.delete(f"/sandboxes/{sid}", headers=headers).status_code == 404
