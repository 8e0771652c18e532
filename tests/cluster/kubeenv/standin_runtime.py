"""A stand-in for the sandbox runtime, for debugging the node agent alone.

Same command-line and health/auth contract as ``sandbox-workspace runtime``:
``--host --port --root``, token from SANDBOX_RUNTIME_TOKEN, ``GET /healthz`` open,
``GET /v1/stats`` needs ``Authorization: Bearer <token>``. Select it with
``SANDBOX_TEST_RUNTIME=standin``; the tier's own tests use the real runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    token = os.environ.get("SANDBOX_RUNTIME_TOKEN", "")
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/stats":
                if not token or self.headers.get("Authorization") != f"Bearer {token}":
                    self._send(401, {"error": {"code": "unauthorized", "message": "token"}})
                else:
                    files = sum(1 for p in root.rglob("*") if p.is_file())
                    self._send(200, {"root": str(root), "files": files})
            else:
                self._send(404, {"error": {"code": "not_found", "message": self.path}})

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
