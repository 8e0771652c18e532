"""The one HTTP client of a sandbox runtime (runtime/app.py routes), used by the operator
and the API alike.

Contract:
- Every path segment is encoded by ``segment``: everything but unreserved letters and
  digits is percent-encoded, dots included, so no id or file name can become a dot
  segment ('.', '..') that URL normalisation would collapse into the parent resource,
  nor a '/' that would address another one.
- Bodies stream in both directions: an upload is forwarded chunk by chunk as it arrives,
  a download is relayed as the runtime sends it (``open_download``/``open_output``).
- Every failure is a ``RuntimeClientError`` (an ``ApiError``, so the API renders it as
  is) that says whether to retry: ``RuntimeUnavailable`` (503) — not reachable;
  ``RuntimeBadAnswer`` (502) — an answer that is not the runtime's error contract, or our
  token refused; ``RuntimeRefused`` — the runtime's own ``{"error"}`` answer, relayed
  with its status, code and message (``retryable`` for 409/429/5xx). Each
  ``RuntimeUnavailable`` is told to ``on_unreachable`` first, when given (the API's E2B
  data plane then forgets the session answer that led to that runtime).
- An execution's answer is read up to ``MAX_ANSWER_BYTES`` (a streamed one: per event
  line); a runtime that sends more — its own caps are far below — gets
  ``RuntimeBadAnswer``, and the caller never holds more than that.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from sandbox_workspace.contract.errors import ApiError

from .output_frames import Frame, parse_frames
from .schemas import (
    KEEPALIVE_HEADER,
    ConversationDeleted,
    ConversationIds,
    ConversationInfo,
    ExecuteRequest,
    ExecutionResult,
    Health,
    KernelRestarted,
    Marks,
    MarksReport,
    OutputBatchRequest,
    OutputFile,
    OutputList,
    ProcessesStopped,
    RuntimeStats,
    UploadList,
    UploadResult,
)
from .unix_transport import UNIX_SOCKET, UNRESOLVABLE_BASE

M = TypeVar("M", bound=BaseModel)

# Far above what a runtime's caps let an execution answer (stdout and stderr 1 MiB each,
# results 8 MiB, by default; JSON escaping at most ×6): only a broken or hostile runtime
# sends more, and the API must not hold it.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class RuntimeClientError(ApiError):
    """Base of the runtime client's errors."""


class RuntimeUnavailable(RuntimeClientError):
    """The runtime could not be reached (or timed out); retrying later may work."""

    status, code = 503, "unavailable"


class RuntimeBadAnswer(RuntimeClientError):
    """The runtime answered something outside its contract (or refused our token)."""

    status, code = 502, "bad_gateway"


class RuntimeRefused(RuntimeClientError):
    """The runtime's own error answer, with its status, code and message."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.retry_after = retry_after  # relayed to our caller as Retry-After

    @property
    def retryable(self) -> bool:
        """A conflict of the moment (409), throttling (429) or the runtime's 5xx."""
        return self.status in (409, 429) or self.status >= 500


def segment(value: str) -> str:
    """Percent-encode one path segment (see the module contract).

    Names may hold '%', '?', '#', spaces, Unicode; dots are encoded too, because URL
    normalisation (httpx's included) would otherwise collapse a segment '.' or '..' and
    address the parent resource — a file named '..' would become its conversation.
    """
    return quote(value, safe="").replace(".", "%2E")


def raise_for(response: httpx.Response) -> None:
    """Raise the ``RuntimeClientError`` of an error answer (the body must be read)."""
    if response.status_code < 400:
        return
    if response.status_code == 401:
        # Our token was refused: an infrastructure fault, never the caller's.
        raise RuntimeBadAnswer("sandbox runtime refused the caller's credentials")
    try:
        err = response.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        raise RuntimeBadAnswer(f"sandbox runtime answered {response.status_code}") from None
    retry = response.headers.get("retry-after", "")
    raise RuntimeRefused(
        response.status_code, code, message, int(retry) if retry.isdigit() else None
    )


def _unreachable(e: Exception) -> RuntimeUnavailable:
    return RuntimeUnavailable(f"sandbox runtime is not reachable: {e.__class__.__name__}")


def _too_large() -> RuntimeBadAnswer:
    return RuntimeBadAnswer(
        f"sandbox runtime answered more than {MAX_ANSWER_BYTES} bytes for one execution"
    )


# A background process's stream may be silent for long: no transport read deadline; the
# runtime's keepalives give it one (``_silence_limit``).
_STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60, pool=30)
# How many keepalive intervals without a byte make a process stream dead: the runtime
# hangs, or the connection is gone without a reset (a node lost). Its pooled connection
# is freed then, not held for the process's whole life.
SILENT_KEEPALIVES = 4


def _silence_limit(response: httpx.Response) -> float | None:
    try:
        interval = float(response.headers.get(KEEPALIVE_HEADER, ""))
    except ValueError:
        return None  # a runtime that sends no keepalives: no deadline
    return SILENT_KEEPALIVES * interval if interval > 0 else None


async def _chunks(response: httpx.Response, silence: float | None) -> AsyncIterator[bytes]:
    chunks = response.aiter_bytes()
    while True:
        try:
            async with asyncio.timeout(silence):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RuntimeUnavailable(
                f"sandbox runtime sent nothing for {silence:g} s on a stream it keeps alive"
            ) from None
        yield chunk


async def _ndjson_lines(
    response: httpx.Response, silence: float | None = None
) -> AsyncIterator[dict]:
    """The JSON lines of a streamed answer (each bounded), closing it at the end; past
    ``silence`` seconds without a byte it fails as an unreachable runtime."""
    try:
        pending = bytearray()  # the line being received
        async for chunk in _chunks(response, silence):
            lines = chunk.split(b"\n")
            for line in lines[:-1]:
                pending += line
                if pending.strip():
                    yield json.loads(pending)
                pending.clear()
            pending += lines[-1]
            if len(pending) > MAX_ANSWER_BYTES:
                raise _too_large()
        if pending.strip():
            yield json.loads(pending)
    except httpx.TransportError as e:
        raise _unreachable(e) from e
    finally:
        await response.aclose()


async def _process_events(response: httpx.Response) -> AsyncIterator[dict]:
    """A process stream's events, its keepalives taken out (they only prove it lives)."""
    async for event in _ndjson_lines(response, _silence_limit(response)):
        if event.get("type") != "keepalive":
            yield event


def _parse(model: type[M], response: httpx.Response) -> M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as e:
        raise RuntimeBadAnswer(f"sandbox runtime answered an unexpected {model.__name__}") from e


class RuntimeClient:
    """Calls of one runtime at ``endpoint`` with its bearer ``token``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        endpoint: str,
        token: str,
        unix_socket: str = "",
        *,
        on_unreachable: Callable[[], None] | None = None,
    ) -> None:
        """``unix_socket``: the runtime listens there (``endpoint`` is then ignored: the
        client's transport must be ``UnixSocketRouting``). ``on_unreachable``: called
        before each ``RuntimeUnavailable`` is raised."""
        self.http = http
        self.on_unreachable = on_unreachable
        self.base = (UNRESOLVABLE_BASE if unix_socket else endpoint).rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.extensions = {UNIX_SOCKET: unix_socket} if unix_socket else {}

    async def _request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> httpx.Response:
        try:
            response = await self.http.request(
                method,
                self.base + path,
                headers={**self.headers, **(headers or {})},
                extensions=self.extensions,
                **kw,
            )
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        raise_for(response)
        return response

    def _unreachable(self, e: Exception) -> RuntimeUnavailable:
        self._lost()
        return _unreachable(e)

    def _lost(self) -> None:
        if self.on_unreachable is not None:
            self.on_unreachable()

    async def _told(self, events: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """A streamed answer's events; a runtime lost (or silent) midway is told too."""
        try:
            async for event in events:
                yield event
        except RuntimeUnavailable:
            self._lost()
            raise

    async def _open(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A streamed answer; the caller reads it and must ``aclose()`` it."""
        request = self.http.build_request(
            method, self.base + path, headers=self.headers, extensions=self.extensions, **kw
        )
        try:
            response = await self.http.send(request, stream=True)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        if response.status_code >= 400:
            try:
                await response.aread()
            finally:
                await response.aclose()
            raise_for(response)
        return response

    @staticmethod
    def _conversation(cid: str, *parts: str) -> str:
        return "/".join((f"/v1/conversations/{segment(cid)}", *map(segment, parts)))

    async def _healthz(self) -> httpx.Response | None:
        """``GET /healthz`` (unauthenticated, 2 s); None when the runtime did not answer."""
        try:
            return await self.http.get(
                self.base + "/healthz", timeout=2.0, extensions=self.extensions
            )
        except httpx.TransportError:
            return None

    async def health(self) -> bool:
        response = await self._healthz()
        return response is not None and response.status_code == 200

    async def features(self) -> frozenset[str] | None:
        """The runtime's features (``Health.features``; none from an older release), or
        None when it did not answer."""
        response = await self._healthz()
        if response is None or response.status_code != 200:
            return None
        try:
            return frozenset(Health.model_validate_json(response.content).features)
        except ValidationError:
            return None

    async def stats(self) -> RuntimeStats:
        return _parse(RuntimeStats, await self._request("GET", "/v1/stats"))

    async def list_conversations(self, holding: str | None = None) -> list[str]:
        """Conversation ids with a directory; with ``holding``, those with that upload."""
        params = {"holding": holding} if holding is not None else None
        r = await self._request("GET", "/v1/conversations", params=params)
        return _parse(ConversationIds, r).conversations

    async def ensure_conversation(self, cid: str) -> ConversationInfo:
        return _parse(ConversationInfo, await self._request("PUT", self._conversation(cid)))

    async def conversation_info(self, cid: str) -> ConversationInfo:
        return _parse(ConversationInfo, await self._request("GET", self._conversation(cid)))

    async def delete_conversation(self, cid: str) -> ConversationDeleted:
        r = await self._request("DELETE", self._conversation(cid))
        return _parse(ConversationDeleted, r)

    async def list_uploads(self, cid: str) -> UploadList:
        r = await self._request("GET", self._conversation(cid, "uploads"))
        return _parse(UploadList, r)

    async def delete_upload(self, cid: str, name: str) -> None:
        await self._request("DELETE", self._conversation(cid, "uploads", name))

    async def upload(
        self, body: AsyncIterator[bytes], content_type: str, params: dict[str, str]
    ) -> UploadResult:
        """Forward a multipart body as it arrives (never buffered whole)."""
        r = await self._request(
            "POST",
            "/v1/uploads",
            content=body,
            params=params,
            headers={"Content-Type": content_type},
        )
        return _parse(UploadResult, r)

    async def upload_raw(self, body: AsyncIterator[bytes], params: dict[str, str]) -> UploadResult:
        """Forward a raw upload (the file's bytes and a trailer: ``raw_upload``) as it is
        made; ``params`` carry ``filename`` and what the form said before the file."""
        r = await self._request(
            "POST",
            "/v1/uploads/raw",
            content=body,
            params=params,
            headers={"Content-Type": "application/octet-stream"},
        )
        return _parse(UploadResult, r)

    async def execute(self, cid: str, request: ExecuteRequest) -> ExecutionResult:
        return ExecutionResult.model_validate_json(await self.execute_raw(cid, request))

    async def execute_raw(self, cid: str, request: ExecuteRequest) -> bytes:
        """The runtime's ExecutionResult JSON as is (relayed without re-encoding)."""
        response = await self._open(
            "POST",
            self._conversation(cid, "execute"),
            json=request.model_dump(),
            timeout=self._exec_timeout(request),
        )
        try:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise _too_large()
            return bytes(body)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        finally:
            await response.aclose()

    async def execute_stream(self, cid: str, request: ExecuteRequest) -> AsyncIterator[dict]:
        """Events of a streamed execution: stdout/stderr/result, then done (or error)."""
        response = await self._open(
            "POST",
            self._conversation(cid, "execute"),
            params={"stream": "true"},
            json=request.model_dump(),
            timeout=self._exec_timeout(request),
        )
        async for event in self._told(_ndjson_lines(response)):
            yield event

    @staticmethod
    def _exec_timeout(request: ExecuteRequest) -> httpx.Timeout:
        # The runtime answers within the execution's own timeout (+ slot wait and start-up).
        return httpx.Timeout(connect=5.0, read=2 * request.timeout + 60, write=60, pool=30)

    # -- processes that outlive a request (runtime/processes.py) --------------------------

    async def start_process(
        self, cid: str, code: str, *, timeout: float | None, stdin: bool
    ) -> AsyncIterator[dict]:
        """``start`` (the pid), then ``stdout``/``stderr`` (``data`` base64) and ``end``."""
        body = {"code": code, "timeout": timeout, "stdin": stdin}
        path = self._conversation(cid, "processes")
        response = await self._open("POST", path, json=body, timeout=_STREAM_TIMEOUT)
        async for event in self._told(_process_events(response)):
            yield event

    async def process_events(self, cid: str, pid: int) -> AsyncIterator[dict]:
        path = self._conversation(cid, "processes", str(pid), "events")
        response = await self._open("GET", path, timeout=_STREAM_TIMEOUT)
        async for event in self._told(_process_events(response)):
            yield event

    async def list_processes(self, cid: str) -> list[dict]:
        r = await self._request("GET", self._conversation(cid, "processes"))
        return r.json()["processes"]

    async def process_input(self, cid: str, pid: int, data: bytes, close: bool = False) -> None:
        body = {"data": base64.b64encode(data).decode(), "close": close}
        path = self._conversation(cid, "processes", str(pid), "input")
        await self._request("POST", path, json=body)

    async def process_signal(self, cid: str, pid: int, signal: str) -> None:
        path = self._conversation(cid, "processes", str(pid), "signal")
        await self._request("POST", path, json={"signal": signal})

    async def restart_kernel(self, cid: str) -> KernelRestarted:
        r = await self._request("POST", self._conversation(cid, "kernel", "restart"))
        return _parse(KernelRestarted, r)

    async def stop_processes(self, cid: str) -> ProcessesStopped:
        r = await self._request("POST", self._conversation(cid, "processes", "stop"))
        return _parse(ProcessesStopped, r)

    async def open_download(self, cid: str, name: str) -> httpx.Response:
        """Start a download; the caller streams ``aiter_raw()`` and must ``aclose()`` it."""
        return await self._open("GET", self._conversation(cid, "uploads", name))

    async def open_output(self, cid: str, parts: list[str]) -> httpx.Response:
        """Start the download of ``outputs/{parts...}`` (same contract as open_download)."""
        return await self._open("GET", self._conversation(cid, "outputs", *parts))

    async def read_outputs(self, cid: str, paths: list[str], max_bytes: int) -> list[Frame]:
        """Many small outputs in one request (``output_batch``: a frame per path)."""
        body = OutputBatchRequest(paths=paths, max_bytes=max_bytes).model_dump()
        r = await self._request("POST", self._conversation(cid, "outputs-batch"), json=body)
        return parse_frames(r.content)

    async def put_output(
        self, cid: str, parts: list[str], body: AsyncIterator[bytes]
    ) -> OutputFile:
        """Write ``body`` at ``outputs/{parts...}`` (streamed, never buffered whole)."""
        r = await self._request("PUT", self._conversation(cid, "outputs", *parts), content=body)
        return _parse(OutputFile, r)

    async def delete_output(self, cid: str, parts: list[str]) -> None:
        await self._request("DELETE", self._conversation(cid, "outputs", *parts))

    async def list_outputs(self, cid: str, limit: int | None = None) -> OutputList:
        """The conversation's outputs; ``limit``: how many at most (the runtime's default
        window without it; a runtime older than the parameter ignores it)."""
        params = {"limit": limit} if limit is not None else None
        r = await self._request("GET", self._conversation(cid, "outputs"), params=params)
        return _parse(OutputList, r)

    async def record_marks(self, cid: str, report: MarksReport) -> Marks:
        """Tell the runtime what a run modified and presented (kept with the files)."""
        r = await self._request(
            "POST", self._conversation(cid, "marks"), json=report.model_dump(mode="json")
        )
        return _parse(Marks, r)

    # -- copies (``runtime.copies``: snapshots and forks in local store mode) ----------

    async def snapshot(self, cid: str, snapshot_id: str, name: str) -> dict:
        body = {"snapshot_id": snapshot_id, "name": name}
        return (await self._request("POST", self._conversation(cid, "snapshots"), json=body)).json()

    async def snapshots(self, cid: str) -> list[dict]:
        r = await self._request("GET", self._conversation(cid, "snapshots"))
        return r.json()["snapshots"]

    async def get_snapshot(self, cid: str, snapshot_id: str) -> dict:
        return (
            await self._request("GET", self._conversation(cid, "snapshots", snapshot_id))
        ).json()

    async def delete_snapshot(self, cid: str, snapshot_id: str) -> None:
        await self._request("DELETE", self._conversation(cid, "snapshots", snapshot_id))

    async def restore_snapshot(self, cid: str, snapshot_id: str) -> dict:
        path = self._conversation(cid, "snapshots", snapshot_id, "restore")
        return (await self._request("POST", path)).json()

    async def fork(self, cid: str, to: str, snapshot_id: str | None) -> dict:
        body = {"conversation_id": to, "snapshot_id": snapshot_id}
        return (await self._request("POST", self._conversation(cid, "fork"), json=body)).json()

    async def snapshot_bytes(self) -> int:
        return (await self._request("GET", "/v1/snapshots/bytes")).json()["bytes"]
