"""A scripted model on loopback (test support, not product code).

``scripted_llm`` is a real HTTP server (uvicorn in a thread) speaking the Chat
Completions streaming protocol (``/v1/chat/completions``) and Anthropic's Messages
streaming protocol (``/v1/messages``). Each test sets ``scripted_llm.responder``: a
function from the request body to a ``Reply`` — the SSE chunks to stream (tool-call
arguments can be split across chunks, exactly as real models do), an HTTP error, or a
stall. On ``/v1/messages`` the same reply goes out as Messages events
(``scripted_messages.from_chat_chunks``), or ``Reply.events`` exactly when a test gives
them, so one script drives either provider. Requests are recorded so tests can assert
what the model was told.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn
from scripted_messages import from_chat_chunks, sse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from sandbox_workspace.server import QuietServer


@dataclass
class Reply:
    chunks: list[dict | str] = field(default_factory=list)  # dicts → data: JSON; str → raw line
    status: int = 200
    stall_seconds: float = 0.0  # sleep before the first chunk (timeouts)
    pause_between: float = 0.0
    finish: bool = True  # send [DONE] (Messages: message_delta and message_stop)
    events: list[dict | str] | None = None  # Messages events to send instead of chunks


def text_reply(text: str, pieces: int = 3) -> Reply:
    step = max(1, len(text) // pieces)
    parts = [text[i : i + step] for i in range(0, len(text), step)]
    chunks: list[dict | str] = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in parts]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return Reply(chunks)


def tool_reply(name: str, arguments: dict | str, call_id: str = "call_1") -> Reply:
    """A tool call whose id/name come first and whose arguments arrive in three pieces
    (a ``str`` is sent as the model's raw argument text, malformed or not)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    third = max(1, len(args) // 3)
    pieces = [args[:third], args[third : 2 * third], args[2 * third :]]
    chunks: list[dict | str] = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ],
                    },
                }
            ]
        }
    ]
    chunks += [
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}
            ]
        }
        for p in pieces
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return Reply(chunks)


def tool_results(body: dict) -> list[dict]:
    """The tool results the model was sent, as Chat Completions ``tool`` messages — also
    from a Messages request, where they are ``tool_result`` blocks of user turns."""
    results = [m for m in body["messages"] if m["role"] == "tool"]
    for message in body["messages"]:
        if message["role"] == "user" and isinstance(message["content"], list):
            results += [
                {"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
                for b in message["content"]
                if b["type"] == "tool_result"
            ]
    return results


class ScriptedLLM:
    def __init__(self) -> None:
        self.responder: Callable[[dict], Reply] = lambda body: text_reply("hello")
        self.requests: list[dict] = []
        # Indices into ``requests`` of the replies sent in full (a caller's wait for "the
        # model turn has ended" without a sleep).
        self.completed: list[int] = []
        self.url = ""
        self._server: uvicorn.Server | None = None

    async def _completions(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        index = len(self.requests) - 1
        reply = self.responder(body)
        if reply.status != 200:
            return JSONResponse(
                {"error": {"message": "scripted failure"}}, status_code=reply.status
            )

        async def stream():
            if reply.stall_seconds:
                await asyncio.sleep(reply.stall_seconds)
            for chunk in reply.chunks:
                line = chunk if isinstance(chunk, str) else json.dumps(chunk)
                yield f"data: {line}\n\n".encode()
                if reply.pause_between:
                    await asyncio.sleep(reply.pause_between)
            if reply.finish:
                yield b"data: [DONE]\n\n"
            self.completed.append(index)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _messages(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        reply = self.responder(body)
        if reply.status != 200:
            error = {"type": "error", "error": {"type": "api_error", "message": "scripted"}}
            return JSONResponse(error, status_code=reply.status)
        events = reply.events or from_chat_chunks(reply.chunks, reply.finish)

        async def stream():
            if reply.stall_seconds:
                await asyncio.sleep(reply.stall_seconds)
            for event in events:
                yield sse(event) if isinstance(event, dict) else f"data: {event}\n\n".encode()
                if reply.pause_between:
                    await asyncio.sleep(reply.pause_between)

        return StreamingResponse(stream(), media_type="text/event-stream")

    def start(self, host: str = "127.0.0.1") -> ScriptedLLM:
        """Serve on ``host`` (loopback; the node tier passes an address of its namespace)."""
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
            ]
        )
        sock = socket.socket()
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        self._server = QuietServer(  # no 0.1 s tick; stop() wakes it from this thread
            uvicorn.Config(app, log_level="warning", lifespan="off")
        )
        thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "scripted LLM did not start"
            time.sleep(0.01)
        self.url = f"http://{host}:{port}/v1"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
