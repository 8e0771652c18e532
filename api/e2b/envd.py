"""E2B's data plane (envd and the code interpreter) at ``E2B_SANDBOX_URL=…/e2b/envd``.

The SDK sends every data-plane request to that one URL with ``E2b-Sandbox-Id`` (which
sandbox), ``E2b-Sandbox-Port`` (49983 envd, 49999 the code interpreter) and
``X-Access-Token`` (the create answer's ``envdAccessToken``, which names the caller:
``ids.AccessTokens``). Paths are mapped by ``paths``; all work runs through
``conversation.Sandbox`` (the API's execution path, confined as ``/execute`` is).

Served: ``GET /health``, ``GET/POST /files`` (multipart and octet-stream),
``filesystem.Filesystem/{ListDir,Stat,MakeDir,Move,Remove}`` (Connect JSON, unary) and
its watchers (``watchers``: CreateWatcher/GetWatcherEvents/RemoveWatcher, WatchDir),
``process.Process`` (``processes``: Start, Connect, List, SendSignal, SendInput,
CloseStdin), and
``POST /execute`` (NDJSON) over the conversation's stateful Python interpreter.
Everything else answers Connect ``unimplemented`` / HTTP 501 with what is missing.
"""

from __future__ import annotations

import ast
import base64
import json
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sandbox_workspace.contract.errors import ApiError, BadGateway, BadRequest, TooLarge
from sandbox_workspace.runtime.schemas import MAX_CODE_BYTES, ExecuteRequest

from ..deps import Services, ServicesDep
from ..sse import with_keepalive
from . import connect, processes, watchers
from .admission import HeldStream, caps
from .control import NotSupported, tokens
from .conversation import Sandbox, count_execution, fs_code, write_batches
from .paths import to_e2b, to_relative

router = APIRouter(prefix="/e2b/envd", tags=["e2b"], include_in_schema=False)
KEEPALIVE_SECONDS = 15.0
# Base64 (4/3) plus the file program itself must fit in one execution's code.
MAX_WRITE_BYTES = (MAX_CODE_BYTES - 8 * 1024) * 3 // 4
# What one program's code may take of it: the home prefix (``in_home``) comes on top.
WRITE_BATCH_BYTES = MAX_CODE_BYTES - 1024


async def _sandbox(request: Request, services: Services) -> Sandbox:
    caller, sandbox_id = tokens(services).verify(
        request.headers.get("x-access-token"), request.headers.get("e2b-sandbox-id")
    )
    return await Sandbox.open(services, caller, sandbox_id)


def _entry(info: dict) -> dict[str, Any]:
    """The runtime's file info as envd's ``EntryInfo`` (proto JSON)."""
    entry = {
        "name": info["name"],
        "type": "FILE_TYPE_DIRECTORY" if info["dir"] else "FILE_TYPE_FILE",
        "path": to_e2b(info["rel"]),
        "size": str(info["size"]),
        "mode": info["mode"],
        "permissions": info["perm"],
        "owner": "user",
        "group": "user",
        "modifiedTime": info["mtime"],
    }
    if info.get("link"):
        entry["symlinkTarget"] = info["link"]
    return entry


def _file_error(e: ApiError) -> JSONResponse:
    return JSONResponse({"code": e.status, "message": e.message}, status_code=e.status)


@router.get("/health")
async def health() -> Response:
    return Response(status_code=204)


@router.get("/files")
async def read_file(request: Request, services: ServicesDep, path: str = "") -> Response:
    try:
        sandbox = await _sandbox(request, services)
        data = await sandbox.fs("read", to_relative(path))
        return Response(base64.b64decode(data), media_type="application/octet-stream")
    except ApiError as e:
        return _file_error(e)


@router.post("/files")
async def write_files(request: Request, services: ServicesDep, path: str = "") -> Response:
    """Octet-stream: the body is the file at ``path``; multipart: each ``file`` part is
    written to ``path`` or, without it, to its file name."""
    try:
        sandbox = await _sandbox(request, services)
        written = []
        if request.headers.get("content-type", "").startswith("multipart/"):
            form = await request.form()
            for _, part in form.multi_items():
                if isinstance(part, str):
                    continue
                target = path or part.filename or ""
                written.append((to_relative(target), await part.read()))
        else:
            if request.headers.get("content-encoding", "identity") != "identity":
                raise BadRequest("compressed uploads are not supported", code="not_supported")
            written.append((to_relative(path), await request.body()))
        for rel, data in written:
            if not rel:
                raise BadRequest("give the file's path", code="invalid_path")
            if len(data) > MAX_WRITE_BYTES:  # the file travels base64-encoded inside code
                raise TooLarge(f"files over {MAX_WRITE_BYTES} bytes are not supported yet")
        encoded = [(rel, base64.b64encode(data).decode()) for rel, data in written]
        # As few programs as the code's size allows (one per file took ~80 ms each).
        batches = [[{"path": rel, "data": data} for rel, data in batch]
                   for batch in write_batches(encoded, WRITE_BATCH_BYTES)]  # fmt: skip
        for files in batches:  # before any is written: a lone file past the budget
            code = fs_code({"op": "write_many", "path": "", "files": files})
            if len(code.encode()) > WRITE_BATCH_BYTES:
                # Its path's quoting on top of its base64: a 4 KB path of quotes is ~20 KB.
                raise TooLarge(
                    f"file {to_e2b(files[0]['path'])[:200]!r}: its data and its path "
                    f"exceed the {MAX_CODE_BYTES} bytes a file write may take: "
                    "a shorter path or a smaller file; files this large are not supported yet"
                )
        answer = []
        for files in batches:
            infos = await sandbox.fs("write_many", "", files=files)
            if not (isinstance(infos, list) and len(infos) == len(files)
                    and all(isinstance(i, dict) and isinstance(i.get("name"), str)
                            for i in infos)):  # fmt: skip
                raise BadGateway("file operation failed: the file program's answer is malformed")
            for file, info in zip(files, infos, strict=True):
                answer.append({"name": info["name"], "type": "file", "path": to_e2b(file["path"])})
        return JSONResponse(answer)
    except ApiError as e:
        return _file_error(e)


# -- filesystem.Filesystem (Connect JSON, unary) ---------------------------------------


async def _fs_call(method: str, sandbox: Sandbox, body: dict) -> dict:
    rel = to_relative(body.get("path"))
    if method == "Stat":
        return {"entry": _entry(await sandbox.fs("stat", rel))}
    if method == "ListDir":
        depth = max(1, connect.whole(body, "depth", 1, 0, 2**32 - 1))
        return {"entries": [_entry(i) for i in await sandbox.fs("list", rel, depth=depth)]}
    if method == "MakeDir":
        return {"entry": _entry(await sandbox.fs("mkdir", rel))}
    if method == "Move":
        source = to_relative(body.get("source"))
        info = await sandbox.fs("move", source, dest=to_relative(body.get("destination")))
        return {"entry": _entry(info)}
    if method == "Remove":
        await sandbox.fs("remove", rel)
        return {}
    raise NotImplementedError(method)


def _connect_error(code: str, message: str, status: int | None = None) -> JSONResponse:
    return JSONResponse(
        {"code": code, "message": message},
        status_code=status or connect.HTTP_STATUS.get(code, 500),
    )


def _json_media(request: Request, streams: bool = False) -> bool:
    """Whether the body is in a JSON codec of Connect (none named: taken as JSON)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media in ("", "application/json") or (streams and media == connect.STREAM_MEDIA_TYPE)


@router.post("/filesystem.Filesystem/{method}")
async def filesystem(method: str, request: Request, services: ServicesDep) -> Response:
    if method == "WatchDir":
        return await _watch_dir(request, services)
    if method in watchers.UNARY:
        return await _unary(request, services, partial(watchers.unary, method))
    if method not in ("Stat", "ListDir", "MakeDir", "Move", "Remove"):
        return _connect_error("unimplemented", f"filesystem.Filesystem/{method} is not supported")
    return await _unary(request, services, partial(_fs_call, method))


async def _unary(request: Request, services, call) -> Response:
    """One unary Connect-JSON call on the request's sandbox: ``call(sandbox, body)``'s
    answer, or the Connect error that says what went wrong."""
    if not _json_media(request):  # Connect's answer to a codec it does not speak: 415
        return _connect_error("unimplemented", connect.JSON_ONLY, 415)
    try:
        sandbox = await _sandbox(request, services)
        return JSONResponse(await call(sandbox, connect.message_of(await request.body())))
    except ApiError as e:
        return _connect_error(connect.code_for_status(e.status), e.message)
    except (ValueError, TypeError) as e:
        return _connect_error("invalid_argument", f"malformed request: {e}")


# -- process.Process (Connect JSON) -----------------------------------------------------


@router.post("/process.Process/{method}")
async def process(method: str, request: Request, services: ServicesDep) -> Response:
    if method in processes.UNARY:
        return await _unary(request, services, partial(processes.unary, method))
    if method not in processes.STREAMS:
        return _connect_error("unimplemented", f"process.Process/{method} is not supported")
    try:
        message = await _stream_message(request)
        sandbox = await _sandbox(request, services)
        if method == "Start":
            timeout = connect.timeout_seconds(request.headers.get("connect-timeout-ms"))
            events = processes.start_events(sandbox, message, timeout)
        else:
            events = sandbox.client.process_events(sandbox.cid, processes.pid_of(message))
        # Last: nothing above holds anything (``events`` starts when iterated).
        release = caps(services).streams.take(sandbox.caller)
    except ApiError as e:
        return _stream_error(connect.code_for_status(e.status), e.message)
    except (ValueError, IndexError, TypeError) as e:
        return _stream_error("invalid_argument", f"malformed request: {e}")
    stream = with_keepalive(
        processes.envd_stream(sandbox, events),
        KEEPALIVE_SECONDS,
        connect.envelope({"event": {"keepalive": {}}}),
    )
    return HeldStream(stream, release, media_type=connect.STREAM_MEDIA_TYPE)


async def _stream_message(request: Request) -> dict:
    """The one message of a Connect server-stream request (enveloped, or plain JSON)."""
    if not _json_media(request, streams=True):
        raise connect.Unimplemented(connect.JSON_ONLY)
    if request.headers.get("content-type", "").startswith(connect.STREAM_MEDIA_TYPE):
        encoding = request.headers.get("connect-content-encoding")
        return connect.request_message(await request.body(), encoding)
    return connect.message_of(await request.body())


async def _watch_dir(request: Request, services: ServicesDep) -> Response:
    try:
        message = await _stream_message(request)
        sandbox = await _sandbox(request, services)
    except ApiError as e:
        return _stream_error(connect.code_for_status(e.status), e.message)
    except (ValueError, IndexError, TypeError) as e:
        return _stream_error("invalid_argument", f"malformed request: {e}")
    keepalive = connect.envelope({"keepalive": {}})
    stream = with_keepalive(watchers.watch_stream(sandbox, message), KEEPALIVE_SECONDS, keepalive)
    # Its watcher's slots are the stream's own (``watch_stream``); the send deadline
    # still ends it for a client that stopped reading.
    return HeldStream(stream, lambda: None, media_type=connect.STREAM_MEDIA_TYPE)


def _stream_error(code: str, message: str) -> Response:
    return Response(connect.end_stream(code, message), media_type=connect.STREAM_MEDIA_TYPE)


# -- the code interpreter (port 49999) ---------------------------------------------------

_MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/svg+xml": "svg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def result_line(data: dict[str, Any]) -> dict[str, Any]:
    """A display bundle (MIME type → content) as the code interpreter's result line."""
    line: dict[str, Any] = {"type": "result", "is_main_result": False}
    for mime, value in data.items():
        line[_MIME.get(mime, mime)] = value
    return line


def ends_in_expression(code: str) -> bool:
    """Whether the cell's last statement is an expression the kernel displays."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return bool(body) and isinstance(body[-1], ast.Expr)


def mark_main(lines: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    """E2B's ``is_main_result``: the value of the cell's last expression. Our kernel emits
    it as the last result before the figures it collects at the end of a cell (each a
    bundle whose text is ``<Figure …>``), so that one is marked, when the cell ends in an
    expression at all."""
    if not ends_in_expression(code):
        return lines
    for line in reversed(lines):
        if not str(line.get("text", "")).startswith("<Figure"):
            line["is_main_result"] = True
            break
    return lines


async def _execution_lines(sandbox: Sandbox, request: ExecuteRequest) -> AsyncIterator[dict]:
    # Results wait for the end of the cell (``mark_main`` needs them all); output streams.
    results: list[dict[str, Any]] = []
    try:
        async for event in sandbox.stream(request):
            kind = event.get("type")
            stamp = time.time_ns() // 1000
            if kind in ("stdout", "stderr"):
                yield {"type": kind, "text": event["text"], "timestamp": stamp}
            elif kind == "result":
                results.append(result_line(event["data"]))
            elif kind == "done":
                for line in mark_main(results, request.code):
                    yield line
                error = event["result"].get("error")
                if error:
                    yield {
                        "type": "error",
                        "name": error["name"],
                        "value": error["value"],
                        "traceback": error.get("traceback", ""),
                    }
            elif kind == "error":
                error = event["error"]
                yield {
                    "type": "error",
                    "name": error["code"],
                    "value": error["message"],
                    "traceback": "",
                }
    except ApiError as e:
        yield {"type": "error", "name": e.code, "value": e.message, "traceback": ""}
    yield {"type": "number_of_executions", "execution_count": count_execution(sandbox.key)}
    yield {"type": "end_of_execution"}


@router.post("/execute")
async def execute(request: Request, services: ServicesDep) -> Response:
    try:
        sandbox = await _sandbox(request, services)
        body = connect.message_of(await request.body())
        language = (connect.field(body, "language", str) or "python").lower()
        if body.get("context_id") or language not in ("python", "bash"):
            raise NotSupported("contexts and languages other than python/bash are not supported")
        if body.get("env_vars"):
            raise NotSupported("env_vars on run_code are not supported")
        code = connect.field(body, "code", str) or ""
        execute = ExecuteRequest(language=language, code=code, timeout=300)
        release = caps(services).streams.take(sandbox.caller)  # E2B's 429 shape
    except ApiError as e:
        return _file_error(e)
    except ValueError as e:
        return _file_error(BadRequest(f"malformed request: {e}"))

    async def lines() -> AsyncIterator[bytes]:
        async for line in _execution_lines(sandbox, execute):
            yield json.dumps(line).encode() + b"\n"

    return HeldStream(lines(), release, media_type="application/x-ndjson")


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
async def unsupported(rest: str, request: Request) -> Response:
    if request.method != "POST" and rest.startswith(("process.Process/", "filesystem.Filesystem/")):
        return JSONResponse(
            {
                "code": "unimplemented",
                "message": f"{request.method} /{rest}: Connect RPCs take POST",
            },
            status_code=405,
            headers={"Allow": "POST"},
        )
    return _file_error(NotSupported(f"/{rest} is not supported by Sandbox Workspace's envd"))
