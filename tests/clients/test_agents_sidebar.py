"""Seed 002's sidebar on /api/v1/agents, in Node: ``agents_sidebar.test.mjs`` consumes the
stream with plain ``fetch`` as the seed's ``ChatSidebar.tsx`` consumes ``/api/agent``,
against a ``sandbox-workspace dev`` server whose tables come from a table source on
loopback. Needs node >= 18 only (no npm package)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from agents_script import ANSWER, double_ages
from scripted_llm import ScriptedLLM
from table_source import TableSource

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")


def _node_major() -> int:
    if NODE is None:
        return 0
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout
    return int(out.strip().lstrip("v").split(".")[0] or 0)


pytestmark = pytest.mark.skipif(
    _node_major() < 18, reason="node >= 18 is not installed (the sidebar test runs on it)"
)


def test_seed_002_sidebar_consumes_agents(start_server, tmp_path):
    source = TableSource().start()
    llm = ScriptedLLM().start()
    llm.responder = double_ages
    user = f"side-{uuid.uuid4().hex[:8]}"
    source.tables["42"] = [{"name": "ann", "age": 30}, {"name": "bob", "age": 41}]
    expected = [{"name": "ann", "age": 60}, {"name": "bob", "age": 82}]
    try:
        server = start_server(
            "dev",
            "--data-dir",
            "data",
            SANDBOX_WORKSPACE_LLM_BASE_URL=llm.url,
            SANDBOX_WORKSPACE_LLM_MODEL="scripted",
            SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
            SANDBOX_WORKSPACE_TABLE_SOURCE_URL=source.url,
        )
        result = subprocess.run(
            [NODE, "--test", "--test-reporter=spec", str(HERE / "agents_sidebar.test.mjs")],
            env={
                **os.environ,
                "HOME": str(tmp_path),
                "SANDBOX_API_URL": server.url,
                "SANDBOX_TEST_USER": user,
                "AGENTS_TABLE_ID": "42",
                "AGENTS_EXPECTED": json.dumps(expected),
                "AGENTS_ANSWER": ANSWER,
            },
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=180,
        )
        httpx.delete(
            f"{server.url}/api/v1/sessions/sb-session-{user}",
            headers={"X-User-Id": user},
            timeout=30,
        )
    finally:
        llm.stop()
        source.stop()
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert re.search(r"^\S+ pass 2$", report, re.M) and re.search(r"^\S+ fail 0$", report, re.M)
    assert source.tables["42"] == expected  # written back by the API, not the page
    # The history reached the model as the sidebar sent it.
    assert llm.requests[0]["messages"][1:3] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi!"},
    ]
