"""`make dev` with no model service: chat is answered by the scripted demo model
(api/chat/demo_model.py), which says it is one and runs the product's real tools on the
user's real file — the run, its stream, tool steps and the presented chart are real."""

from __future__ import annotations

import httpx
import pytest
from sse_stream import Stream, kinds

from sandbox_workspace.api.chat.demo_model import NAME, decide
from sandbox_workspace.api.settings import ApiSettings

pytestmark = pytest.mark.local_backend


@pytest.fixture(scope="module")
def demo_server(start_server):
    """`sandbox-workspace dev` as `make dev` runs it: no model, no DEMO_MODEL setting."""
    return start_server(
        "dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_DEMO_MODEL=None,
    )  # fmt: skip


def test_the_page_names_the_model_before_the_first_message(demo_server):
    config = httpx.get(f"{demo_server.url}/ui/config.json", timeout=30).json()
    assert config["model"] == NAME and "not a language model" in config["model"]


def test_a_chat_runs_the_real_tools_on_the_users_csv(demo_server):
    headers = {"X-User-Id": "demo-user"}
    with httpx.Client(base_url=demo_server.url, headers=headers, timeout=120) as api:
        up = api.post(
            "/api/v1/sessions/sb-session-demo-user/files/upload",
            files={"file": ("weather.csv", b"city,temp\nParis,21\nOslo,9\n")},
            data={"conversation_id": "c"},
        )
        assert up.status_code == 201, up.text
        body = {"query": "What is in my file?", "conversation_id": "c",
                "selected_files": ["weather.csv"]}  # fmt: skip
        with api.stream("POST", "/api/v1/chat", json=body) as r:
            assert r.status_code == 200, r.read()
            events = Stream(r).rest()
        tools = [d["name"] for _, k, d in events if k == "tool_start"]
        assert tools == ["list_files", "execute_code", "present_file"], kinds(events)
        ends = [d for _, k, d in events if k == "tool_end"]
        assert all(d["ok"] for d in ends), ends
        result = next(d for _, k, d in events if k == "result")
        assert result["success"] is True
        assert "2 rows, 2 columns: city, temp" in result["answer"]
        assert "temp    15.0" in result["answer"]
        [chart] = result["presented"]
        assert chart["path"].endswith("/c/outputs/demo_chart.png")
        text = "".join(d["delta"] for _, k, d in events if k == "text")
        assert "demo model" in text and "not a language model" in text
        api.delete("/api/v1/sessions/sb-session-demo-user")


def test_without_a_csv_it_says_how_to_get_one():
    listing = "Uploads:\nOutputs:"
    messages = [
        {"role": "system", "content": "…"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "1", "content": listing},
    ]  # fmt: skip
    text, call = decide(messages, {"list_files", "execute_code", "present_file"})
    assert call is None and "no CSV file yet" in text


def test_a_denied_tool_is_skipped():
    text, call = decide([{"role": "user", "content": "hi"}], {"execute_code"})
    assert call is None and "no CSV file yet" in text  # no listing, and nothing selected


def test_never_outside_dev_mode():
    with pytest.raises(ValueError, match="DEMO_MODEL is for dev mode only"):
        ApiSettings(auth_mode="required", service_token="x" * 16, demo_model=True)
