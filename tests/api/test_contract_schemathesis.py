"""Schemathesis, every check, against a live ``sandbox-workspace dev``: 0 failures.

The server is the product as a user starts it, with a model (the scripted one) so chat
runs are real, and every file type accepted (which types a session accepts is its
config; the schema cannot know a file's extension rule). Schemathesis runs as its CLI
with tests/api/schemathesis.toml (why the stateful phase is off is written there) and the
hooks in tests/support/schemathesis_hooks.py (the ``sandbox-name`` format). Bounded:
``MAX_EXAMPLES`` per operation keeps the run near a minute on two idle cores
(measured: 55 s idle, about 3.5 min at load average 10).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local_backend

MAX_EXAMPLES = 8
HERE = Path(__file__).parent
SUPPORT = HERE.parent / "support"


@pytest.fixture(scope="module")
def contract_server(start_server, scripted_llm_server, chat_env_factory):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server, SANDBOX_WORKSPACE_FILE_UPLOAD__ALLOWED_FILE_TYPES="[]"
        ),
    )


@pytest.mark.timeout(300)
def test_schemathesis_all_checks_pass(contract_server, tmp_path):
    st = Path(sys.executable).with_name("st")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])),
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "NO_COLOR": "1",
    }
    result = subprocess.run(
        [
            str(st),
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{contract_server.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--request-timeout",
            "30",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = result.stdout + result.stderr
    (tmp_path / "schemathesis.txt").write_text(out)
    failures = out.split("FAILURES", 1)[-1]  # the reproducible cases, then the summary
    server_errors = contract_server.log().split("Traceback")[1:3]  # what a 500 would leave
    assert result.returncode == 0, failures[:20000] + "\n".join(server_errors)[:10000]
    # ("Filtered: N (dropped by `filter_failure`)" may be there: the documented rules.)
    assert " passed" in out and "failures:" not in out.split("SUMMARY")[-1].lower(), out[-5000:]
