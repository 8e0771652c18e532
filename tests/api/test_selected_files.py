"""One request model for selected files (api/chat/selected_files.py): every chat route
takes names, full paths and seed 000's ``{"file_name": …}`` objects, with the same checks
and the same errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest


def _chat(selected) -> dict:
    return {"query": "hi", "conversation_id": "c", "selected_files": selected}


def _ui_chat(selected) -> dict:
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    return {"id": "chat", "messages": [message], "conversation_id": "c", "selected_files": selected}


def _ag_ui(selected) -> dict:
    return {
        "threadId": "c",
        "runId": "r1",
        "messages": [{"id": "1", "role": "user", "content": "hi"}],
        "forwardedProps": {"selected_files": selected},
    }


def _agents(selected) -> dict:
    return {"prompt": "hi", "conversation_id": "c", "selected_files": selected}


ROUTES: dict[str, tuple[str, Callable[[object], dict]]] = {
    "chat": ("/api/v1/chat", _chat),
    "ui-chat": ("/api/v1/ui/chat", _ui_chat),
    "ag-ui": ("/api/v1/ag-ui", _ag_ui),
    "agents": ("/api/v1/agents", _agents),
}
SHAPES: dict[str, Callable[[str], object]] = {
    "name": lambda path: "a.csv",
    "full-path": lambda path: path,
    "object-name": lambda path: {"file_name": "a.csv"},
    "object-path": lambda path: {"file_name": path},
}


@pytest.fixture
def chat(chat_server, user) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chat_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


@pytest.fixture
def uploaded(chat, user) -> str:
    r = chat.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("a.csv", b"x,y\n1,2\n")},
        data={"conversation_id": "c"},
    )
    assert r.status_code == 201, r.text
    return r.json()["path"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("route", ROUTES)
def test_every_shape_selects_the_upload_on_every_route(chat, uploaded, scripted_llm, route, shape):
    path, body = ROUTES[route]
    with chat.stream("POST", path, json=body([SHAPES[shape](uploaded)])) as r:
        assert r.status_code == 200, r.read()
        r.read()  # the whole stream: the run has asked the model by then
    context = scripted_llm.requests[0]["messages"][-2]
    assert context["role"] == "user" and f'- "a.csv" ("{uploaded}")' in context["content"]


BAD = [
    pytest.param(lambda path: 7, 422, "invalid_request", id="number"),
    pytest.param(lambda path: {"name": "a.csv"}, 422, "invalid_request", id="object-no-file_name"),
    pytest.param(lambda path: {"file_name": 7}, 422, "invalid_request", id="file_name-number"),
    pytest.param(lambda path: "/etc/passwd", 400, "invalid_selected_file", id="outside-workspace"),
    pytest.param(
        lambda path: path.replace("/c/uploads/", "/other/uploads/"),
        400,
        "invalid_selected_file",
        id="other-conversation",
    ),
    pytest.param(
        lambda path: {"file_name": path.replace("/uploads/temparea/a.csv", "/outputs/a.csv")},
        400,
        "invalid_selected_file",
        id="outputs",
    ),
    pytest.param(lambda path: "../a.csv", 400, "invalid_selected_file", id="dotdot"),
]


@pytest.mark.parametrize(("item", "status", "code"), BAD)
@pytest.mark.parametrize("route", ROUTES)
def test_every_route_refuses_alike(chat, uploaded, route, item, status, code):
    path, body = ROUTES[route]
    r = chat.post(path, json=body([item(uploaded)]))
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


@pytest.mark.parametrize("route", ROUTES)
def test_not_a_list_and_too_many_are_422_everywhere(chat, route):
    path, body = ROUTES[route]
    for selected in ("a.csv", ["a.csv"] * 101):
        r = chat.post(path, json=body(selected))
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request"), r.text


@pytest.mark.parametrize("route", ROUTES)
def test_another_conversations_upload_by_name_is_404_before_any_stream(chat, uploaded, user, route):
    """docs/api.md (agent chat): a name that is not an upload of *this* conversation is
    refused before the run starts, like a misplaced path (400) is."""
    path, body = ROUTES[route]
    r = chat.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": ("elsewhere.csv", b"x\n1\n")},
        data={"conversation_id": "other"},
    )
    assert r.status_code == 201, r.text
    r = chat.post(path, json=body(["elsewhere.csv"]))
    assert (r.status_code, r.json()["error"]["code"]) == (404, "file_not_found"), r.text
    assert "not uploads of conversation 'c'" in r.json()["error"]["message"]
