"""Failures of the Kubernetes API, as the API's callers see them."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sandbox_workspace.contract.errors import error_response
from sandbox_workspace.kube import KubeError, Unreachable

log = logging.getLogger(__name__)


def install_kube_error_handler(app: FastAPI) -> None:
    """An apiserver that cannot be reached or fails is our dependency's outage, not the
    caller's mistake: 503 with ``Retry-After`` (restarts and upgrades last seconds);
    any other answer we did not expect is a 502. Never an unhandled 500."""

    @app.exception_handler(KubeError)
    async def _kube_error(_: Request, exc: KubeError) -> JSONResponse:
        log.warning("kubernetes API call failed: %s", exc)
        if isinstance(exc, Unreachable) or exc.status >= 500 or exc.status == 429:
            return error_response(
                503,
                "kubernetes_unavailable",
                "the Kubernetes API is not reachable right now; retry shortly",
                {"Retry-After": "2"},
            )
        return error_response(
            502, "kubernetes_error", f"the Kubernetes API answered {exc.status}: {exc}"
        )
