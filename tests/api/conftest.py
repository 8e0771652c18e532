"""Fixtures of the API tier's chat tests: the scripted model and chat-enabled servers.

The model itself lives in ``tests/support/scripted_llm.py`` (importable by tests).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scripted_llm import ScriptedLLM, text_reply


@pytest.fixture(scope="session")
def scripted_llm_server() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    yield server
    server.stop()


@pytest.fixture
def scripted_llm(scripted_llm_server: ScriptedLLM) -> ScriptedLLM:
    scripted_llm_server.requests.clear()
    scripted_llm_server.completed.clear()
    scripted_llm_server.responder = lambda body: text_reply("hello")
    return scripted_llm_server


def chat_env(llm: ScriptedLLM, **extra: str) -> dict[str, str]:
    return {
        "SANDBOX_WORKSPACE_LLM_BASE_URL": llm.url,
        "SANDBOX_WORKSPACE_LLM_MODEL": "scripted",
        "SANDBOX_WORKSPACE_LLM_MAX_RETRIES": "1",
        "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
        # The chat tests drive one user's many runs at once (a hundred concurrent runs, 50
        # in flight through a rolling restart): the per-user caps are test_quotas.py's.
        "SANDBOX_WORKSPACE_QUOTAS__RUNS_PER_USER": "200",
        "SANDBOX_WORKSPACE_QUOTAS__FOLLOWERS_PER_USER": "400",
        **extra,
    }


@pytest.fixture(scope="session")
def chat_server(start_server, scripted_llm_server):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        session_wide_server=True,
        **chat_env(
            scripted_llm_server,
            SANDBOX_WORKSPACE_CHAT_APPROVAL_TIMEOUT_SECONDS="30",
            SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS="0.5",
            SANDBOX_WORKSPACE_LLM_TIMEOUT_SECONDS="3",
        ),
    )


@pytest.fixture(scope="session")
def chat_env_factory():
    return chat_env
