"""Build the app's routes before the first request instead of during it.

FastAPI (0.16x) prepares an included router's routes — each one's dependency tree,
parameters and response model — lazily, all at once, on the first request that reaches
that router, and keeps them. For the runtime that first request is a new session's
first call: measured 33–45 ms on the node tier's pooled pods (every new session paid it,
the API's first ``GET /v1/stats`` of a pod in ``bench e2b``), 90–140 ms in-process on a
busy machine. ``warm(app)`` pays it at start-up, before the server listens (a pooled pod
is ready only after).

How: a look-up of a route name no route has (``url_path_for``) walks every route of
every included router, which is what prepares them; it raises ``NoMatchFound``, taken
here. Public API only: on a FastAPI that prepares routes eagerly it is a cheap walk.
"""

from __future__ import annotations

import contextlib

from starlette.applications import Starlette
from starlette.routing import NoMatchFound

_NO_ROUTE = "sandbox-workspace: warm every route"  # no route is named this


def warm(app: Starlette) -> None:
    with contextlib.suppress(NoMatchFound):
        app.url_path_for(_NO_ROUTE)
