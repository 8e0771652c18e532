"""An apiserver outage reaches the API's callers as 503 + Retry-After, never a 500."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from sandbox_workspace.api.backends.kube_errors import install_kube_error_handler
from sandbox_workspace.kube import KubeError, Unreachable


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
