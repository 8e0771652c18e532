"""A minimal OpenAI-compatible streaming model for benchmarks (run as its own process).

Every completion streams ``TOKENS`` content chunks, each carrying the server's
``time.monotonic_ns()`` at the moment it is written (CLOCK_MONOTONIC is shared by all
processes on the machine), ``INTERVAL`` seconds apart, then ``finish_reason`` and
``[DONE]``. Receivers compute per-event latency from those stamps.

    python -m bench.llm_server PORT_FILE TOKENS INTERVAL
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from sandbox_workspace.server import bind, write_port_file


def app(tokens: int, interval: float) -> Starlette:
    async def completions(request):
        await request.body()

        async def stream():
            for _ in range(tokens):
                chunk = {"choices": [{"index": 0, "delta": {"content": f"{time.monotonic_ns()};"}}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(interval)
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def main() -> None:
    import uvicorn

    port_file, tokens, interval = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    sock = bind("127.0.0.1", 0)
    write_port_file(port_file, sock.getsockname()[1])
    config = uvicorn.Config(app(tokens, interval), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
