"""An apiserver outage reaches the API's callers as 503 + Retry-After, what a caller's own
doing can cause as a 404/409 saying so — over HTTP and in a chat run — never a 500 or an
``internal_error``."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from sandbox_workspace.api.backends.kube_errors import install_kube_error_handler
from sandbox_workspace.kube import KubeConflict, KubeError, KubeNotFound, Unreachable


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        pytest.param(
            Unreachable(0, "connect refused", "Unreachable"),
            503,
            "kubernetes_unavailable",
            id="down",
        ),
        pytest.param(KubeError(500, "etcd timeout"), 503, "kubernetes_unavailable", id="5xx"),
        pytest.param(KubeError(429, "too many"), 503, "kubernetes_unavailable", id="throttled"),
        pytest.param(KubeError(403, "forbidden"), 502, "kubernetes_error", id="unexpected"),
        pytest.param(KubeNotFound(404, "gone", "NotFound"), 404, "not_found", id="deleted"),
        pytest.param(KubeConflict(409, "modified", "Conflict"), 409, "conflict", id="conflict"),
        pytest.param(
            KubeError(403, "exceeded quota: q, requested: count/conversationworkspaces…=1"),
            409,
            "quota_exceeded",
            id="resource-quota",
        ),
    ],
)
async def test_kube_errors_become_answers_that_say_whether_to_retry(error, status, code):
    app = FastAPI()
    install_kube_error_handler(app)

    @app.get("/x")
    async def fail():
        raise error

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        r = await client.get("/x")
    assert r.status_code == status and r.json()["error"]["code"] == code
    assert ("retry-after" in r.headers) == (status == 503)


async def test_a_kubernetes_error_in_a_chat_run_ends_it_as_the_api_says_it():
    # Its session deleted meanwhile (404 from the apiserver): a run ends with not_found,
    # not internal_error.
    from fake_conversation import FakeConversation

    from sandbox_workspace.api.chat.loop import RunSpec, run_agent
    from sandbox_workspace.api.chat.runs import Run

    async def ensure_session():
        raise KubeNotFound(404, 'sandboxsessions "sb-session-u" not found', "NotFound")

    run = Run(user_id="u", session_id="s", conversation_id="c")
    spec = RunSpec(query="q", history=[], selected_files=[], policies={}, max_iterations=1,
                   deadline_seconds=60, approval_timeout=1, tool_timeout=1)  # fmt: skip
    conversation = FakeConversation(ensure_session=ensure_session)
    await run_agent(run, spec, conversation, None, None)  # type: ignore[arg-type]
    assert [f.split(b"\n")[1] for f in run.frames][-2:] == [b"event: error", b"event: done"]
    assert b'"code":"not_found"' in run.frames[-2] and b"deleted meanwhile" in run.frames[-2]


async def test_a_kubernetes_error_in_a_tool_call_is_the_tools_failed_result():
    # The run goes on: the model is told what happened (here the namespace's quota).
    from sandbox_workspace.api.chat.tools import SandboxTools

    class Refused(SandboxTools):
        async def _bash(self, command: str, timeout: float | None = None):
            raise KubeError(403, "exceeded quota: q, requested: count/conversationworkspaces")

    tools = Refused(None, session_id="s", conversation_id="c", workspace_path="/w")  # type: ignore[arg-type]
    outcome = await tools.call("bash", '{"command": "ls"}')
    assert not outcome.ok and outcome.output.startswith("bash failed: the cluster's quota")
    assert "count/" not in outcome.output  # other users' counts are not told
