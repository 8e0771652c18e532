"""The scripted model's part in the client and browser tests (test support).

``respond`` answers by the user's query, so one server serves every scenario the Node
clients and the browser play, concurrently:
- ``say hello``            → text only;
- ``read <path>``          → ``read_file`` on that path, then the file's text in the answer;
- ``run bash``             → ``bash`` (approval required on the server), then its output
                             or the rejection in the answer;
- ``count slowly``         → a long answer streamed over ~3 s (for dropped connections);
- ``think first``          → the model is silent 2.5 s, then answers (keep-alives go out);
- ``break the model``      → the model answers HTTP 400 (the run ends with ``error``);
- ``Plot the monthly sales`` → ``execute_code`` plotting the selected CSV (its path from
                             the selected-files context message) to outputs/chart.png
                             (approval required), ``present_file``, then the answer.
``ui_server`` (a fixture; conftests import it) is such a ``sandbox-workspace dev`` server;
``ui_replicas`` two of them sharing a Redis-protocol run store (the ``redis_url`` fixture).
"""

from __future__ import annotations

import json
import re
import signal
import uuid

import pytest
from scripted_llm import Reply, ScriptedLLM, text_reply, tool_reply, tool_results

SLOW_WORDS = [f"w{i}" for i in range(30)]
CHART_CODE = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
df = pd.read_csv({path!r})
ax = df.plot(x=df.columns[0], y=df.columns[1], kind="bar", legend=False, color="#2563eb")
ax.set_title("Sales by month")
plt.tight_layout()
plt.savefig("outputs/chart.png", dpi=80)
print("saved outputs/chart.png with", len(df), "bars")
"""


def server_env(llm: ScriptedLLM) -> dict[str, str]:
    return {
        "SANDBOX_WORKSPACE_LLM_BASE_URL": llm.url,
        "SANDBOX_WORKSPACE_LLM_MODEL": "scripted",
        "SANDBOX_WORKSPACE_LLM_MAX_RETRIES": "1",
        "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
        "SANDBOX_WORKSPACE_CHAT_KEEPALIVE_SECONDS": "1",
        "SANDBOX_WORKSPACE_TOOL_POLICIES": json.dumps(
            {"bash": "require_approval", "execute_code": "require_approval"}
        ),
    }


def _query(body: dict) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return users[-1] if users else ""


def _selected_csv(body: dict) -> str:
    context = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.search(r'\("(/[^"]+\.csv)"\)', context)  # - "name" ("path"), JSON strings
    return found.group(1) if found else "no-file-selected.csv"


def _slow(text_pieces: list[str], pause: float) -> Reply:
    chunks: list[dict | str] = [
        {"choices": [{"index": 0, "delta": {"content": p}}]} for p in text_pieces
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return Reply(chunks, pause_between=pause)


def respond(body: dict) -> Reply:
    query = _query(body)
    results = [r["content"] for r in tool_results(body)]
    if query.startswith("read "):
        if not results:
            return tool_reply("read_file", {"path": query[5:]}, call_id="call_read")
        return text_reply(f"The file says: {results[-1].strip()}")
    if query == "run bash":
        if not results:
            return tool_reply("bash", {"command": "echo approved-ran"}, call_id="call_bash")
        return text_reply(f"bash said: {results[-1].strip()[:200]}")
    if query == "think first":
        reply = text_reply("Thought it through")
        reply.stall_seconds = 2.5
        return reply
    if query == "break the model":
        return Reply(status=400)
    if query == "count slowly":
        return _slow([w + " " for w in SLOW_WORDS], 0.1)
    if query.startswith("Plot the monthly sales"):
        path = _selected_csv(body)
        if not results:
            return tool_reply("execute_code", {"code": CHART_CODE.format(path=path)}, "call_chart")
        if len(results) == 1:
            return tool_reply("present_file", {"path": "outputs/chart.png"}, "call_present")
        answer = "Here is the chart of your sales: March was the best month."
        return _slow([w + " " for w in answer.split()], 0.15)
    return text_reply("Hello from the sandbox")


@pytest.fixture(scope="session")
def ui_server(start_server):
    llm = ScriptedLLM().start()
    llm.responder = respond
    try:
        yield start_server("dev", "--data-dir", "data", session_wide_server=True, **server_env(llm))
    finally:
        llm.stop()


@pytest.fixture(scope="module")
def ui_replicas(start_server, redis_url):
    """Two ``dev`` API processes, each with its own data directory, one run store: a
    turn continued on the other replica needs only the store (its run is the owner's)."""
    llm = ScriptedLLM().start()
    llm.responder = respond
    env = server_env(llm) | {
        "SANDBOX_WORKSPACE_CHAT_RUN_STORE": "redis",
        "SANDBOX_WORKSPACE_CHAT_REDIS_URL": redis_url,
        "SANDBOX_WORKSPACE_CHAT_REDIS_PREFIX": f"t{uuid.uuid4().hex[:8]}:",
        "SANDBOX_WORKSPACE_CHAT_APPROVAL_TIMEOUT_SECONDS": "60",
    }
    servers = [start_server("dev", "--data-dir", "data", **env) for _ in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop(signal.SIGTERM)
        llm.stop()
