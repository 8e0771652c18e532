"""Zero-copy relay of two connected asyncio streams (Linux ``splice`` through a pipe).

Contract of ``relay_streams(a_reader, a_writer, b_reader, b_writer, idle=None)``:
- Called once nothing more of either stream is inspected (the proxy's CONNECT is answered
  and the ClientHello checked; the relay has connected). Bytes already buffered in a
  reader are delivered first, in order, then the kernel moves the rest socket → pipe →
  socket without Python ever holding it: no per-chunk allocation, copy or ``drain()``.
- Each direction ends at its source's end of stream and then shuts its destination down
  for writing (half-close: the other direction goes on). A failure of either (reset,
  broken pipe) or cancellation (the session ends) stops both. The caller still owns and
  closes the streams.
- ``idle`` seconds with no byte moved either way (a half-closed tunnel included) stop
  both: a tunnel nobody uses does not hold its descriptors, pipes and upstream forever.
  The deadline costs one timer per tunnel, which wakes once per ``idle`` at most.
- Backpressure: a direction holds at most one pipe (``PIPE_BYTES``) beyond the sockets'
  own kernel buffers, and then waits for its destination to become writable: a peer
  that stops reading bounds memory and costs no CPU.
- Without ``os.splice`` (not Linux), for a stream without a plain socket (TLS, a test's
  transport), or when no file descriptor is left for the pipes, it copies in Python.

Standard library only: the in-namespace relay (``relay.py``) imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from collections.abc import Coroutine

PIPE_BYTES = 256 * 1024
_COPY_CHUNK = 256 * 1024
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
# Moves in a row before yielding to the event loop, so one fast tunnel cannot starve
# the other connections served by the same loop.
_BURST = 16


async def relay_streams(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
    idle: float | None = None,
) -> None:
    clock = _Activity(asyncio.get_running_loop())
    ends = _splice_ends(a_writer, b_writer)
    if ends is None:
        await _until_done(
            _copy(a_reader, b_writer, clock), _copy(b_reader, a_writer, clock), clock, idle
        )
        return
    (a_sock, b_sock), (a_to_b, b_to_a) = ends
    try:
        # Take the transports' hands off the sockets: no more reads into the readers,
        # their write buffers empty, so only the pumps touch the sockets from here on.
        a_left = await _take_buffered(a_reader, a_writer)
        b_left = await _take_buffered(b_reader, b_writer)
        b_writer.write(a_left)
        a_writer.write(b_left)
        await asyncio.gather(_flush(a_writer), _flush(b_writer))
        forth = _pump(a_sock, b_sock, *a_to_b, clock)
        await _until_done(forth, _pump(b_sock, a_sock, *b_to_a, clock), clock, idle)
    finally:
        a_sock.close()
        b_sock.close()
        for fd in (*a_to_b, *b_to_a):
            os.close(fd)


def _splice_ends(
    a_writer: asyncio.StreamWriter, b_writer: asyncio.StreamWriter
) -> tuple[tuple[socket.socket, socket.socket], tuple[tuple[int, int], ...]] | None:
    """Own duplicates of both sockets and a pipe (read end, write end) per direction, or
    None: copy instead (see the contract)."""
    if not hasattr(os, "splice"):
        return None
    plain = [w.get_extra_info("socket") for w in (a_writer, b_writer)]
    if None in plain or any(w.get_extra_info("sslcontext") for w in (a_writer, b_writer)):
        return None
    made: list[int] = []
    try:
        for transport_socket in plain:
            made.append(transport_socket.dup().detach())
        pipes = []
        for _ in range(2):
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            made += (read_end, write_end)
            with contextlib.suppress(OSError):
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            pipes.append((read_end, write_end))
    except OSError:
        for fd in made:
            os.close(fd)
        return None
    socks = socket.socket(fileno=made[0]), socket.socket(fileno=made[1])
    for sock in socks:
        sock.setblocking(False)
    return socks, tuple(pipes)


class _Activity:
    """When a byte last moved, in the loop's clock (a direction notes each move)."""

    __slots__ = ("last", "time")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.time = loop.time
        self.last = loop.time()

    def moved(self) -> None:
        self.last = self.time()


async def _idle_deadline(clock: _Activity, idle: float) -> None:
    """Returns once ``idle`` seconds pass with no move: sleeps to the deadline the last
    move sets, so a busy tunnel costs one wakeup per ``idle``, not one per move."""
    while True:
        left = clock.last + idle - clock.time()
        if left <= 0:
            return
        await asyncio.sleep(left)


async def _until_done(
    a_to_b: Coroutine[None, None, None],
    b_to_a: Coroutine[None, None, None],
    clock: _Activity,
    idle: float | None,
) -> None:
    """Run both directions; an end of stream leaves the other running (half-close), a
    failure, cancellation or the idle deadline stops both."""
    tasks = [asyncio.ensure_future(a_to_b), asyncio.ensure_future(b_to_a)]
    deadline = asyncio.ensure_future(_idle_deadline(clock, idle)) if idle else None
    pending = set(tasks) | ({deadline} if deadline else set())
    try:
        while any(task in pending for task in tasks):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if deadline in done or any(not t.cancelled() and t.exception() for t in done):
                break
    finally:
        for task in (*tasks, *([deadline] if deadline else [])):
            task.cancel()
        await asyncio.gather(*tasks, *([deadline] if deadline else []), return_exceptions=True)


async def _take_buffered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Stop the transport reading and return what its reader already holds. The reader
    is ended (``feed_eof``) so that ``read()`` returns its buffer without waiting, and
    nothing here suspends, so no read can land between the pause and the take; the
    source's own end of stream is seen again by the pump, on the socket."""
    writer.transport.pause_reading()
    reader.feed_eof()
    taken = await reader.read()
    # read() resumes a transport that the reader itself had paused (a full buffer).
    writer.transport.pause_reading()
    return taken


async def _flush(writer: asyncio.StreamWriter) -> None:
    """Until the transport's write buffer is empty."""
    writer.transport.set_write_buffer_limits(high=0)
    await writer.drain()


async def _pump(src: socket.socket, dst: socket.socket, rd: int, wr: int, clock: _Activity) -> None:
    loop = asyncio.get_running_loop()
    # What the kernel granted: past the user's pipe quota a pipe may get a page or two.
    capacity = fcntl.fcntl(wr, fcntl.F_GETPIPE_SZ)
    in_pipe, eof, moves = 0, False, 0
    while not eof or in_pipe:
        moved = False
        if not eof and in_pipe < capacity:
            try:
                n = os.splice(src.fileno(), wr, capacity - in_pipe, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                pass
            else:
                eof, in_pipe, moved = n == 0, in_pipe + n, True
        if in_pipe:
            try:
                n = os.splice(rd, dst.fileno(), in_pipe, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                pass
            else:
                in_pipe, moved = in_pipe - n, True
        if moved and (moves := moves + 1) < _BURST:
            continue
        if moves:
            clock.moved()  # once per burst, not a clock read per splice
        moves = 0
        if moved:
            await asyncio.sleep(0)
        elif in_pipe:
            # The pipe holds bytes the destination did not take: wait for it (a full
            # pipe can also refuse more input, so never spin on the source).
            await _ready(loop, dst.fileno(), writable=True)
        else:
            await _ready(loop, src.fileno(), writable=False)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, writable: bool) -> None:
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await waiter
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, clock: _Activity) -> None:
    try:
        while data := await src.read(_COPY_CHUNK):
            clock.moved()
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()
