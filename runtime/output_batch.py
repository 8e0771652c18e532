"""Many small outputs in one answer: the store's write-back of a conversation that wrote
thousands of small files reads them in a few requests instead of one each (the per-request
cost on both sides, not the bytes, was what made such a write-back slow).

Contract of ``read_outputs``: for each requested path in order, one frame — a JSON line
``{"path", "size"}`` followed by exactly ``size`` bytes, or ``{"path", "error"}`` with no
bytes: ``not_found``, ``invalid_path``, ``too_large`` (over ``per_file``) or
``over_budget`` (the answer already holds ``max_bytes``). Each file is opened through
``open_output`` (the same path rules, no link followed) and read from its descriptor up to
what ``fstat`` said plus one byte, so a file growing meanwhile is ``too_large`` rather
than read without end; the caller fetches those on their own. Memory is one file at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from .output_frames import frame as _frame
from .outputs import open_output
from .workspace import Workspace

MAX_PATHS = 512  # paths one request may name
MAX_BYTES = 16 * 1024 * 1024  # bytes of files one answer may hold at most
PER_FILE = 1024 * 1024  # a larger file is fetched on its own (streamed)


def _read(fd: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``fd``; None when it holds more."""
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, limit + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


def read_outputs(
    ws: Workspace, cid: str, paths: list[str], max_bytes: int, per_file: int = PER_FILE
) -> Iterator[bytes]:
    """The frames of ``paths`` (module docstring); blocking — run it in a thread."""
    budget = min(max_bytes, MAX_BYTES)
    for path in paths:
        try:
            opened = open_output(ws, cid, path)
        except NotFoundError:
            yield _frame({"path": path, "error": "not_found"})
            continue
        except BadRequest:
            yield _frame({"path": path, "error": "invalid_path"})
            continue
        try:
            if opened.size > per_file:
                yield _frame({"path": path, "error": "too_large"})
                continue
            if opened.size > budget:
                yield _frame({"path": path, "error": "over_budget"})
                continue
            data = _read(opened.fd, min(per_file, budget))
        finally:
            os.close(opened.fd)
        if data is None:
            yield _frame({"path": path, "error": "too_large"})
            continue
        budget -= len(data)
        yield _frame({"path": path, "size": len(data)}) + data
