"""One conversation's persistent Python interpreter, seen from the runtime.

Contract: ``PythonKernel.execute`` runs one cell at a time (a lock serialises callers),
starting the interpreter on first use. Output reaches the ``OutputCollector`` as it is
produced; the call returns only once the interpreter said ``done`` *and* the per-cell
sentinel arrived on both stdout and stderr, so no output is lost or attributed to the
wrong cell. The interpreter is started through the spawner (confined, tracked with every
process it starts). A cell over its timeout kills that whole process tree (state is
lost; the next call starts a fresh one). An interpreter started while the conversation
was over its quota can write no file (``runtime/reaper.py``; a write says
``conversation_quota_exceeded``); the first cell once the conversation is back under it
starts a fresh one, which can (its state is lost). An interpreter that dies mid-cell is reported
as ``KernelDied``, never as an HTTP error. ``execute`` says whether earlier state is gone
(``kernel_restarted``) once, on the first answer that can say it: the call whose timeout
or limit ended the interpreter, or — when it ended between calls (it died, or it was
reaped idle: ``state_lost``) — the next call. A conversation's first call has no earlier
state to lose: False.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .limits import Limits, disk_usage, frozen_outcome, limit_error
from .output import OutputCollector, ResultCaps
from .pipes import CodePipes
from .schemas import ExecutionError
from .spawner import Call, Spawner

_READ_CHUNK = 64 * 1024
_START_TIMEOUT = 30.0
_DIRECT_WRITE_MAX = 32 * 1024


@dataclass
class _Cell:
    collector: OutputCollector
    sentinel: bytes
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    streams_done: dict[str, asyncio.Event] = field(
        default_factory=lambda: {"stdout": asyncio.Event(), "stderr": asyncio.Event()}
    )


class KernelDied(Exception):
    """The interpreter process ended while a cell was running."""


class PythonKernel:
    def __init__(
        self,
        cid: str,
        cwd: str,
        env: dict[str, str],
        spawner: Spawner,
        *,
        read_write: list[str],
        guard: Callable[[], None] | None = None,
        limits: Limits | None = None,
        event_line_limit: int = ResultCaps().line_limit,
        state_lost: bool = False,
    ) -> None:
        self.cid = cid
        self.event_line_limit = event_line_limit
        # An interpreter of this conversation ended and no answer has said so yet.
        self._loss_unreported = state_lost
        self.limits = limits
        self.cwd = cwd
        self.env = env
        self.spawner = spawner
        self.read_write = read_write
        self.guard = guard
        self.call: Call | None = None
        self.last_used = time.monotonic()
        self._lock = asyncio.Lock()
        self._cell: _Cell | None = None
        self._cmd_w: int | None = None
        self._pipes: CodePipes | None = None
        self._readers: list[asyncio.Task] = []
        self._ready: asyncio.Future | None = None

    @property
    def alive(self) -> bool:
        return self.call is not None and not self.call.exited.done()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        pipes = self._pipes = CodePipes(to_child=1, from_child=1)
        # The command and event pipes are the code process's fds 3 and 4.
        env = {**self.env, "SBW_KERNEL_CMD_FD": "3", "SBW_KERNEL_EVT_FD": "4"}
        # -P: ``-m`` put the cwd (the conversation's directory) first on ``sys.path``
        # before kernel_main's own imports — a ``json.py`` there killed every start;
        # kernel_main adds the cwd itself once it has what it needs.
        argv = [sys.executable, "-u", "-P", "-m", "sandbox_workspace.runtime.kernel_main"]
        try:
            self.call = await self.spawner.spawn(
                self.cid, argv, env=env, cwd=self.cwd, read_write=self.read_write,
                fds=pipes.child_fds, guard=self.guard, limits=self.limits,
            )  # fmt: skip
        except BaseException:
            pipes.close()
            self._pipes = None
            raise
        finally:
            pipes.close_child_ends()
        self._cmd_w = pipes.writers[0]
        self._ready = loop.create_future()
        self._readers = [
            asyncio.create_task(
                self._read_events(await pipes.reader(pipes.readers[0], self.event_line_limit))
            ),
            asyncio.create_task(self._read_stream("stdout", await pipes.reader(pipes.stdout))),
            asyncio.create_task(self._read_stream("stderr", await pipes.reader(pipes.stderr))),
        ]
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), _START_TIMEOUT)
        except (TimeoutError, KernelDied):
            await self.kill()
            raise

    async def execute(
        self, code: str, timeout: float, collector: OutputCollector
    ) -> tuple[ExecutionError | None, bool]:
        """Run one cell; returns (error or None, whether earlier calls' state is gone)."""
        async with self._lock:
            # ``call`` still set but exited: the interpreter died between calls.
            restarted = self._loss_unreported or (self.call is not None and not self.alive)
            self._loss_unreported = False
            if self.alive and await self._back_under_quota():
                await self.kill()  # a frozen interpreter can never write again
                restarted = True
            if not self.alive:
                try:
                    await self.start()
                except (KernelDied, TimeoutError):
                    collector.finish()
                    error = ExecutionError(
                        name="KernelDied", value="the interpreter exited while it was starting"
                    )
                    return error, restarted
            cell = _Cell(
                collector=collector, sentinel=f"\x00\x1esbw-{uuid.uuid4().hex}\x1e\x00".encode()
            )
            self._cell = cell
            cell_call = self.call
            command = (
                json.dumps(
                    {"id": uuid.uuid4().hex, "code": code, "sentinel": cell.sentinel.decode()}
                )
                + "\n"
            )
            try:
                assert self._cmd_w is not None and self.call is not None
                self.spawner.mark_execution(self.call)  # CPU and growth count from here
                payload = command.encode()
                if len(payload) <= _DIRECT_WRITE_MAX:  # fits the idle pipe: cannot block
                    _write_all(self._cmd_w, payload)
                else:
                    await asyncio.to_thread(_write_all, self._cmd_w, payload)
                async with asyncio.timeout(timeout):
                    error = await cell.done
                    await cell.streams_done["stdout"].wait()
                    await cell.streams_done["stderr"].wait()
            except TimeoutError:
                await self.kill()
                restarted = True
                error = {
                    "name": "TimeoutError",
                    "value": f"execution exceeded {timeout:g}s; "
                    "the interpreter was restarted and its state is lost",
                }
            except (KernelDied, BrokenPipeError):
                call = self.call
                code_ = await self._exit_code()
                await self.kill()
                restarted = True
                if call is not None and call.limit:  # the reaper killed it past a limit
                    collector.finish()
                    return limit_error(call.limit, self.limits, state_lost=True), restarted
                error = {
                    "name": "KernelDied",
                    "value": f"the interpreter exited (code {code_}); its state is lost",
                }
            finally:
                self._cell = None
                self.last_used = time.monotonic()
            collector.finish()
            outcome = ExecutionError(**error) if error else None
            frozen = cell_call.frozen if cell_call is not None else None
            exit_code = 0 if outcome is None else 1  # as the executor reports a cell's
            return frozen_outcome(outcome, exit_code, self.limits, frozen), restarted

    async def _back_under_quota(self) -> bool:
        """Whether this interpreter is frozen (it started over the conversation's quota:
        RLIMIT_FSIZE 0, which nothing unprivileged can raise) while the conversation is
        under its quota now (code deleted files): then it is started afresh, able to
        write, and its state is lost. A walk only for a frozen interpreter; one that was
        not is killed by its reaper's first walk that finds the quota passed."""
        call = self.call
        if call is None or call.frozen is None or self.limits is None:
            return False
        used = await asyncio.to_thread(disk_usage, self.read_write)
        return used <= self.limits.conversation_size

    async def _exit_code(self) -> int | None:
        call = self.call
        if call is None:
            return None
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(call.exited), 1.0)
        return None

    async def kill(self) -> None:
        """Kill the interpreter and everything it started; returns once they are gone."""
        call, self.call = self.call, None
        pipes, self._pipes = self._pipes, None
        self._cmd_w = None
        if call is not None:
            self.spawner.kill(call)
            await asyncio.shield(call.exited)
        for task in self._readers:
            task.cancel()
        self._readers = []
        if pipes is not None:
            pipes.close()

    async def _read_events(self, reader: asyncio.StreamReader) -> None:
        try:
            while (line := await _read_line(reader)) != b"":
                if line is None:  # a result past every cap: dropped unread
                    if self._cell is not None:
                        self._cell.collector.truncated = True
                    continue
                message = json.loads(line)
                kind = message.get("type")
                if kind == "ready" and self._ready is not None and not self._ready.done():
                    self._ready.set_result(None)
                elif kind == "result" and self._cell is not None:
                    self._cell.collector.result(message["data"])
                elif kind == "done" and self._cell is not None and not self._cell.done.done():
                    self._cell.done.set_result(message.get("error"))
        finally:
            died = KernelDied()
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(died)
            if self._cell is not None and not self._cell.done.done():
                self._cell.done.set_exception(died)

    async def _read_stream(self, name: str, reader: asyncio.StreamReader) -> None:
        pending = b""
        try:
            while chunk := await reader.read(_READ_CHUNK):
                cell = self._cell
                if cell is None or cell.streams_done[name].is_set():
                    pending = b""  # output between cells (background threads): dropped
                    continue
                data = pending + chunk
                index = data.find(cell.sentinel)
                if index >= 0:
                    cell.collector.feed(name, data[:index])
                    cell.streams_done[name].set()
                    pending = b""
                    continue
                # Hold back a possible sentinel prefix split across chunks.
                keep = _partial_suffix(data, cell.sentinel)
                cell.collector.feed(name, data[: len(data) - keep])
                pending = data[len(data) - keep :]
        finally:
            cell = self._cell
            if cell is not None:
                cell.streams_done[name].set()


async def _read_line(reader: asyncio.StreamReader) -> bytes | None:
    """The next line; None when it is longer than the reader's limit (then it is
    consumed in pieces of at most the limit, never held whole); b"" at the end."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as e:
        return e.partial
    except asyncio.LimitOverrunError as e:
        consumed = e.consumed
    while True:
        try:
            await reader.readexactly(consumed)  # dropped
            await reader.readuntil(b"\n")  # the rest of the line, when within the limit
            return None
        except asyncio.IncompleteReadError:
            return b""
        except asyncio.LimitOverrunError as e:
            consumed = e.consumed


def _partial_suffix(data: bytes, sentinel: bytes) -> int:
    """Length of the longest suffix of ``data`` that is a proper prefix of ``sentinel``."""
    for size in range(min(len(sentinel) - 1, len(data)), 0, -1):
        if sentinel.startswith(data[-size:]):
            return size
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
