"""A new runtime prepares its routes at start-up, not in a session's first call
(runtime/warm_routes.py): FastAPI builds an included router's dependency trees lazily,
on the first request reaching it — 33–45 ms of every new session's first call on the
node tier (bench e2b)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI, routing

from sandbox_workspace.runtime.app import create_app
from sandbox_workspace.runtime.settings import RuntimeSettings

TOKEN = "t" * 24


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[FastAPI], FastAPI]]:
    """``closing(app)``: a runtime app used without its lifespan, whose executor (and so
    its scratch root, made with it) is closed after the test, as the lifespan would."""
    apps: list[FastAPI] = []
    yield lambda app: apps.append(app) or app
    for app in apps:
        await app.state.runtime.executor.aclose()


async def test_the_first_authenticated_call_builds_no_route(tmp_path, monkeypatch, closing) -> None:
    app = closing(create_app(RuntimeSettings(token=TOKEN, root=tmp_path, confinement="none")))
    built: list[str] = []
    original = routing.get_dependant

    def counting(*args, **kwargs):
        built.append(kwargs.get("path", ""))
        return original(*args, **kwargs)

    monkeypatch.setattr(routing, "get_dependant", counting)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as client:
        r = await client.get("/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        r = await client.get("/v1/conversations/c1/uploads", headers={"Authorization": "x"})
        assert r.status_code == 401
    assert built == []


async def test_a_conversations_files_are_counted_off_the_event_loop(
    tmp_path, monkeypatch, closing
) -> None:
    """``PUT /v1/conversations/{id}`` answers the conversation's file count: a walk as long
    as the conversation is big, which on the loop stalled every other request."""
    import threading

    from sandbox_workspace.runtime.workspace import Workspace

    app = closing(create_app(RuntimeSettings(token=TOKEN, root=tmp_path, confinement="none")))
    counted_on: list[threading.Thread] = []
    original = Workspace.conversation_info

    def recording(self, cid):
        counted_on.append(threading.current_thread())
        return original(self, cid)

    monkeypatch.setattr(Workspace, "conversation_info", recording)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as client:
        r = await client.put("/v1/conversations/c1", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        assert r.json()["exists"] is True
    assert counted_on and threading.main_thread() not in counted_on
