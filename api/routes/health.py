"""Health endpoints: ``/healthz`` (the process answers) and ``/readyz`` (it can serve)."""

from __future__ import annotations

from fastapi import APIRouter

from sandbox_workspace.contract.errors import ApiError

from ..deps import ServicesDep


class RunStoreUnreachable(ApiError):
    """The chat run store (Redis) has not answered for a lease: not ready."""

    status, code, retry_after = 503, "run_store_unreachable", 2

    def __init__(self) -> None:
        super().__init__(
            "the chat run store (Redis) has not answered for a lease: this replica takes "
            "no new work until it does; check SANDBOX_WORKSPACE_CHAT_REDIS_URL"
        )


router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> dict[str, str]:
    """Readiness: settings loaded, the backend started, and the chat run store reachable
    (a replica cut off from Redis takes no new work: 503)."""
    if not services.runs.store.reachable:
        raise RunStoreUnreachable()
    return {"status": "ok", "backend": services.settings.backend}
