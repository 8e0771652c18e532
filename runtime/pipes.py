"""Pipes between the runtime and a code process it starts through the spawner.

Contract: ``CodePipes(extra=n)`` makes the stdio pipes (stdin is ``/dev/null``, or a pipe
written through ``stdin_writer`` with ``stdin=True``) plus ``n`` more; ``child_fds`` are
the ends the code process gets (as fds 0, 1, 2, 3…, in order),
``close_child_ends()`` drops our copies once the spawner has them, so end-of-file on
stdout/stderr means every process of the code closed them. ``reader(fd)`` wraps a read end
in an asyncio stream; ``close()`` releases everything still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

_STREAM_LIMIT = 64 * 1024 * 1024


class CodePipes:
    def __init__(self, *, to_child: int = 0, from_child: int = 0, stdin: bool = False) -> None:
        self._owned: list[int] = []
        self._transports: list[asyncio.BaseTransport] = []
        self.stdin_writer: int | None = None  # with ``stdin``: our end of the code's fd 0
        if stdin:
            stdin, self.stdin_writer = self._pipe()
        else:
            stdin = self._own(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        self.stdout, out_w = self._pipe()
        self.stderr, err_w = self._pipe()
        self.child_fds = [stdin, out_w, err_w]
        self.writers = []  # our ends of pipes the child reads
        self.readers = []  # our ends of extra pipes the child writes
        for _ in range(to_child):
            r, w = self._pipe()
            self.child_fds.append(r)
            self.writers.append(w)
        for _ in range(from_child):
            r, w = self._pipe()
            self.child_fds.append(w)
            self.readers.append(r)

    def _own(self, fd: int) -> int:
        self._owned.append(fd)
        return fd

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        return self._own(r), self._own(w)

    def _close(self, fd: int) -> None:
        if fd in self._owned:
            self._owned.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_stdin(self) -> None:
        """Close our end of the code's stdin (it reads end-of-file)."""
        if self.stdin_writer is not None:
            self._close(self.stdin_writer)
            self.stdin_writer = None

    def close_child_ends(self) -> None:
        for fd in self.child_fds:
            self._close(fd)

    def release(self, fd: int) -> int:
        """Hand ``fd`` over to the caller (it closes it)."""
        self._owned.remove(fd)
        return fd

    async def reader(self, fd: int, limit: int = _STREAM_LIMIT) -> asyncio.StreamReader:
        """``limit``: the longest line ``readline``/``readuntil`` will hold."""
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=limit)
        self._owned.remove(fd)  # the transport owns it now
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(fd, "rb", buffering=0)
        )
        self._transports.append(transport)
        return stream

    def close(self) -> None:
        for fd in list(self._owned):
            self._close(fd)
        for transport in self._transports:
            transport.close()
        self._transports = []
