"""The API's handle on a session's runtime: the one runtime client
(``sandbox_workspace.runtime.client``) built from a backend's ``RuntimeEndpoint``.

Contract (the client's): uploads stream through chunk by chunk, downloads are relayed as
they arrive; a runtime's own ``{"error"}`` answer is raised as the same status, code and
message (``RuntimeRefused``, an ``ApiError``), an unreachable runtime as 503
(``RuntimeUnavailable``), anything else it answers as 502.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from sandbox_workspace.runtime import client as _client
from sandbox_workspace.runtime.client import RuntimeRefused

from .backends.base import RuntimeEndpoint

# The name the API's callers have always caught.
RuntimeApiError = RuntimeRefused


class RuntimeClient(_client.RuntimeClient):
    """``runtime.client.RuntimeClient`` addressed by a backend's endpoint."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        endpoint: RuntimeEndpoint,
        *,
        on_unreachable: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            http,
            endpoint.url,
            endpoint.token,
            endpoint.unix_socket,
            on_unreachable=on_unreachable,
        )


__all__ = ["RuntimeApiError", "RuntimeClient", "RuntimeRefused"]
