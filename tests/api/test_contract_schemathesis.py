"""Schemathesis, every check and every operation, against a live ``sandbox-workspace
dev``: 0 failures.

The server is the product as a user starts it, with a model (the scripted one) so chat
runs are real, a real SeaweedFS as its object store (store mode: seed 003's routes need
one), a real table source (/agents with a table_id), and every file type accepted — which
types a session accepts is its config, and a filename's extension is beyond what a
multipart schema can constrain, so the document states the deployment's default on the
upload's ``file`` part and its 415 (here: every type; tests/api/test_openapi.py checks the
default list). Schemathesis runs as its CLI with tests/api/schemathesis.toml (why the
stateful phase is off, and the allowances for rules JSON Schema cannot state, are written
there) and the hooks in tests/support/schemathesis_hooks.py. A second run covers the chat
operations of a server with no model configured (documented 503). Bounded:
``MAX_EXAMPLES`` per operation keeps the run near a minute on two idle cores (measured: 55
s idle, about 3.5 min at load average 10; with /ui/chat and /ag-ui in, ~100 s at load
average ~8).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from table_source import TableSource

pytestmark = pytest.mark.local_backend

# Deterministic by default: the same seed draws the same requests on every run, so the
# README's test command never fails at random. `make fuzz` draws new seeds with more
# examples (SANDBOX_FUZZ_SEED=random, SANDBOX_FUZZ_EXAMPLES); run it before each landing
# and turn whatever it finds into a fixed test.
FUZZ_SEED = os.environ.get("SANDBOX_FUZZ_SEED", "20261128")
MAX_EXAMPLES = int(os.environ.get("SANDBOX_FUZZ_EXAMPLES", "8"))
HERE = Path(__file__).parent
SUPPORT = HERE.parent / "support"


@pytest.fixture(scope="module")
def table_source() -> Iterator[TableSource]:
    source = TableSource().start()  # /agents with a table_id reaches a real table source
    yield source
    source.stop()


@pytest.fixture(scope="module")
def contract_server(start_server, scripted_llm_server, chat_env_factory, seaweedfs, table_source):
    # In store mode (a real SeaweedFS): seed 003's workspace routes need the store, and
    # every other route must hold its contract with the store in the path too. Configured
    # as a deployment is (a model, a table source): a server missing one answers 503 by
    # design, which is the deployment's doing, not the request's.
    seaweedfs.make_bucket("contract")
    return start_server(
        "dev",
        "--data-dir",
        "data",
        **chat_env_factory(
            scripted_llm_server,
            SANDBOX_WORKSPACE_FILE_UPLOAD__ALLOWED_FILE_TYPES="[]",
            SANDBOX_WORKSPACE_TABLE_SOURCE_URL=table_source.url,
            **seaweedfs.env("contract"),
        ),
    )


def _schemathesis(server, tmp_path, *selection: str) -> None:
    """``st run`` with every check against ``server``; asserts 0 failures."""
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
            f"{server.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--request-timeout",
            "30",
            *([] if FUZZ_SEED == "random" else ["--seed", FUZZ_SEED]),
            *selection,
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280 + 10 * MAX_EXAMPLES,
    )
    out = result.stdout + result.stderr
    (tmp_path / "schemathesis.txt").write_text(out)
    print(out.split("SUMMARY")[-1][-2000:])  # the seed drawn (`make fuzz`), to replay it
    failures = out.split("FAILURES", 1)[-1]  # the reproducible cases, then the summary
    server_errors = server.log().split("Traceback")[1:3]  # what a 500 would leave
    assert result.returncode == 0, failures[:20000] + "\n".join(server_errors)[:10000]
    # ("Filtered: N (dropped by `filter_failure`)" may be there: the documented rules.)
    assert " passed" in out and "failures:" not in out.split("SUMMARY")[-1].lower(), out[-5000:]


@pytest.mark.timeout(300 + 10 * MAX_EXAMPLES)
def test_schemathesis_all_checks_pass(contract_server, tmp_path):
    _schemathesis(contract_server, tmp_path)


CHAT_OPERATIONS = ("chat", "ui_chat", "ag_ui")


@pytest.fixture(scope="module")
def no_model_server(start_server):
    return start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")


@pytest.mark.timeout(300 + 10 * MAX_EXAMPLES)
def test_without_a_model_chat_operations_answer_only_what_they_document(no_model_server, tmp_path):
    """Every check but ``not_a_server_error``: without a model, 503 ``llm_not_configured``
    (with Retry-After) is the documented answer to a valid chat request, and that check
    counts every 5xx as a fault by definition. The others — the status documented, the
    body its schema, invalid input refused before — all hold."""
    selection = [arg for op in CHAT_OPERATIONS for arg in ("--include-operation-id", op)]
    _schemathesis(no_model_server, tmp_path, *selection, "--exclude-checks", "not_a_server_error")


@pytest.mark.parametrize(
    ("operation", "path", "body"),
    [
        ("chat", "/api/v1/chat", {"query": "hi", "conversation_id": "c"}),
        (
            "ui_chat",
            "/api/v1/ui/chat",
            {
                "id": "x",
                "conversation_id": "c",
                "messages": [
                    {"id": "1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                ],
            },
        ),
        (
            "ag_ui",
            "/api/v1/ag-ui",
            {
                "threadId": "c",
                "runId": "r",
                "messages": [{"id": "1", "role": "user", "content": "hi"}],
            },
        ),
    ],
)
def test_without_a_model_every_chat_route_answers_its_documented_503(
    no_model_server, operation, path, body
):
    with httpx.Client(base_url=no_model_server.url, headers={"X-User-Id": "nomodel"}) as client:
        r = client.post(path, json=body)
        document = client.get("/openapi.json").json()
    assert r.status_code == 503 and r.json()["error"]["code"] == "llm_not_configured"
    assert "SANDBOX_WORKSPACE_LLM_MODEL" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 0
    [documented] = [
        o
        for item in document["paths"].values()
        for o in item.values()
        if o.get("operationId") == operation
    ]
    assert "503" in documented["responses"]
    assert "model not configured" in documented["responses"]["503"]["description"]
