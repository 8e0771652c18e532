"""The operator's client of one sandbox runtime (runtime/app.py routes).

Contract: every failure says whether to retry. ``RuntimeUnavailable`` — not reachable,
timed out, 5xx, or an answer that is not the runtime's: the caller retries (for a
deletion, forever). ``RuntimeRefused`` — a 4xx the runtime gave on purpose (e.g. a
conversation id it refuses), with its error code. Pod IPs are never proxied.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from sandbox_workspace.runtime.schemas import ConversationDeleted, ConversationInfo, RuntimeStats


class RuntimeClientError(Exception):
    """Base of the runtime client's errors."""


class RuntimeUnavailable(RuntimeClientError):
    """The runtime could not be reached or did not answer properly; retry."""


class RuntimeRefused(RuntimeClientError):
    """The runtime answered a 4xx error on purpose."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


class RuntimeClient:
    def __init__(self, http: httpx.AsyncClient, endpoint: str, token: str) -> None:
        self.http = http
        self.base = endpoint.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}

    async def _call(self, method: str, path: str, model: type[Any]) -> Any:
        try:
            response = await self.http.request(method, self.base + path, headers=self.headers)
        except httpx.HTTPError as e:
            raise RuntimeUnavailable(f"{method} {path}: {e.__class__.__name__}") from e
        if response.status_code >= 500 or response.status_code == 401:
            raise RuntimeUnavailable(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                raise RuntimeUnavailable(f"{method} {path}: HTTP {response.status_code}") from None
            raise RuntimeRefused(response.status_code, code, message)
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError) as e:
            raise RuntimeUnavailable(f"{method} {path}: unexpected answer") from e

    async def stats(self) -> RuntimeStats:
        return await self._call("GET", "/v1/stats", RuntimeStats)

    async def ensure_conversation(self, cid: str) -> ConversationInfo:
        return await self._call("PUT", f"/v1/conversations/{_seg(cid)}", ConversationInfo)

    async def conversation_info(self, cid: str) -> ConversationInfo:
        return await self._call("GET", f"/v1/conversations/{_seg(cid)}", ConversationInfo)

    async def delete_conversation(self, cid: str) -> ConversationDeleted:
        return await self._call("DELETE", f"/v1/conversations/{_seg(cid)}", ConversationDeleted)


def _seg(value: str) -> str:
    return quote(value, safe="")
