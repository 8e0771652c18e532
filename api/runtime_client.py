"""HTTP client for one sandbox runtime, shared by the API's routes and backends.

Contract: bodies stream in both directions (an upload is forwarded chunk by chunk as it
arrives; a download is relayed as the runtime sends it). A runtime's own ``{"error"}``
answer is re-raised as the same ``ApiError`` status, code and message, so the caller
sees why; a runtime that cannot be reached is a 503 the client may retry.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx

from sandbox_workspace.runtime.errors import ApiError, BadGateway, Unavailable
from sandbox_workspace.runtime.schemas import (
    ConversationDeleted,
    ConversationIds,
    ConversationInfo,
    ExecuteRequest,
    ExecutionResult,
    KernelRestarted,
    OutputList,
    RuntimeStats,
    UploadList,
    UploadResult,
)

from .backends.base import RuntimeEndpoint


class RuntimeApiError(ApiError):
    """An error answered by the runtime, relayed with its own status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = status


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        err = response.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        raise BadGateway(f"sandbox runtime answered {response.status_code}") from None
    if response.status_code == 401:
        # Our token was refused: an infrastructure fault, never the caller's.
        raise BadGateway("sandbox runtime refused the API's credentials")
    raise RuntimeApiError(response.status_code, code, message)


class RuntimeClient:
    def __init__(self, http: httpx.AsyncClient, endpoint: RuntimeEndpoint) -> None:
        self.http = http
        self.base = endpoint.url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {endpoint.token}"}

    async def _request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> httpx.Response:
        try:
            response = await self.http.request(
                method, self.base + path, headers={**self.headers, **(headers or {})}, **kw
            )
        except httpx.TransportError as e:
            raise Unavailable(f"sandbox runtime is not reachable: {e.__class__.__name__}") from e
        _raise_for(response)
        return response

    async def health(self) -> bool:
        try:
            response = await self.http.get(self.base + "/healthz", timeout=2.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def stats(self) -> RuntimeStats:
        return RuntimeStats.model_validate((await self._request("GET", "/v1/stats")).json())

    async def list_conversations(self, holding: str | None = None) -> list[str]:
        params = {"holding": holding} if holding is not None else None
        r = await self._request("GET", "/v1/conversations", params=params)
        return ConversationIds.model_validate(r.json()).conversations

    async def ensure_conversation(self, cid: str) -> ConversationInfo:
        r = await self._request("PUT", f"/v1/conversations/{_seg(cid)}")
        return ConversationInfo.model_validate(r.json())

    async def conversation_info(self, cid: str) -> ConversationInfo:
        r = await self._request("GET", f"/v1/conversations/{_seg(cid)}")
        return ConversationInfo.model_validate(r.json())

    async def delete_conversation(self, cid: str) -> ConversationDeleted:
        r = await self._request("DELETE", f"/v1/conversations/{_seg(cid)}")
        return ConversationDeleted.model_validate(r.json())

    async def list_uploads(self, cid: str) -> UploadList:
        r = await self._request("GET", f"/v1/conversations/{_seg(cid)}/uploads")
        return UploadList.model_validate(r.json())

    async def delete_upload(self, cid: str, name: str) -> None:
        await self._request("DELETE", f"/v1/conversations/{_seg(cid)}/uploads/{_seg(name)}")

    async def upload(
        self, body: AsyncIterator[bytes], content_type: str, params: dict[str, str]
    ) -> UploadResult:
        r = await self._request(
            "POST",
            "/v1/uploads",
            content=body,
            params=params,
            headers={"Content-Type": content_type},
        )
        return UploadResult.model_validate(r.json())

    async def execute(self, cid: str, request: ExecuteRequest) -> ExecutionResult:
        return ExecutionResult.model_validate_json(await self.execute_raw(cid, request))

    async def execute_raw(self, cid: str, request: ExecuteRequest) -> bytes:
        """The runtime's ExecutionResult JSON as is (relayed without re-encoding)."""
        r = await self._request(
            "POST",
            f"/v1/conversations/{_seg(cid)}/execute",
            json=request.model_dump(),
            timeout=self._exec_timeout(request),
        )
        return r.content

    async def execute_stream(self, cid: str, request: ExecuteRequest) -> AsyncIterator[dict]:
        """Events of a streamed execution: stdout/stderr/result, then done (or error)."""
        req = self.http.build_request(
            "POST",
            f"{self.base}/v1/conversations/{_seg(cid)}/execute",
            params={"stream": "true"},
            json=request.model_dump(),
            headers=self.headers,
            timeout=self._exec_timeout(request),
        )
        try:
            response = await self.http.send(req, stream=True)
        except httpx.TransportError as e:
            raise Unavailable(f"sandbox runtime is not reachable: {e.__class__.__name__}") from e
        try:
            if response.status_code >= 400:
                await response.aread()
                _raise_for(response)
            async for line in response.aiter_lines():
                if line:
                    yield json.loads(line)
        finally:
            await response.aclose()

    @staticmethod
    def _exec_timeout(request: ExecuteRequest) -> httpx.Timeout:
        # The runtime answers within the execution's own timeout (+ slot wait and start-up).
        return httpx.Timeout(connect=5.0, read=2 * request.timeout + 60, write=60, pool=30)

    async def restart_kernel(self, cid: str) -> KernelRestarted:
        r = await self._request("POST", f"/v1/conversations/{_seg(cid)}/kernel/restart")
        return KernelRestarted.model_validate(r.json())

    async def open_download(self, cid: str, name: str) -> httpx.Response:
        """Start a download; the caller streams ``aiter_raw()`` and must ``aclose()`` it."""
        return await self._open_stream(f"/v1/conversations/{_seg(cid)}/uploads/{_seg(name)}")

    async def open_output(self, cid: str, parts: list[str]) -> httpx.Response:
        """Start the download of ``outputs/{parts...}`` (same contract as open_download)."""
        rel = "/".join(_seg(p) for p in parts)
        return await self._open_stream(f"/v1/conversations/{_seg(cid)}/outputs/{rel}")

    async def list_outputs(self, cid: str) -> OutputList:
        r = await self._request("GET", f"/v1/conversations/{_seg(cid)}/outputs")
        return OutputList.model_validate(r.json())

    async def _open_stream(self, path: str) -> httpx.Response:
        request = self.http.build_request("GET", f"{self.base}{path}", headers=self.headers)
        try:
            response = await self.http.send(request, stream=True)
        except httpx.TransportError as e:
            raise Unavailable(f"sandbox runtime is not reachable: {e.__class__.__name__}") from e
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            _raise_for(response)
        return response


def _seg(value: str) -> str:
    """Percent-encode one path segment (names may hold '%', '?', '#', spaces, Unicode).

    Dots are encoded too: URL normalisation (httpx's included) would otherwise collapse a
    segment '.' or '..' and address the parent resource — a file named '..' would become
    its conversation.
    """
    return quote(value, safe="").replace(".", "%2E")
