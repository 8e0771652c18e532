"""E2B's official JS SDK, unchanged, against `sandbox-workspace dev` (issue 39 item 3).

``e2b_sdk.mjs`` is the Python SDK test's program (tests/api/test_e2b_sdk.py) written with
``e2b`` and ``@e2b/code-interpreter`` from npm (pinned in package.json, installed by
scripts/install-node-deps.sh): create, write, list, a command with streamed output,
Python twice keeping state, a PNG result, kill. It runs in a node process whose only
configuration is E2B's three environment variables (docs/e2b.md).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from e2b_program import e2b_env, run_program

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")
KEY = "e2b_0123456789abcdef0123456789abcdef"  # E2B's form: the JS SDK refuses others

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (the SDK runs on it)")


# A whole E2B program in one node process (~4 s alone; up to ~15 s on a loaded machine,
# most of it the kernel's first matplotlib import for the PNG).
def test_the_js_sdk_runs_the_e2b_program_unchanged(dev_server, tmp_path):
    if not (HERE / "node_modules" / "@e2b" / "code-interpreter").is_dir():  # without make test
        subprocess.run(["bash", str(HERE.parents[1] / "scripts/install-node-deps.sh")], check=True)
    report = run_program(
        [NODE, str(HERE / "e2b_sdk.mjs")],
        e2b_env(dev_server.url, KEY, home=tmp_path),
        HERE,
    )
    assert {"hello.txt", "notes"} <= set(report["listed"])
    assert (report["read"], report["nested"]) == ("hello from e2b", "relative")
    exit_code, stdout, stderr, streamed = report["cmd"]
    assert (exit_code, stdout, stderr) == (0, "first\nhello from e2b", "oops\n")
    assert len(streamed) >= 2 and streamed[0] == "first\n"  # arrived in pieces, in order
    assert report["state"] == ["42", 2]
    assert report["png"].startswith("iVBORw0KGgo")  # base64 of the PNG signature
    assert "not supported" in report["unsupported"]
    assert "outside the sandbox" in report["outside"]
    assert report["id"] in report["running_before_kill"] and report["killed"] is True
    deadline = time.monotonic() + 30
    while [p for p in dev_server.workdir.rglob(f"e2b-{report['id']}") if p.is_dir()]:
        assert time.monotonic() < deadline, "the killed sandbox's files are still on disk"
        time.sleep(0.2)
