"""A PEP 503 package index the test owns: hand-written pure wheels served over HTTP on
127.0.0.1 (``http.server`` in a thread). No network, no build tools."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from functools import partial
from pathlib import Path


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A pure wheel whose module says where it came from (``ORIGIN``)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}.py": f"ORIGIN = {str(directory)!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    project = directory / "simple" / name
    project.mkdir(parents=True)
    wheel = project / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return wheel


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_index(directory: Path) -> http.server.ThreadingHTTPServer:
    """Serve ``directory`` on 127.0.0.1 (a free port); the caller shuts it down."""
    handler = partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
