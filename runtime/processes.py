"""Processes that outlive a request (E2B's background commands), with stdin and signals.

Contract:
- ``start(cid, code, timeout=…)`` runs ``bash -c CODE`` exactly as a bash execution runs
  (``Executor.bash_call``: the spawner, confinement, rlimits, limits, cgroup, scratch
  environment), with a stdin pipe, and returns its ``Proc`` (``pid``: the code's pid).
  It does not take an execution slot (it lives on), but at most ``max_per_conversation``
  run (or are starting) at once per conversation (``TooManyProcesses``, 429); so too
  when the process ceiling is full (the code's processes hold it: fork fails). Past
  ``timeout`` seconds (``None``: ``max_lifetime``) its whole tree is killed.
- Output is kept in a buffer of at most ``buffer_bytes`` (the oldest events are dropped,
  ``Proc.dropped`` counts their bytes); ``events(proc)`` replays the buffer and then
  follows new events until the end, which is ``{"type": "end", "exit_code": …}``; with
  ``idle`` it sends ``{"type": "keepalive"}`` whenever nothing came for that long (a
  quiet process's follower can then tell a silent process from a dead connection).
- ``write(proc, data)`` reaches the process's stdin (and nothing else: stdin closed
  meanwhile ends it with ``ProcessNotFound``); ``close_stdin``; ``signal(proc,
  SIGTERM)`` signals the process — the one started, never a later holder of its pid
  (``pids.send_signal``) — and SIGKILL kills its whole tree.
- A process ends with its conversation (``stop_conversation`` kills every process of a
  conversation through the spawner) and with the runtime (the spawner's ``aclose``); an
  ended process is listed (not running) for ``linger`` seconds, then forgotten.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal as signals
import time
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from sandbox_workspace.contract.errors import ApiError, BadRequest, NotFoundError

from .pids import send_signal
from .pipes import CodePipes
from .schemas import MAX_CODE_BYTES
from .spawner import Call, SpawnFailed

_READ_CHUNK = 64 * 1024
_SIGNALS = {"SIGTERM": signals.SIGTERM, "SIGKILL": signals.SIGKILL, "SIGINT": signals.SIGINT}


_MAX_INPUT = 1 << 20
_INPUT_WAIT = 10.0
_MAX_EVENTS = 4096  # per process buffer: followers copy it, so its length is bounded too
KEEPALIVE = {"type": "keepalive"}


class ProcessStart(BaseModel):
    code: str = Field(max_length=MAX_CODE_BYTES)
    timeout: float | None = Field(None, gt=0)
    stdin: bool = False


class ProcessInput(BaseModel):
    data: str = Field("", max_length=_MAX_INPUT * 4 // 3 + 4, description="base64")
    close: bool = False

    def decoded(self) -> bytes:
        try:
            return base64.b64decode(self.data, validate=True)
        except ValueError as e:
            raise BadRequest(f"data is not base64: {e}") from e


class ProcessSignal(BaseModel):
    signal: str = Field(max_length=16)


class CannotStart(ApiError):
    status, code = 503, "spawn_failed"


class TooManyProcesses(ApiError):
    status, code = 429, "too_many_processes"


class ProcessNotFound(NotFoundError):
    code = "process_not_found"


@dataclass
class Proc:
    cid: str
    pid: int
    code: str
    call: Call
    pipes: CodePipes
    buffer: deque = field(default_factory=deque)
    size: int = 0
    dropped: int = 0
    exit_code: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0  # events ever appended (a follower's position survives dropping)

    def info(self) -> dict:
        return {"pid": self.pid, "code": self.code, "running": self.exit_code is None}


class Processes:
    def __init__(
        self,
        executor,  # runtime.executor.Executor (no import: it owns us)
        *,
        max_per_conversation: int,
        buffer_bytes: int,
        max_lifetime: float,
        linger: float = 60.0,
    ) -> None:
        self.executor = executor
        self.max_per_conversation = max_per_conversation
        self.buffer_bytes = buffer_bytes
        self.max_lifetime = max_lifetime
        self.linger = linger
        self._procs: dict[tuple[str, int], Proc] = {}
        self._starting: dict[str, int] = {}  # cid → starts waiting for the spawner
        self._tasks: set[asyncio.Task] = set()

    def live(self, cid: str) -> list[Proc]:
        return [p for (c, _), p in self._procs.items() if c == cid and p.exit_code is None]

    def listing(self, cid: str) -> list[dict]:
        return [p.info() for (c, _), p in self._procs.items() if c == cid]

    def get(self, cid: str, pid: int) -> Proc:
        proc = self._procs.get((cid, pid))
        if proc is None:
            raise ProcessNotFound(f"no process {pid} in this sandbox")
        return proc

    async def start(
        self, cid: str, code: str, *, timeout: float | None, stdin: bool = True
    ) -> Proc:
        # Those still starting count too: concurrent starts all pass a check of the
        # running ones alone while the spawner answers.
        if len(self.live(cid)) + self._starting.get(cid, 0) >= self.max_per_conversation:
            raise TooManyProcesses(
                f"at most {self.max_per_conversation} processes may run at once in a "
                "sandbox; kill one (commands.kill) or wait for one to end"
            )
        pipes = CodePipes(stdin=stdin)
        self._starting[cid] = self._starting.get(cid, 0) + 1
        try:
            call = await self.executor.bash_call(cid, code, pipes)
        except SpawnFailed as e:
            pipes.close()
            if e.at_ceiling:  # code's own doing (a fork bomb): the client may act on it
                raise TooManyProcesses(
                    f"the command could not start: {e}: the sandbox's code holds every "
                    "process it may have; kill its processes (commands.kill) or wait "
                    "for them to end"
                ) from e
            raise CannotStart(f"the command could not start: {e}") from e
        except BaseException:
            pipes.close()
            raise
        finally:
            if self._starting[cid] == 1:
                del self._starting[cid]
            else:
                self._starting[cid] -= 1
        proc = Proc(cid=cid, pid=call.pid, code=code, call=call, pipes=pipes)
        self._procs[(cid, proc.pid)] = proc
        lifetime = min(timeout or self.max_lifetime, self.max_lifetime)
        self._spawn(self._run(proc, lifetime))
        return proc

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _append(self, proc: Proc, event: dict) -> None:
        proc.buffer.append((proc.seq, event))
        proc.seq += 1
        proc.size += len(event.get("data", b""))
        while len(proc.buffer) > 1 and (
            proc.size > self.buffer_bytes or len(proc.buffer) > _MAX_EVENTS
        ):
            _, old = proc.buffer.popleft()
            proc.size -= len(old.get("data", b""))
            proc.dropped += len(old.get("data", b""))
        proc.changed.set()
        proc.changed = asyncio.Event()

    async def _pump(self, proc: Proc, name: str, fd: int) -> None:
        reader = await proc.pipes.reader(fd)
        while chunk := await reader.read(_READ_CHUNK):
            self._append(proc, {"type": name, "data": chunk})

    async def _run(self, proc: Proc, lifetime: float) -> None:
        pumps = [
            asyncio.create_task(self._pump(proc, "stdout", proc.pipes.stdout)),
            asyncio.create_task(self._pump(proc, "stderr", proc.pipes.stderr)),
        ]
        spawner = self.executor.spawner
        try:
            async with asyncio.timeout(lifetime):
                code = await asyncio.shield(proc.call.exited)
        except TimeoutError:
            spawner.kill(proc.call)
            code = await asyncio.shield(proc.call.exited)
        finally:
            # The tree is gone (or being killed): the pipes reach EOF; bound a slow drain.
            await asyncio.wait(pumps, timeout=2.0)
            for task in pumps:
                task.cancel()
            proc.pipes.close()
        proc.exit_code = code
        self._append(proc, {"type": "end", "exit_code": code, "limit": proc.call.limit})
        # Ended ones are listed for a while, at most as many as may run (their buffers
        # are memory: a flood of short commands must not pile them up).
        ended = [p for p in self._procs.values() if p.cid == proc.cid and p.exit_code is not None]
        for old in ended[: max(0, len(ended) - self.max_per_conversation)]:
            self._procs.pop((old.cid, old.pid), None)
        await asyncio.sleep(self.linger)
        if self._procs.get((proc.cid, proc.pid)) is proc:  # the pid may be another's now
            del self._procs[(proc.cid, proc.pid)]

    async def events(self, proc: Proc, idle: float | None = None):
        """The buffered events, then new ones as they come, up to the end; with ``idle``,
        a ``keepalive`` event after each ``idle`` seconds without one."""
        position = 0
        while True:
            waiter = proc.changed
            for seq, event in list(proc.buffer):  # at most _MAX_EVENTS
                if seq >= position:
                    position = seq + 1
                    yield event
                    if event["type"] == "end":
                        return
            try:
                async with asyncio.timeout(idle):
                    await waiter.wait()
            except TimeoutError:
                yield KEEPALIVE

    async def write(self, proc: Proc, data: bytes) -> None:
        fd = proc.pipes.stdin_writer
        if proc.exit_code is not None or fd is None:
            raise ProcessNotFound(f"process {proc.pid} has ended or closed its stdin")
        # Non-blocking writes with a bounded wait: a process that never reads fills the
        # pipe, and a blocked write must not hold one of the runtime's threads. Through a
        # copy of the fd: stdin closed while we wait (CloseStdin, the process's end) frees
        # ``fd``'s number for the runtime's next open file, which the rest of the data
        # must never reach; a closed stdin stops the write.
        own = os.dup(fd)
        os.set_blocking(own, False)
        view = memoryview(data)
        deadline = time.monotonic() + _INPUT_WAIT
        try:
            while view:
                if proc.exit_code is not None or proc.pipes.stdin_writer != fd:
                    raise OSError("its stdin was closed meanwhile")
                try:
                    view = view[os.write(own, view[:65536]) :]
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("its stdin is full (it does not read)") from None
                    await asyncio.sleep(0.02)
        except (OSError, TimeoutError) as e:
            raise ProcessNotFound(f"process {proc.pid} does not take input: {e}") from e
        finally:
            os.close(own)

    def close_stdin(self, proc: Proc) -> None:
        proc.pipes.close_stdin()

    def signal(self, proc: Proc, name: str) -> None:
        number = _SIGNALS.get(name)
        if number is None:
            raise BadRequest(f"signal {name} is not supported (SIGTERM, SIGKILL, SIGINT)")
        if proc.exit_code is not None:
            raise ProcessNotFound(f"process {proc.pid} has ended")
        if number == signals.SIGKILL:
            self.executor.spawner.kill(proc.call)  # the whole tree, daemons included
            return
        # The process, not its pid number: between its end (its reaper frees the pid at
        # once) and ``exit_code`` (after the tree's cleanup and the pipes' drain, seconds)
        # the pid may be a new process's — another command of this sandbox, even.
        with contextlib.suppress(PermissionError):
            if not send_signal(proc.pid, proc.call.start, number):
                raise ProcessNotFound(f"process {proc.pid} has ended")

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._procs = {}
