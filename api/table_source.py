"""The platform's tables, for ``/agents`` with ``table_id`` (seed 002: ``table.data``).

Contract: ``GET {url}/{table_id}`` answers the table resource, JSON whose ``data`` is the
table; ``PUT {url}/{table_id}`` with ``{"data": …}`` replaces it, the whole table in one
request (never a part of it). Both carry the caller's identity as the API received it:
``X-User-Id`` and ``X-Tenant-Id`` (the caller as this API identified it: a user id may
repeat across tenants) and the caller's own ``Authorization`` header when it sent one, so
the platform checks its own access rules.
- a 403 or 404 from the source is ``TableNotFound`` (our 404: another user's table and
  a missing one look alike);
- anything else — refused connection, no answer within ``timeout`` seconds, another
  status, an answer without ``data`` — is ``TableSourceFailed`` (502
  ``table_source_unavailable``) with a message naming what happened.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import httpx

from sandbox_workspace.contract.errors import ApiError, NotFoundError

from .identity import Caller


class TableNotFound(NotFoundError):
    """The table source answered 403 or 404."""


class TableSourceFailed(ApiError):
    """The table source is down, slow or answered something else."""

    status, code = 502, "table_source_unavailable"


def from_settings(http: httpx.AsyncClient, settings) -> TableSource:
    """The configured table source (``SANDBOX_WORKSPACE_TABLE_SOURCE_URL``)."""
    return TableSource(http, settings.table_source_url, settings.table_source_timeout_seconds)


def identity_headers(caller: Caller, authorization: str | None) -> dict[str, str]:
    headers = {"X-User-Id": caller.user_id, "X-Tenant-Id": caller.tenant}
    if authorization:
        headers["Authorization"] = authorization
    return headers


class TableSource:
    def __init__(self, http: httpx.AsyncClient, url: str, timeout: float) -> None:
        self.http, self.url, self.timeout = http, url.rstrip("/"), timeout

    def _url(self, table_id: int | str) -> str:
        return f"{self.url}/{quote(str(table_id), safe='')}"

    async def _send(
        self, method: str, table_id: int | str, headers: dict[str, str], **kw: Any
    ) -> httpx.Response:
        what = f"{method} table {table_id}"
        try:
            async with asyncio.timeout(self.timeout):
                response = await self.http.request(
                    method, self._url(table_id), headers=headers, **kw
                )
        except TimeoutError:
            raise TableSourceFailed(
                f"the table source did not answer {what} within {self.timeout:g}s"
            ) from None
        except httpx.HTTPError as e:
            raise TableSourceFailed(f"the table source is unreachable ({what}): {e!r}") from e
        if response.status_code in (403, 404):
            raise TableNotFound(f"table {table_id} not found", code="table_not_found")
        if not response.is_success:
            raise TableSourceFailed(
                f"the table source answered {what} with HTTP {response.status_code}"
            )
        return response

    async def get(self, table_id: int | str, headers: dict[str, str]) -> Any:
        response = await self._send("GET", table_id, headers)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "data" not in body:
            raise TableSourceFailed(f"the table source answered table {table_id} without data")
        return body["data"]

    async def put(self, table_id: int | str, data: Any, headers: dict[str, str]) -> None:
        await self._send("PUT", table_id, headers, json={"data": data})
