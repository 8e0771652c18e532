"""runtime/processes.py's bounds, without a runtime: the output buffer (bytes and events)
and how many ended processes stay listed."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios

from sandbox_workspace.runtime.processes import _MAX_EVENTS, Proc, Processes


def _queued(fd: int) -> int:
    """Bytes waiting in the pipe whose read end is ``fd``."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def _processes(buffer_bytes: int = 1000) -> Processes:
    return Processes(None, max_per_conversation=2, buffer_bytes=buffer_bytes, max_lifetime=60)


def _proc(pid: int = 1) -> Proc:
    return Proc(cid="c", pid=pid, code="x", call=None, pipes=None)  # type: ignore[arg-type]


def test_the_buffer_keeps_the_newest_bytes_and_a_bounded_number_of_events():
    async def main():
        processes, proc = _processes(), _proc()
        for i in range(30):
            processes._append(proc, {"type": "stdout", "data": bytes([65 + i % 26]) * 100})
        assert proc.size <= 1000 and proc.dropped == 2000  # the oldest 20 chunks
        processes, proc = _processes(buffer_bytes=1 << 20), _proc()
        for _ in range(2 * _MAX_EVENTS):  # tiny writes: the count is bounded too
            processes._append(proc, {"type": "stdout", "data": b"."})
        assert len(proc.buffer) <= _MAX_EVENTS
        processes._append(proc, {"type": "end", "exit_code": 0})
        seen = [e async for e in processes.events(proc)]
        assert seen[-1]["type"] == "end" and len(seen) <= _MAX_EVENTS

    asyncio.run(main())


def test_a_follower_gets_what_comes_after_it_started():
    async def main():
        processes, proc = _processes(), _proc()
        processes._append(proc, {"type": "stdout", "data": b"before"})
        got = []

        async def follow():
            async for event in processes.events(proc):
                got.append(event.get("data"))

        task = asyncio.create_task(follow())
        await asyncio.sleep(0)
        processes._append(proc, {"type": "stdout", "data": b"after"})
        processes._append(proc, {"type": "end", "exit_code": 0})
        await asyncio.wait_for(task, 5)
        assert got == [b"before", b"after", None]

    asyncio.run(main())


def test_input_to_a_process_that_never_reads_gives_up_without_holding_a_thread(monkeypatch):
    import threading

    import pytest

    from sandbox_workspace.runtime import processes as module
    from sandbox_workspace.runtime.pipes import CodePipes
    from sandbox_workspace.runtime.processes import ProcessNotFound

    monkeypatch.setattr(module, "_INPUT_WAIT", 0.3)

    async def main():
        pipes = CodePipes(stdin=True)  # nobody reads the other end: it fills at 64 KiB
        proc = Proc(cid="c", pid=1, code="x", call=None, pipes=pipes)  # type: ignore[arg-type]
        threads = threading.active_count()
        try:
            with pytest.raises(ProcessNotFound, match="stdin is full"):
                await _processes().write(proc, b"x" * (1 << 20))
            assert threading.active_count() == threads
        finally:
            pipes.close()

    asyncio.run(main())


def test_input_cut_short_by_closing_stdin_never_reaches_the_fd_number_reused(tmp_path):
    # A write waiting for room while stdin is closed (CloseStdin, or the process ending)
    # must not go on into whatever file the runtime opens next under the freed number:
    # another conversation's pipe, a client's socket, an upload being written.
    from sandbox_workspace.runtime.pipes import CodePipes
    from sandbox_workspace.runtime.processes import ProcessNotFound

    async def main():
        pipes = CodePipes(stdin=True)  # nobody reads the other end: it fills at 64 KiB
        proc = Proc(cid="c", pid=1, code="x", call=None, pipes=pipes)  # type: ignore[arg-type]
        number = pipes.stdin_writer
        held: list[int] = []
        try:
            writing = asyncio.create_task(_processes().write(proc, b"x" * (1 << 20)))
            await asyncio.sleep(0)  # its first step fills the pipe, then it waits for room
            assert _queued(pipes.child_fds[0]) and not writing.done()
            pipes.close_stdin()
            while not held or held[-1] != number:  # the next opens take the lowest free number
                held.append(os.open(tmp_path / f"f{len(held)}", os.O_WRONLY | os.O_CREAT))
                assert len(held) < 256
            with contextlib.suppress(ProcessNotFound):
                await asyncio.wait_for(writing, 15)
            assert os.fstat(number).st_size == 0
        finally:
            for fd in held:
                os.close(fd)
            pipes.close()

    asyncio.run(main())


def test_a_silent_follower_gets_keepalives_and_then_the_rest():
    async def main():
        processes, proc = _processes(), _proc()
        got, kept_alive = [], asyncio.Event()

        async def follow():
            async for event in processes.events(proc, idle=0.05):
                got.append(event["type"])
                kept_alive.set()

        task = asyncio.create_task(follow())
        await asyncio.wait_for(kept_alive.wait(), 5)
        processes._append(proc, {"type": "end", "exit_code": 0})
        await asyncio.wait_for(task, 5)
        assert got[-1] == "end" and set(got[:-1]) == {"keepalive"}

    asyncio.run(main())


def test_a_signal_reaches_the_process_started_never_a_later_holder_of_its_pid():
    """A pid freed by its process's end (the reaper reaps it at once; ``exit_code`` comes
    seconds later) may be another process's: the signal must name the process by its
    start time too. The sleeper plays the pid's new holder."""
    import subprocess
    from types import SimpleNamespace

    import pytest

    from sandbox_workspace.runtime.pids import start_time
    from sandbox_workspace.runtime.processes import ProcessNotFound

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        started = start_time(sleeper.pid)
        assert started is not None
        processes = _processes()
        gone = Proc(cid="c", pid=sleeper.pid, code="x", call=SimpleNamespace(start=started - 1),
                    pipes=None)  # type: ignore[arg-type]  # fmt: skip
        with pytest.raises(ProcessNotFound, match="has ended"):
            processes.signal(gone, "SIGTERM")
        assert sleeper.poll() is None, "the signal reached the pid's new holder"
        mine = Proc(cid="c", pid=sleeper.pid, code="x", call=SimpleNamespace(start=started),
                    pipes=None)  # type: ignore[arg-type]  # fmt: skip
        processes.signal(mine, "SIGTERM")
        assert sleeper.wait(10) == -15
    finally:
        sleeper.kill()
        sleeper.wait()
