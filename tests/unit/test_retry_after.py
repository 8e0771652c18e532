"""Retry-After only where waiting can cure the answer (contract/errors.py): a transient
429/503 gets the default, an error's own value wins, ``NotConfigured`` gets none."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sandbox_workspace.api.files.base import StoreNotConfigured
from sandbox_workspace.contract.errors import (
    ApiError,
    ConversationDeleting,
    NotConfigured,
    Unavailable,
    install_error_handlers,
)
from sandbox_workspace.runtime.executor import TooBusy


@pytest.mark.parametrize(
    ("error", "retry_after"),
    [
        pytest.param(Unavailable("session starting"), "2", id="unavailable"),
        pytest.param(TooBusy("busy"), "2", id="too-busy"),
        pytest.param(ConversationDeleting("c"), "1", id="own-value"),
        pytest.param(NotConfigured("no model", code="llm_not_configured"), None, id="config"),
        pytest.param(StoreNotConfigured("no store"), None, id="no-store"),
    ],
)
def test_retry_after_only_when_waiting_helps(error: ApiError, retry_after: str | None):
    app = FastAPI()
    install_error_handlers(app, default_retry_after=2)

    @app.get("/")
    async def fail() -> None:
        raise error

    r = TestClient(app).get("/")
    assert r.status_code == error.status
    assert r.headers.get("retry-after") == retry_after
