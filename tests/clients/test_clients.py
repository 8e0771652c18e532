"""The off-the-shelf chat clients against a real ``sandbox-workspace dev`` server.

``node --test`` runs tests/clients/*.test.mjs — the Vercel AI SDK (``ai``:
``DefaultChatTransport``, ``readUIMessageStream``, its ``AbstractChat`` state machine) on
``/api/v1/ui/chat`` and ``@ag-ui/client``'s ``HttpAgent`` on ``/api/v1/ag-ui`` — with the
server's URL and a user of its own in the environment; the scripted model
(tests/support/ui_script.py) plays each scenario. The npm packages come pinned from
package-lock.json (scripts/install-node-deps.sh, run by ``make test``). ``replicated``
plays the same suites on two API processes sharing a Redis-protocol run store, every
continuation (approval, interrupt resumed, stream resumed) sent to the replica that does
not hold the run (tests/clients/server.mjs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")


def _node_major() -> int:
    if NODE is None:
        return 0
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout
    return int(out.strip().lstrip("v").split(".")[0] or 0)


pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed (the npm clients run on it)"),
    pytest.mark.skipif(0 < _node_major() < 18, reason="the npm clients need node >= 18"),
    pytest.mark.skipif(
        not (HERE / "node_modules" / "ai").is_dir() and shutil.which("npm") is None,
        reason="npm is not installed, so the pinned client packages cannot be installed",
    ),
]


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if not (HERE / "node_modules" / "ai").is_dir():  # pytest run without `make test`
        subprocess.run(
            ["bash", str(HERE.parents[1] / "scripts" / "install-node-deps.sh")], check=True
        )
    return HERE / "node_modules"


@pytest.mark.parametrize("servers", ["one", "replicated"])
@pytest.mark.parametrize("suite", ["ai_sdk.test.mjs", "ag_ui.test.mjs"])
def test_npm_client(suite, servers, node_modules, request, tmp_path):
    user = f"node-{uuid.uuid4().hex[:8]}"
    if servers == "one":
        ui_server, replica_b = request.getfixturevalue("ui_server"), {}
    else:
        ui_server, b = request.getfixturevalue("ui_replicas")
        replica_b = {"SANDBOX_API_URL_B": b.url}
    try:
        result = subprocess.run(
            [NODE, "--test", "--test-reporter=spec", str(HERE / suite)],
            env={
                **os.environ,
                "HOME": str(tmp_path),
                "SANDBOX_API_URL": ui_server.url,
                "SANDBOX_TEST_USER": user,
                **replica_b,
            },
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        httpx.delete(
            f"{ui_server.url}/api/v1/sessions/sb-session-{user}",
            headers={"X-User-Id": user},
            timeout=30,
        )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    passed = re.search(r"^\S+ pass (\d+)$", report, re.M)
    assert passed and int(passed.group(1)) > 0 and re.search(r"^\S+ fail 0$", report, re.M), report
    if replica_b:
        assert re.search(r"replica B answered [1-9]", report), report
