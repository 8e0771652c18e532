"""/ui/ — a web page to try everything (plain ES modules from api/web, no build step).

Served when ``web_ui`` is on (default: on in ``dev`` auth mode, off otherwise); ``/``
leads to it then, else to the API docs (``/docs``). The page is static; it calls the
public API like any client, so it needs no route of its own beyond ``/ui/config.json``
(which identity the page should ask for).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from ..settings import ApiSettings

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def enabled(settings: ApiSettings) -> bool:
    return settings.web_ui if settings.web_ui is not None else settings.auth_mode == "dev"


def install(app: FastAPI, settings: ApiSettings) -> None:
    home = "/ui/" if enabled(settings) else "/docs"

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """Somewhere to land for whoever opens the server's address."""
        return RedirectResponse(home)

    if not enabled(settings):
        return
    router = APIRouter(tags=["web"], include_in_schema=False)

    @router.get("/ui")
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @router.get("/ui/config.json")
    async def ui_config(request: Request) -> dict:
        """What the page asks for (a user id in dev, or a bearer token), and which model
        answers chat (None: none is configured)."""
        llm = request.app.state.services.llm
        model = getattr(llm, "model", None) or (llm.config.model if llm else None)
        return {"auth_mode": settings.auth_mode, "model": model}

    app.include_router(router)
    app.mount("/ui", StaticFiles(directory=WEB_DIR, html=True), name="web")
