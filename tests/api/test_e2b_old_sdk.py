"""An older E2B Python SDK, from before the /v2/sandboxes routes (issue 39 item 5).

``e2b`` 2.50.0 (and ``e2b-code-interpreter`` 2.10.0) creates with ``POST /sandboxes``,
as SDKs before 2.51 do (a move that broke other E2B-compatible servers). It is installed
apart from the .venv (which has the newest) by scripts/install-e2b-old-sdk.sh, from the
pins of tests/api/e2b-sdk-old.txt, and put first on PYTHONPATH of a process configured
only by E2B's variables, against ``sandbox-workspace dev``: a smoke test of the calls
docs/e2b.md's compatibility table lists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from e2b_program import UNSUPPORTED_CALLS, e2b_env, run_program

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / ".cache" / "e2b-sdk-old"
KEY = "e2b_0a1b2c3d4e5f60718293a4b5c6d7e8f9"

PROGRAM = (
    r"""
import importlib.metadata, importlib.util, json
from e2b_code_interpreter import Sandbox

report = {"version": importlib.metadata.version("e2b"),
          "has_v2_create": importlib.util.find_spec(
              "e2b.api.client.api.sandboxes.post_v2_sandboxes") is not None}
sbx = Sandbox.create(timeout=120)
report["id"] = sbx.sandbox_id
sbx.files.write("/home/user/old.txt", "from an older SDK")
report["read"] = sbx.files.read("old.txt")
report["listed"] = [e.name for e in sbx.files.list("/home/user")]
streamed = []
cmd = sbx.commands.run("echo a; sleep 0.2; echo b", on_stdout=streamed.append)
report["cmd"] = [cmd.exit_code, cmd.stdout, streamed[:1]]
sbx.run_code("y = 6")
report["code"] = sbx.run_code("y * 7").text
sbx.set_timeout(60)
report["info"] = sbx.get_info().sandbox_id
"""
    + UNSUPPORTED_CALLS
    + r"""
report["killed"] = sbx.kill()
print(json.dumps(report))
"""
)


# One process for every call (~5-9 s: most of it importing the SDK and a kernel's start).
def test_an_sdk_from_before_v2_routes_runs_the_core_calls(dev_server, tmp_path):
    subprocess.run(["bash", str(REPO / "scripts" / "install-e2b-old-sdk.sh")], check=True)
    report = run_program(
        [sys.executable, "-c", PROGRAM],
        {**e2b_env(dev_server.url, KEY, home=tmp_path), "PYTHONPATH": str(TARGET)},
        tmp_path,
    )
    assert report["version"] == "2.50.0" and report["has_v2_create"] is False
    assert report["read"] == "from an older SDK" and "old.txt" in report["listed"]
    assert report["cmd"] == [0, "a\nb\n", ["a\n"]]
    assert report["code"] == "42"
    assert report["info"] == report["id"] and report["killed"] is True
    for call, answer in report["unsupported"].items():
        assert "not supported" in answer, (call, answer)
