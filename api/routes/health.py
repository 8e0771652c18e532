"""Health endpoints: ``/healthz`` (the process answers) and ``/readyz`` (it can serve)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> dict[str, str]:
    """Readiness: settings loaded and the backend started."""
    return {"status": "ok", "backend": services.settings.backend}
