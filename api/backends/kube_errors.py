"""Failures of the Kubernetes API, as the API's callers see them.

Contract: ``api_error(exc)`` is the one mapping, used by the HTTP handler and by chat
runs (a run's ``error`` event, a tool's failed result) alike — never a 500 or an
``internal_error``:
- unreachable, 5xx, 429: our dependency's outage → 503 ``kubernetes_unavailable`` with
  ``Retry-After`` (restarts and upgrades last seconds);
- what a caller's own doing can cause: 404 (the object was deleted meanwhile, e.g. its
  session) → 404 ``not_found``; 409 (changed or made meanwhile) → 409 ``conflict``; 403
  from a ResourceQuota (the namespace's count of sessions or conversations is reached)
  → 409 ``quota_exceeded`` — each saying what happened and what to do;
- anything else (our own RBAC, a schema we broke) → 502 ``kubernetes_error``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sandbox_workspace.contract.errors import (
    ApiError,
    BadGateway,
    Conflict,
    NotFoundError,
    Unavailable,
    error_response,
)
from sandbox_workspace.kube import KubeError, Unreachable

log = logging.getLogger(__name__)


class KubernetesUnavailable(Unavailable):
    code = "kubernetes_unavailable"
    retry_after = 2


def api_error(exc: KubeError) -> ApiError:
    """What the caller is told of ``exc`` (see the module contract)."""
    if isinstance(exc, Unreachable) or exc.status >= 500 or exc.status == 429:
        return KubernetesUnavailable("the Kubernetes API is not reachable right now; retry shortly")
    if exc.status == 404:
        return NotFoundError(
            f"a Kubernetes object this needs no longer exists (deleted meanwhile?): {exc}"
        )
    if exc.status == 409:
        return Conflict(f"a Kubernetes object changed meanwhile; retry: {exc}")
    if exc.status == 403 and "exceeded quota" in str(exc):
        return Conflict(
            # Not the apiserver's text: it counts every user's objects in the namespace.
            "the cluster's quota of sessions or conversations in this namespace is reached; "
            "delete some, or ask its administrator to raise it",
            code="quota_exceeded",
        )
    return BadGateway(f"the Kubernetes API answered {exc.status}: {exc}", code="kubernetes_error")


def install_kube_error_handler(app: FastAPI) -> None:
    """A KubeError reaching a route answers ``api_error``'s status: never a 500."""

    @app.exception_handler(KubeError)
    async def _kube_error(_: Request, exc: KubeError) -> JSONResponse:
        log.warning("kubernetes API call failed: %s", exc)
        error = api_error(exc)
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after else None
        return error_response(error.status, error.code, error.message, headers)
